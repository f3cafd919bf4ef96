"""Plots decode as PNGs of the promised size; without matplotlib they say plots are off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from _png import png_size
from perfgate.report import plots

pytest.importorskip("matplotlib")


EXPECTED = (int(plots.FIGSIZE_IN[0] * plots.DPI), int(plots.FIGSIZE_IN[1] * plots.DPI))


def test_every_plot_renders_a_png_of_the_expected_size() -> None:
    rendered = [
        plots.step_times_png(
            {0: [30.0, 12.0, 10.1, 10.0, 10.2], 1: [31.0, 12.5, 11.0, 10.9, 11.1]}, warmup_steps=2
        ),
        plots.ab_distribution_png([10.0, 10.2, 9.9], [5.1, 5.0, 5.2], 1.98, (1.93, 2.03)),
        plots.ab_distribution_png([10.0], [5.0], None, None),
        plots.breakdown_png(
            [
                {
                    "rank": 0,
                    "span_us": 100.0,
                    "compute_us": 60.0,
                    "communication_us": 10.0,
                    "memory_us": 5.0,
                    "idle_us": 25.0,
                },
                {
                    "rank": 1,
                    "span_us": 100.0,
                    "compute_us": 50.0,
                    "communication_us": 20.0,
                    "memory_us": 5.0,
                    "idle_us": 25.0,
                },
            ]
        ),
        plots.tensor_errors_png({"layer.weight": ([1e-8, 1e-6, 1e-4, 1e-2], [10, 3, 1])}),
        plots.coverage_png([[1.0, 1.0], [1.0, 0.5]], epochs=[0, 1], ranks=[0, 1]),
    ]
    for png in rendered:
        assert png_size(png) == EXPECTED


def test_without_matplotlib_plots_are_reported_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not plots.plots_available()
    with pytest.raises(plots.PlotsUnavailable, match="plots are off"):
        plots.tensor_errors_png({"w": ([1e-8, 1e-6], [1])})
    # The key plots of the trace tools and audit_samples need no matplotlib.
    assert png_size(plots.coverage_png([[1.0]], epochs=[0], ranks=[0])) == EXPECTED


@pytest.mark.anyio
async def test_a_plotting_tool_still_answers_and_says_plots_are_off(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    from mcp import Client

    from perfgate.server import build_server
    from perfgate.serving.runtime import ServerConfig

    np.save(workspace / "ref.npy", np.zeros(64, np.float32))
    np.save(workspace / "cand.npy", np.full(64, 1e-3, np.float32))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(
            "compare_tensors", {"reference": "ref.npy", "candidate": "cand.npy", "atol": 1e-6, "rtol": 0}
        )
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["status"] == "mismatch"
    texts = [getattr(c, "text", "") for c in result.content]
    assert any("plots are off" in t for t in texts)
    assert all(getattr(c, "type", None) != "image" for c in result.content)
