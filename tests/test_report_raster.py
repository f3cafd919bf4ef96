"""The trace tools' key plot: drawn without matplotlib, of the promised size, bars to scale."""

from __future__ import annotations

import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from mcp import Client

from _png import png_size
from perfgate.report import raster
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"


def decode(png: bytes) -> np.ndarray:
    """RGB pixels of an unfiltered 8-bit RGB PNG (what `raster.Canvas.png` writes)."""
    width, height = png_size(png)
    pos, idat = 8, b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind = png[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, width * 3 + 1)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, 3)


def column_of(pixels: np.ndarray, color: str, x: int) -> int:
    """Pixels of ``color`` in column ``x``."""
    return int((pixels[:, x] == raster.rgb(color)).all(axis=1).sum())


def test_the_breakdown_draws_each_part_to_scale_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    ranks = [
        {"rank": 0, "span_us": 100.0, "compute_us": 60.0, "non_compute_us": 10.0, "idle_us": 30.0,
         "categories": [{"category": "gemm", "share": 0.75}, {"category": "nccl", "share": 0.25}]},
        {"rank": 1, "span_us": 100.0, "compute_us": 20.0, "non_compute_us": 40.0, "idle_us": 40.0},
    ]  # fmt: skip
    png = raster.breakdown_png(ranks)
    assert png_size(png) == (raster.WIDTH, raster.HEIGHT)
    pixels = decode(png)
    # The left panel spans 0..1.05 over 278 px; each rank's bar sits in the middle of its slot.
    per_unit = (330 - 52) / 1.05
    bar0, bar1 = 70 + (380 - 70) // 4, 70 + 3 * (380 - 70) // 4
    for x, compute, comm, idle in ((bar0, 0.6, 0.1, 0.3), (bar1, 0.2, 0.4, 0.4)):
        assert column_of(pixels, raster._COMPUTE, x) == pytest.approx(compute * per_unit, abs=2)
        assert column_of(pixels, raster._COMM, x) == pytest.approx(comm * per_unit, abs=2)
        assert column_of(pixels, raster._IDLE, x) == pytest.approx(idle * per_unit, abs=2)
    # Categories: gemm (first tab10 colour after sorting) holds three quarters of rank 0's bar.
    gemm, nccl = raster._TAB10[0], raster._TAB10[1]
    x = 475 + (785 - 475) // 4
    assert column_of(pixels, gemm, x) == pytest.approx(0.75 * per_unit, abs=2)
    assert column_of(pixels, nccl, x) == pytest.approx(0.25 * per_unit, abs=2)
    # Text is drawn: the title row holds dark pixels.
    assert (pixels[8:26].min(axis=2) < 100).any()


def test_host_ops_bars_are_ordered_and_odd_names_draw() -> None:
    png = raster.top_ops_png([("aten::mm\u00e9" * 20, 12_000.0), ("aten::add", 3_000.0)], "t")
    pixels = decode(png)
    rows = [int((pixels[y, 330:781] == raster.rgb(raster._COMPUTE)).all(axis=1).sum()) for y in (130, 310)]
    assert rows[0] > 3 * rows[1] * 0.9 and rows[1] > 0


@pytest.mark.anyio
async def test_a_trace_answer_carries_its_image_without_matplotlib(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(PLANTED / "slow_loader_rank0.json.gz", workspace)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    async with Client(build_server(ServerConfig.create(workspace, read_only=True))) as client:
        result = await client.call_tool("analyze_trace", {"trace_paths": ["slow_loader_rank0.json.gz"]})
    assert not result.is_error, result.content
    images = [c for c in result.content if getattr(c, "type", None) == "image"]
    assert len(images) == 1
    assert not any("plots are off" in getattr(c, "text", "") for c in result.content)


def test_the_coverage_heat_map_colours_each_cell_by_its_value_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = raster.coverage_png([[1.0, 0.5], [0.0, 1.0]], epochs=[0, 1], ranks=[0, 3])
    assert png_size(png) == (raster.WIDTH, raster.HEIGHT)
    pixels = decode(png)
    # Panel x 90..690, y 40..400: sample a corner of each cell, away from its value text.
    full, half, none = (raster.rgb(c) for c in ("#fde725", "#21918c", "#440154"))
    for (x, y), colour in (((100, 50), full), ((400, 50), half), ((100, 230), none), ((400, 230), full)):
        assert tuple(pixels[y, x]) == colour
    # A value above 1 (over-coverage) tops the scale; 1.0 is then no longer the brightest colour.
    over = decode(raster.coverage_png([[2.0, 1.0]], epochs=[0], ranks=[0, 1]))
    assert tuple(over[50, 100]) == full and tuple(over[50, 400]) == half


def test_a_large_coverage_grid_draws_every_cell_and_thins_its_labels() -> None:
    import numpy as np

    values = np.linspace(0.0, 1.0, 50 * 512).reshape(50, 512)
    pixels = decode(raster.coverage_png(values.tolist(), epochs=list(range(50)), ranks=list(range(512))))
    # The first and last cells keep their colours; no value text is written into cells that small.
    assert tuple(pixels[41, 91]) == raster.rgb("#440154")
    assert tuple(pixels[399, 689]) == raster.rgb("#fde725")
