"""Plots and the HTML report from real evidence: the demo's CPU runs, rendered and loaded in a browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from _png import png_size
from perfgate.cli import main as cli_main
from perfgate.evidence import Ledger
from perfgate.report.plots import DPI, FIGSIZE_IN

pytest.importorskip("torch")
pytest.importorskip("matplotlib")
# the first test builds the demo workspace: about 90 s quiet, 6-8 min on a loaded 2-core machine
pytestmark = pytest.mark.timeout(1800)

SIZE = (int(FIGSIZE_IN[0] * DPI), int(FIGSIZE_IN[1] * DPI))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from perfgate.demo import run_demo

    return run_demo(tmp_path_factory.mktemp("report") / "ws", say=lambda _: None)


def test_the_demo_ends_kept_or_honestly_inconclusive(demo: Any) -> None:
    # the verdict depends on the machine's load, so either ending is right, and each is consistent
    assert demo.decision in {"keep", "inconclusive"}
    assert demo.accepted == (demo.decision == "keep")
    assert (demo.verdict == "improved") == (demo.decision == "keep")
    assert ("KEEP" if demo.accepted else "INCONCLUSIVE") in demo.decisions_md


@pytest.fixture(scope="module")
def report_dir(demo: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html")
    assert cli_main(["report", "all", "--out", str(out), "--workspace", str(demo.workspace)]) == 0
    return out


@pytest.mark.slow
def test_every_tool_that_plots_stored_a_png_of_the_right_size(demo: Any) -> None:
    ledger = Ledger(demo.workspace)
    expected = {
        "baseline": "step_times.png",
        "candidate": "step_times.png",
        "profile": "breakdown.png",
        "comparison": "ab_step_times.png",
        "audit": "coverage.png",
    }
    for role, name in expected.items():
        record = ledger.get(demo.evidence[role])
        assert record is not None
        artifact = next(a for a in record.artifacts if a.name == name)
        assert png_size((demo.workspace / artifact.path).read_bytes()) == SIZE


@pytest.mark.slow
@pytest.mark.anyio
async def test_mismatching_tensors_get_an_error_histogram_returned_as_image(workspace: Path) -> None:
    from perfgate.harness import dump_tensors
    from perfgate.server import build_server
    from perfgate.serving.runtime import ServerConfig

    rng = np.random.default_rng(0)
    ref = {"w": rng.standard_normal(4096).astype(np.float32), "b": np.zeros(16, np.float32)}
    cand = {"w": ref["w"] + rng.normal(0, 1e-3, 4096).astype(np.float32), "b": ref["b"]}
    dump_tensors(workspace / "ref.safetensors", ref)
    dump_tensors(workspace / "cand.safetensors", cand)
    args = {"reference": "ref.safetensors", "candidate": "cand.safetensors", "atol": 1e-5, "rtol": 0.0}
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("compare_tensors", args)
    assert result.structured_content is not None
    assert result.structured_content["status"] == "mismatch"
    images = [c for c in result.content if getattr(c, "type", None) == "image"]
    assert len(images) == 1
    record = Ledger(workspace).get(result.structured_content["evidence_id"])
    assert record is not None
    png = next(a for a in record.artifacts if a.name == "error_histograms.png")
    assert png_size((workspace / png.path).read_bytes()) == SIZE


@pytest.mark.slow
def test_the_report_is_self_contained_and_embeds_every_plot(demo: Any, report_dir: Path) -> None:
    page = (report_dir / f"{demo.experiment_id}.html").read_text()
    index = (report_dir / "index.html").read_text()
    assert demo.experiment_id in index
    for html in (page, index):
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "external reference"
        assert "<script" not in html
        assert "@import" not in html
    plots = re.findall(r'<img class="plot" alt="([^"]+)" src="data:image/png;base64,', page)
    assert sorted(plots) == sorted(
        ["step_times.png", "step_times.png", "breakdown.png", "ab_step_times.png", "coverage.png"]
    )
    for gate in ("environment", "comparison", "correctness", "sample_audit", "ledger_integrity"):
        assert f"<td>{gate}</td>" in page
    # the decision the demo reached (load decides keep or inconclusive), shown as the page's heading
    assert f'<span class="{demo.decision}">{demo.decision.upper()}</span></h1>' in page
    assert "train.py" in page  # the commands section


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_a_headless_browser_renders_every_plot(demo: Any, report_dir: Path) -> None:
    assert CHROMIUM is not None
    page = report_dir / f"{demo.experiment_id}.html"
    # A copy with a probe script: the report itself carries no scripts.
    probe = report_dir / "probe.html"
    probe.write_text(
        page.read_text().replace(
            "</body>",
            "<script>window.addEventListener('load',()=>{const imgs=[...document.images];"
            "document.body.setAttribute('data-rendered',imgs.filter(i=>i.complete&&i.naturalWidth>0).length);"
            "document.body.setAttribute('data-total',imgs.length);"
            "document.body.setAttribute('data-widths',imgs.map(i=>i.naturalWidth).join(','));});</script></body>",
        )
    )
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={report_dir / 'chrome-profile'}",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    total = re.search(r'data-total="(\d+)"', dom)
    rendered = re.search(r'data-rendered="(\d+)"', dom)
    widths = re.search(r'data-widths="([\d,]+)"', dom)
    assert total is not None
    assert rendered is not None
    assert widths is not None
    assert int(total.group(1)) == 5
    assert rendered.group(1) == total.group(1)
    assert {int(w) for w in widths.group(1).split(",")} == {SIZE[0]}

    shot = report_dir / "report.png"
    subprocess.run(
        [CHROMIUM, *flags, "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert png_size(shot.read_bytes()) == (1200, 2400)
