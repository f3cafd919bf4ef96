"""Diagnosis measured, not spanned (issue 47): a nanoGPT-shaped job profiled through the harness.

tests/fixtures/nanogpt_shaped.py has nanoGPT's shape: a top-level training loop (no function), a grad
scaler, AdamW (whose step fetches each parameter's step count with .item()), a get_batch indexing with
tensor elements, loss.item() every step. The profile must say what the syncs cost (their own time, not
the span from the first .item() to the last, which is the whole step) and name each phase by the line
of the loop that runs it (not the line the loop stood at when the profiler started: scaler.step).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.evidence import Ledger
from perfgate.traces import RankProfile, analyze_traces
from perfgate.traces.analyses.intervals import union_length
from perfgate.traces.classify import category_kind, classify_device, host_call_role, is_polling_call

pytest.importorskip("torch")

FIXTURES = Path(__file__).parent / "fixtures"
SCRIPT = FIXTURES / "nanogpt_shaped.py"
# Value fetches that wait for the device: .item() (and the op it calls), bool(t), nonzero.
WAITING = {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero"}


def site_line(name: str) -> int:
    for number, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if re.search(rf"# site: {name}\b", line):
            return number
    raise AssertionError(f"no '# site: {name}' in {SCRIPT}")


def at(name: str) -> str:
    """How a site names the loop's line ``name``: ``<file>:<line> <module>``."""
    return f"nanogpt_shaped.py:{site_line(name)} <module>"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job run by the harness with profiling (stacks and module ranges), as profile_segment runs it."""
    work = tmp_path_factory.mktemp("nanogpt")
    # fmt: off
    command = [
        sys.executable, "-m", "perfgate.harness", "--record-dir", str(work / "records"),
        "--warmup-steps", "1", "--measure-steps", "4", "--profile-dir", str(work / "profile"),
        "--profile-warmup", "1", "--profile-active", "3", "--profile-with-stack", "--profile-with-modules",
        "--", str(SCRIPT), "12",
    ]
    # fmt: on
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=600, check=False)
    path = work / "profile" / "rank0.pt.trace.json"
    assert path.is_file(), done.stderr[-3000:]
    return path


@pytest.fixture(scope="module")
def profile(trace: Path) -> RankProfile:
    return analyze_traces([trace]).ranks[0]


def _events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _union_per_step(events: list[dict[str, Any]], picked: list[dict[str, Any]], steps: set[int]) -> float:
    """Per step of ``steps``: the union of the picked events' intervals inside the ProfilerStep."""
    total, counted = 0.0, 0
    for e in events:
        match = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
        if e.get("ph") != "X" or match is None or int(match[1]) not in steps:
            continue
        lo, hi = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        s = np.array([max(float(x["ts"]), lo) for x in picked])
        t = np.array([min(float(x["ts"]) + float(x["dur"]), hi) for x in picked])
        keep = t > s
        total += union_length(s[keep], t[keep])
        counted += 1
    assert counted == len(steps)
    return total / counted


def _window_steps(p: RankProfile) -> set[int]:
    assert p.steps is not None
    return {s.step for s in p.steps.steps if s.in_window}


def test_sync_cost_is_the_time_in_the_sync_calls_not_the_span_between_them(
    trace: Path, profile: RankProfile
) -> None:
    events = _events(trace)
    items = [e for e in events if e.get("ph") == "X" and e.get("name") in WAITING]
    assert (
        profile.host is not None and profile.host.implicit_syncs_per_step >= 10
    )  # AdamW's, get_batch's, loss's
    expected = _union_per_step(events, items, _window_steps(profile))
    step = profile.host.step_us
    assert profile.host.sync_wait_us_per_step == pytest.approx(expected, rel=1e-6, abs=0.01)
    assert 0 < profile.host.sync_wait_us_per_step < 0.10 * step
    # The first sync (get_batch's) to the last (the log line's loss.item()) spans backward and the update:
    # that span is what the finding used to claim, many times the calls' own time.
    spans = [_first_to_last(items, e) for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert min(spans) > 5 * expected, (spans, expected)
    report = analyze_traces([trace])
    sync = [f for f in report.findings if f.wall == "synchronization"]
    assert all(f.time_at_stake_us <= expected * (1 + 1e-6) and f.share_of_step < 0.10 for f in sync), sync
    assert not report.findings or report.findings[0].wall != "synchronization"


def _first_to_last(items: list[dict[str, Any]], step: dict[str, Any]) -> float:
    lo, hi = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    inside = [e for e in items if lo <= float(e["ts"]) < hi]
    return max(float(e["ts"]) + float(e["dur"]) for e in inside) - min(float(e["ts"]) for e in inside)


def test_each_phase_of_a_top_level_loop_carries_its_own_line(profile: RankProfile) -> None:
    code = profile.code
    assert code is not None and code.stacks
    # Forward runs in the model's modules; the loop line that called the model is the call site.
    assert code.phases["forward"] and all(c.call_site == at("forward") for c in code.phases["forward"])
    assert code.phases["backward"][0].location == at("backward")
    assert code.phases["backward"][0].label == f"<module> ({at('backward').split()[0]})"
    assert code.phases["optimizer"][0].location == at("step")
    # The data (get_batch, no DataLoader) is named by its function and the loop line that calls it.
    batch = [c for sites in code.phases.values() for c in sites if c.location and " get_batch" in c.location]
    assert batch and all(c.call_site == at("data") for c in batch)
    # The syncs: AdamW's .item() under scaler.step (the most), get_batch's tensor indices, loss.item().
    sync = code.phases["sync"]
    assert sync[0].location == at("step")
    for c in sync:
        assert c.location == at("item") or c.location == at("step") or c.call_site == at("data"), c
    # No phase is pinned to the line where the profiler started (inside scaler.step) unless it runs there.
    for phase, sites in code.phases.items():
        for c in sites:
            if c.location == at("step"):
                assert phase in ("optimizer", "sync", "no_grad"), (phase, c)


@pytest.mark.anyio
async def test_the_tool_reports_the_measured_sync_and_the_lines(
    trace: Path, profile: RankProfile, workspace: Path
) -> None:
    from perfgate.serving.runtime import ServerConfig, ToolRuntime
    from perfgate.tools.profile_segment import ProfileSegmentInput, run

    (workspace / "traces").mkdir()
    (workspace / "traces" / "rank0.json").write_bytes(trace.read_bytes())
    runtime = ToolRuntime(
        config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="profile_segment"
    )
    out = await run(
        ProfileSegmentInput.model_validate({"mode": "analyze", "trace_paths": ["traces"]}), runtime
    )
    rank = out.ranks[0]
    assert rank.host is not None and profile.host is not None
    assert rank.host.sync_wait_us_per_step == pytest.approx(profile.host.sync_wait_us_per_step)
    assert all(f.wall != "synchronization" or f.share_of_step < 0.10 for f in out.findings)
    assert rank.code is not None and rank.code.phases["backward"][0].location == at("backward")


def test_without_line_ranges_the_loop_keeps_the_traced_line(tmp_path: Path, trace: Path) -> None:
    """The line ranges are what names the lines: a trace stripped of them falls back to the frame names."""
    data = json.loads(trace.read_text())
    data["traceEvents"] = [
        e for e in data["traceEvents"] if not e.get("name", "").startswith("perfgate.line: ")
    ]
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(data))
    code = analyze_traces([stripped]).ranks[0].code
    assert code is not None
    assert code.phases["backward"][0].location != at("backward")


def test_no_finding_on_a_real_trace_claims_more_than_its_own_intervals(hta_traces: Path) -> None:
    """A GPU trace with .item() syncs (HTA's trace-diff test trace): the synchronization finding is the
    union of the sync calls' own intervals per step, and memory_bound at most the union of its kernels'."""
    path = hta_traces / "trace_diff_test_test.json.gz"
    report = analyze_traces([path])
    p = report.ranks[0]
    events = [e for e in _events(path) if e.get("ph") == "X"]
    steps = _window_steps(p)
    syncs = [
        e
        for e in events
        if e.get("name") in WAITING
        or (
            e.get("cat") in ("cuda_runtime", "cuda_driver", "runtime")
            and host_call_role(e["name"]) != "other"
            and not is_polling_call(e["name"])
        )
    ]
    sync_union = _union_per_step(events, syncs, steps)
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    memory = [
        e
        for e in device
        if (cat := classify_device(e["name"], e["cat"])[0]) in ("elementwise", "reduction")
        or category_kind(cat) == "memory"
    ]
    memory_union = union_length(
        np.array([float(e["ts"]) for e in memory]),
        np.array([float(e["ts"]) + float(e["dur"]) for e in memory]),
    ) / len(steps)
    walls = {f.wall: f for f in report.findings}
    assert "synchronization" in walls and "memory_bound" in walls, list(walls)
    assert walls["synchronization"].time_at_stake_us == pytest.approx(sync_union, rel=1e-6)
    # Kernels of the window's steps (their device time can trail the step): at most the whole trace's.
    assert 0 < walls["memory_bound"].time_at_stake_us <= memory_union
    assert p.host is not None
    for f in report.findings:
        assert f.share_of_step == pytest.approx(f.time_at_stake_us / p.host.step_us)


def test_line_ranges_leave_another_tracer_alone_and_restore_none() -> None:
    from perfgate.harness.line_ranges import LineRanges, loop_frame

    if sys.gettrace() is not None:
        pytest.skip("a tracer (coverage, a debugger) is already active")

    def other(frame: Any, event: str, arg: Any) -> None:
        return None

    lines = LineRanges()
    sys.settrace(other)
    try:
        assert lines.install() is False and sys.gettrace() is other  # a debugger's tracer is kept
    finally:
        sys.settrace(None)
    frame = sys._getframe()  # pyright: ignore[reportPrivateUsage]
    assert loop_frame(frame) is frame  # this test file is user code
    assert lines.install() is True and sys.gettrace() is not None
    lines.remove()
    assert sys.gettrace() is None and frame.f_trace is None and not lines.installed
