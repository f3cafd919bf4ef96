"""Issue 43 item 1 for log timing: the server stamps the log lines it captures, and a log whose step times
disagree with the time that passed between its lines on the server's clock supports no keep.

Scripts run for real (attached and detached): an honest loop that prints each iteration's own time, one that
prints a third of it, one that prints three times it (an inflated baseline makes any candidate look fast),
one that keeps its output in a buffer the server cannot see into, and one that works less only over the steps
it guesses are measured. The check itself is then exercised on stamps built by hand.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.windows.corroborate import corroborate_log
from perfgate.execution.linestamps import OutputStamps
from perfgate.helpers.cappedlines import placed_lines
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
PATTERN = r"step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)"

LOOP = """\
import sys
import time

SCALE = {scale}
if {buffered}:
    sys.stdout = open(1, "w", buffering=1 << 20, closefd=False)  # lines kept back until the end
last = time.perf_counter()
for step in range(60):
    time.sleep({sleep})
    now = time.perf_counter()
    print(f"step {{step}} loss 1.0 step_time_ms {{(now - last) * 1000 * SCALE:.3f}}")
    last = now
print("done")
"""


def loop(scale: float = 1.0, buffered: bool = False, sleep: str = "0.015") -> str:
    return LOOP.format(scale=scale, buffered=buffered, sleep=sleep)


@pytest.fixture
def ws(workspace: Path) -> Path:
    operator_policy("[execution]\n" + any_code_rules([PY, "train.py"]))
    return workspace


async def _run(ws: Path, script: str, **extra: Any) -> dict[str, Any]:
    (ws / "train.py").write_text(script)
    args = {
        "command": [PY, "train.py"],
        "timing": "log",
        "log_pattern": PATTERN,
        "warmup_steps": 5,
        "measure_steps": 30,
        "repeats": 1,
        "samples_per_step": 8,
        "timeout_s": 120,
        **extra,
    }
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool("run_benchmark_window", args)
        assert not result.is_error, result.content
        out = result.structured_content
        assert out is not None
        if extra.get("detach"):
            run_id = out["run_id"]
            await client.call_tool("benchmark_run", {"action": "wait", "run_id": run_id, "wait_s": 120})
            result = await client.call_tool("benchmark_run", {"action": "result", "run_id": run_id})
            assert not result.is_error, result.content
            assert result.structured_content is not None
            out = result.structured_content["result"]
    assert out["state"] == "executed", out
    return out


@pytest.mark.parametrize("detach", [False, True], ids=["attached", "detached"])
async def test_an_honest_log_is_corroborated(ws: Path, detach: bool) -> None:
    out = await _run(ws, loop(), detach=detach)
    (check,) = out["timing_checks"]
    assert check["status"] == "corroborated", check
    assert check["consistency"] == "consistent", check
    assert check["clock_ratio"] == pytest.approx(1.0, abs=0.1)
    assert check["boundaries_observed"] == check["boundaries_reported"] == 60
    assert not any("not corroborated" in w for w in out["warnings"])


@pytest.mark.parametrize(
    ("scale", "said"),
    [(1 / 3, "leave out part of each step"), (3.0, "inflated")],
    ids=["deflated", "inflated"],
)
async def test_printed_times_the_server_did_not_see_pass_are_untrusted(
    ws: Path, scale: float, said: str
) -> None:
    out = await _run(ws, loop(scale=scale))
    (check,) = out["timing_checks"]
    assert check["status"] == "untrusted", check
    assert any(said in r for r in check["reasons"]), check["reasons"]
    assert out["warnings"][0].startswith("timing not corroborated, no keep can rest on this run")


async def test_output_held_back_until_the_end_cannot_be_corroborated(ws: Path) -> None:
    out = await _run(ws, loop(buffered=True))
    (check,) = out["timing_checks"]
    assert check["status"] == "untrusted", check
    assert any("bursts" in r and "flush=True" in r for r in check["reasons"]), check["reasons"]


async def test_a_log_that_works_less_over_the_guessed_window_is_measurement_dependent(ws: Path) -> None:
    # warm-up 5 and a window of 30: the script guesses it and skips most of its work over exactly those steps
    out = await _run(ws, loop(sleep="0.001 if 5 <= step < 35 else 0.015"))
    (check,) = out["timing_checks"]
    assert check["consistency"] == "measurement_dependent", check
    assert out["warnings"][0].startswith("timing not corroborated")


# --- the check itself, on stamps built by hand ---------------------------------------------------------------


def _log(step_ms: list[float], every: int = 1) -> bytes:
    return "".join(
        f"step {s} step_time_ms {step_ms[s]:.3f}\n" for s in range(len(step_ms)) if s % every == 0
    ).encode()


def _stamped(data: bytes, step_ms: list[float], scale: float = 1.0) -> OutputStamps:
    """Stamps of ``data`` arriving one line at a time, line ``s`` at the end of step ``s`` (x ``scale``)."""
    stamps = OutputStamps()
    stamps.started_ns, t, end = 0, 0, 0
    for line in data.splitlines(keepends=True):
        step = int(line.split()[1])
        t = int(sum(step_ms[: step + 1]) * 1e6 * scale) + 3_000_000
        end += len(line)
        stamps.feed(end, line, now_ns=t)
    stamps.ended_ns = t + 1
    return stamps


def _check(data: bytes, stamps: OutputStamps | None, windows: list[tuple[int, int]]) -> Any:
    from perfgate.benchmarking.reading.logparse import compile_pattern, parse_placed_log

    placed = parse_placed_log(placed_lines(io.BufferedReader(io.BytesIO(data))), compile_pattern(PATTERN))
    return corroborate_log(0, placed, windows, stamps)


def test_log_lines_stamped_as_they_were_printed_corroborate_the_log() -> None:
    times = [12.0] * 60
    data = _log(times)
    check = _check(data, _stamped(data, times), [(5, 34)])
    assert (check.status, check.consistency) == ("corroborated", "consistent"), check.reasons
    assert check.clock_ratio == pytest.approx(1.0, abs=1e-3)


def test_a_line_every_few_steps_stands_for_the_steps_since_the_last() -> None:
    times = [12.0] * 60
    data = _log(times, every=5)
    check = _check(data, _stamped(data, times), [(10, 30)])
    assert check.status == "corroborated", check.reasons
    assert check.reported_span_ms == pytest.approx(25 * 12.0)  # from the line of step 5, before the window


def test_a_log_that_reports_half_the_time_that_passed_is_untrusted() -> None:
    times = [12.0] * 60
    data = _log(times)
    check = _check(data, _stamped(data, times, scale=2.0), [(5, 34)])
    assert check.status == "untrusted" and check.clock_ratio == pytest.approx(2.0, abs=0.01)


def test_a_drift_inside_the_bound_is_corroborated() -> None:
    times = [12.0] * 60
    data = _log(times)
    assert _check(data, _stamped(data, times, scale=1.05), [(5, 34)]).status == "corroborated"


def test_without_stamps_a_log_is_unobserved() -> None:
    times = [12.0] * 60
    check = _check(_log(times), None, [(5, 34)])
    assert check.status == "unobserved" and not check.blocks_keep


def test_a_last_line_without_its_end_is_never_read_as_a_step() -> None:
    data = _log([12.0] * 3) + b"step 3 step_time_ms 89"  # cut from 8907.5
    placed = list(placed_lines(io.BufferedReader(io.BytesIO(data))))
    assert [text for text, _ in placed] == [f"step {s} step_time_ms 12.000\n" for s in range(3)]
    assert placed[-1][1] == data.index(b"step 3")
