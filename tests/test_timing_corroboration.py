"""Issue 43 items 1-2: the code under test cannot fake its own measurement.

Candidates that an approved change could carry, each run for real under the harness: one rebinds the
harness's step clock (or ``time.perf_counter_ns`` before the harness reads it), one closes the channel the
boundaries travel on, one skips its per-step work while a window is measured (read from the harness's own
state) and one skips it over the steps it guesses are measured. None may yield corroborated, consistent
timing; an honest run must, with its clock ratio near 1. The keep gate is exercised on records that carry
each verdict.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.reading.records import RankRecord, StepColumns, WindowRecord
from perfgate.benchmarking.windows.corroborate import corroborate_launch
from perfgate.execution.ticks import LaunchTicks
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable

TRAIN = """\
import time

import helper
from perfgate.harness import Window

window = Window()
for step in range(400):
    with window.step(samples=8):
        helper.work(step)
window.close()
"""

HONEST = "import time\n\n\ndef work(step):\n    time.sleep(0.012)\n"

SLOW_CLOCK = """\
import time

import perfgate.harness.window as w

_real = time.perf_counter_ns
_base = _real()
w._now = lambda: _base + (_real() - _base) // 3  # the harness's clock runs at a third of real speed


def work(step):
    time.sleep(0.012)
"""

SLOW_PERF_COUNTER = """\
import time

import perfgate.harness.window as w

_real = time.perf_counter_ns
_base = _real()
time.perf_counter_ns = lambda: _base + (_real() - _base) // 3
w._now = time.perf_counter_ns


def work(step):
    time.sleep(0.012)
"""

MUTED = """\
import time

from perfgate.harness import _state


def work(step):
    win = _state.active_window()
    if win is not None:
        win._ticks.close()  # the server hears nothing more
    time.sleep(0.012)
"""

SKIP_WHILE_MEASURED = """\
import time

from perfgate.harness import _state


def work(step):
    win = _state.active_window()
    if win is not None and win.measuring:
        time.sleep(0.0005)
    else:
        time.sleep(0.012)
"""

SKIP_BY_STEP = """\
import time


def work(step):
    # the warm-up is 4 steps and a window 20: skip exactly the steps the agent guesses are measured
    time.sleep(0.0005 if 4 <= step < 24 else 0.012)
"""


@pytest.fixture
def ws(workspace: Path) -> Path:
    (workspace / "train.py").write_text(TRAIN)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    return workspace


async def _run(ws: Path, helper: str) -> dict[str, Any]:
    (ws / "helper.py").write_text(helper)
    args = {
        "command": [PY, "train.py"],
        "timing": "explicit",
        "warmup_steps": 4,
        "measure_steps": 20,
        "repeats": 1,
        "timeout_s": 120,
        "contract": {
            "invariants": {"workload": "paced", "global_batch": 8},
            "execution": {"microbatch": 8, "accumulation": 1, "world_size": 1},
        },
    }
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    return out


async def test_an_honest_run_is_corroborated_with_its_true_clock(ws: Path) -> None:
    out = await _run(ws, HONEST)
    (check,) = out["timing_checks"]
    assert check["status"] == "corroborated", check
    assert check["consistency"] == "consistent", check
    assert check["clock_ratio"] == pytest.approx(1.0, abs=0.1)
    # every boundary of the run reached the server: warm-up, the window and its guard steps
    assert check["boundaries_observed"] >= 4 + 20 + 3
    assert check["launch_duration_ms"] >= check["server_span_ms"] > 0
    assert not any("not corroborated" in w for w in out["warnings"])


@pytest.mark.parametrize("helper", [SLOW_CLOCK, SLOW_PERF_COUNTER], ids=["harness-clock", "perf-counter"])
async def test_a_bent_clock_is_untrusted(ws: Path, helper: str) -> None:
    out = await _run(ws, helper)
    (check,) = out["timing_checks"]
    assert check["status"] == "untrusted", check
    assert check["clock_ratio"] > 2.0
    assert any("server's clock" in r for r in check["reasons"]), check["reasons"]
    assert out["warnings"][0].startswith("timing not corroborated, no keep can rest on this run")


async def test_a_silenced_channel_is_untrusted(ws: Path) -> None:
    out = await _run(ws, MUTED)
    (check,) = out["timing_checks"]
    assert check["status"] == "untrusted", check
    assert any("reached the server" in r for r in check["reasons"])


@pytest.mark.parametrize("helper", [SKIP_WHILE_MEASURED, SKIP_BY_STEP], ids=["harness-state", "step-number"])
async def test_work_skipped_only_while_measured_is_measurement_dependent(ws: Path, helper: str) -> None:
    out = await _run(ws, helper)
    (check,) = out["timing_checks"]
    assert check["consistency"] == "measurement_dependent", check
    assert check["neighbour_ratio"] > 5
    assert out["warnings"][0].startswith("timing not corroborated")


# --- the check itself, on records and stamps built by hand -------------------------------------------------


def _record(step_ms: list[float], first: int, steps: int) -> RankRecord:
    ends: list[int] = []
    t = 0
    for ms in step_ms:
        t += int(ms * 1e6)
        ends.append(t)
    starts = [0, *ends[:-1]]
    window = WindowRecord(
        index=0,
        first_step=first,
        last_step=first + steps - 1,
        steps=steps,
        start_ns=starts[first],
        end_ns=ends[first + steps - 1],
        elapsed_ns=ends[first + steps - 1] - starts[first],
        start_unix_ns=0,
        end_unix_ns=0,
    )
    n = len(step_ms)
    return RankRecord(
        schema="perfgate.harness.record",
        version=1,
        rank=0,
        world_size=1,
        timing="explicit",
        warmup_steps=first,
        measure_steps=steps,
        windows_requested=1,
        complete=True,
        profiled=False,
        steps=StepColumns(
            count=n,
            warmup=first,
            start_ns=starts,
            end_ns=ends,
            step_time_ns=[e - s for s, e in zip(starts, ends, strict=True)],
            data_wait_ns=[0] * n,
            backward_ns=[0] * n,
            samples=[8] * n,
            tokens=[None] * n,
        ),
        windows=[window],
        origin_unix_ns=0,
    )


def _stamps(record: RankRecord, scale: float = 1.0, offset_ns: int = 5_000_000) -> LaunchTicks:
    times = {0: record.steps.start_ns[0], **{b + 1: e for b, e in enumerate(record.steps.end_ns)}}
    stamps = {b: offset_ns + int(t * scale) for b, t in times.items()}
    return LaunchTicks(
        stamps={0: stamps}, started_ns=0, ended_ns=offset_ns + int(max(times.values()) * scale) + 1
    )


def test_stamps_that_match_the_record_corroborate_it() -> None:
    record = _record([10.0] * 30, 4, 20)
    check = corroborate_launch(0, [record], _stamps(record))
    assert (check.status, check.consistency) == ("corroborated", "consistent")
    assert check.clock_ratio == pytest.approx(1.0)


def test_a_record_three_times_faster_than_the_server_saw_is_untrusted() -> None:
    record = _record([10.0] * 30, 4, 20)
    check = corroborate_launch(0, [record], _stamps(record, scale=3.0))
    assert check.status == "untrusted" and check.blocks_keep
    assert check.clock_ratio == pytest.approx(3.0, rel=0.01)


def test_a_bend_inside_the_bound_on_a_long_window_is_still_caught() -> None:
    """10 % slower on a 2 s span: past the 5 % + 25 ms bound."""
    record = _record([100.0] * 30, 4, 20)
    assert corroborate_launch(0, [record], _stamps(record, scale=1.1)).status == "untrusted"
    assert corroborate_launch(0, [record], _stamps(record, scale=1.02)).status == "corroborated"


def test_a_boundary_sent_twice_is_untrusted() -> None:
    record = _record([10.0] * 30, 4, 20)
    ticks = _stamps(record)
    ticks.duplicates = 1
    check = corroborate_launch(0, [record], ticks)
    assert check.status == "untrusted" and "arrived twice" in check.reasons[0]


def test_windows_faster_than_their_neighbours_are_measurement_dependent() -> None:
    record = _record([10.0] * 4 + [1.0] * 20 + [10.0] * 5, 4, 20)
    check = corroborate_launch(0, [record], _stamps(record))
    assert check.consistency == "measurement_dependent" and check.blocks_keep
    # slower windows (periodic work inside them) are not this check's concern
    slow = _record([10.0] * 4 + [12.0] * 20 + [10.0] * 5, 4, 20)
    assert corroborate_launch(0, [slow], _stamps(slow)).consistency == "consistent"


def test_load_on_some_neighbouring_steps_is_noise_not_measurement_dependence() -> None:
    """A busy host slows some of the steps around the windows (here the warm-up tail, 2 of 4 guard
    steps): their spread widens the margin, so the same windows are consistent."""
    bursty = [10.0] * 4 + [18.0, 16.0, 17.0, 10.0] + [10.0] * 20 + [18.0, 10.0, 19.0, 10.0]
    record = _record(bursty, 8, 20)
    check = corroborate_launch(0, [record], _stamps(record))
    assert check.consistency == "consistent", check.reasons
    # the same neighbours at a steady pace around windows 1.8x faster than them: still caught
    steady = [10.0] * 8 + [5.5] * 20 + [10.0] * 4
    assert corroborate_launch(0, [_record(steady, 8, 20)], None).consistency == "measurement_dependent"


def test_without_stamps_the_launch_is_unobserved_and_does_not_block() -> None:
    record = _record([10.0] * 30, 4, 20)
    check = corroborate_launch(0, [record], None)
    assert check.status == "unobserved" and not check.blocks_keep


def test_stamps_survive_the_detached_supervisors_file() -> None:
    record = _record([10.0] * 30, 4, 20)
    ticks = _stamps(record)
    ticks.duplicates = 2
    back = LaunchTicks.from_json(ticks.to_json())
    assert back == ticks
    assert LaunchTicks.from_json({"stamps": "x"}) is None


# --- the keep gate reads each compared window's checks ------------------------------------------------------


def _check(status: str, consistency: str) -> dict[str, Any]:
    return {"launch": 0, "status": status, "consistency": consistency, "reasons": [f"{status} {consistency}"]}


@pytest.mark.parametrize(
    ("status", "consistency", "kept"),
    [
        ("corroborated", "consistent", True),
        ("unobserved", "unverified", True),  # a Slurm launch: the harness's word, said so in the gate
        ("untrusted", "consistent", False),
        ("corroborated", "measurement_dependent", False),
        (
            "corroborated",
            "noisy",
            True,
        ),  # uneven steps on one side of the windows: noise, not a contradiction
    ],
)
async def test_the_keep_refuses_windows_the_server_contradicts(
    server: Any, workspace: Path, status: str, consistency: str, kept: bool
) -> None:
    from test_record_decision import Evidence, _drop, _honest, _keep, _open, _text

    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        cand = [ev.window(timing_checks=[_check(status, consistency)]) for _ in range(3)]
        comp = ev.comparison(ids["base"], cand)
        correct = ev.tensors(base=ids["base"], cand=cand)
        links = [
            *_drop(_drop(links, "comparison"), "correctness"),
            {"id": comp, "role": "comparison"},
            {"id": correct, "role": "correctness"},
        ]
        result = await _keep(client, exp, links)
    text = _text(result)
    assert result.is_error is (not kept), text
    if not kept:
        assert "trusted_timing" in text and f"{status}, {consistency}" in text
        assert "re-run the candidate with run_benchmark_window" in text
    elif consistency == "noisy":
        assert "3 launch(es) noisy around their windows, not a contradiction" in text, text
