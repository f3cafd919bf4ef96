"""Issue 57 item 4: the timing checks tell load from cheating.

Honest scripts run for real beside two CPU burners (on a 2-core host, more runnable processes than cores):
one saves a checkpoint every 5 steps, one reads its batches through DataLoader workers and ends with its
window, as the demo's candidate does (its warm-up holds the workers' start, nothing after the window can be
compared). Neither may be called measurement_dependent: uneven steps, periodic saves and a warm-up
transient are noise, and a noisy launch names the run that settles it. Work skipped only while measured is
still refused beside the same burners, and the check itself is exercised on step times built by hand.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.windows.corroborate import corroborate_launch
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_timing_corroboration import SKIP_WHILE_MEASURED, TRAIN
from test_timing_corroboration import _record as _record  # pyright: ignore[reportPrivateUsage]
from test_timing_corroboration import _stamps as _stamps  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.anyio

PY = sys.executable

CHECKPOINTS = """\
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 256), torch.randint(0, 10, (16,))
for step in range(60):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % 5 == 4:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")
"""

LOADER = """\
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 25 * 16

    def __getitems__(self, indices):
        time.sleep(0.004 * len(indices))  # decode, I/O-like
        return [(torch.full((64,), float(i)), i % 10) for i in indices]


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # the script's steps are warm-up + one window: it ends with the window, like the demo's
    for x, y in DataLoader(Slow(), batch_size=16, shuffle=True, num_workers=4):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


@pytest.fixture
def burners() -> Iterator[None]:
    """Two busy loops beside the test: other work using the host's cores."""
    procs = [subprocess.Popen([PY, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@pytest.fixture
def ws(workspace: Path) -> Path:
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    return workspace


async def _run(ws: Path, script: str, **extra: Any) -> dict[str, Any]:
    (ws / "train.py").write_text(script)
    args = {
        "command": [PY, "train.py"],
        "warmup_steps": 5,
        "measure_steps": 20,
        "repeats": 1,
        "timeout_s": 300,
        "contract": {
            "invariants": {"workload": "honest", "global_batch": 16},
            "execution": {"microbatch": 16, "accumulation": 1, "world_size": 1},
        },
        **extra,
    }
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None
    assert out["state"] == "executed", out.get("failure_reason")
    return out


@pytest.mark.usefixtures("burners")
@pytest.mark.parametrize("script", [CHECKPOINTS, LOADER], ids=["checkpoint-every-5-steps", "loader-workers"])
async def test_an_honest_script_beside_a_cpu_burner_is_not_measurement_dependent(
    ws: Path, script: str
) -> None:
    pytest.importorskip("torch")
    out = await _run(ws, script)
    (check,) = out["timing_checks"]
    assert check["status"] == "corroborated", check
    assert check["consistency"] in ("consistent", "noisy"), check
    if check["consistency"] == "noisy":
        assert check["next"], check
    assert not any("not corroborated" in w for w in out["warnings"]), out["warnings"]


@pytest.mark.usefixtures("burners")
async def test_work_skipped_only_while_measured_is_refused_beside_a_cpu_burner(ws: Path) -> None:
    (ws / "helper.py").write_text(SKIP_WHILE_MEASURED)
    contract = {
        "invariants": {"workload": "paced", "global_batch": 8},
        "execution": {"microbatch": 8, "accumulation": 1, "world_size": 1},
    }
    out = await _run(ws, TRAIN, timing="explicit", warmup_steps=4, contract=contract)
    (check,) = out["timing_checks"]
    assert check["consistency"] == "measurement_dependent", check
    assert out["warnings"][0].startswith("timing not corroborated")


# --- the check on step times built by hand -------------------------------------------------------------------


def test_a_warm_up_transient_before_a_window_that_ends_the_script_is_noisy() -> None:
    """The demo's candidate on a busy host: loader workers starting make the warm-up tail 13x slower than
    the window, and the script ends with the window (no guard steps)."""
    record = _record([400.0, 300.0, 220.0, 200.0, 210.0] + [16.0] * 30, 5, 30)
    check = corroborate_launch(0, [record], _stamps(record))
    assert check.consistency == "noisy" and not check.blocks_keep, check
    assert check.neighbour_ratio is not None and check.neighbour_ratio > 10
    assert check.next is not None and "guard steps" in check.next
    assert any("ended with its last window" in r for r in check.reasons), check.reasons


def test_slow_steps_on_one_side_only_are_noisy_and_say_what_settles_it() -> None:
    # a load burst (or a save at the end) over the guard steps; the warm-up tail ran like the window
    record = _record([10.0] * 30 + [40.0] * 8, 10, 20)
    check = corroborate_launch(0, [record], _stamps(record))
    assert check.consistency == "noisy" and not check.blocks_keep, check
    assert check.next is not None and "longer windows" in check.next


def test_periodic_saves_inside_and_outside_the_window_are_not_measurement_dependent() -> None:
    """A save every 5 steps: 1 step in 5 costs 10x. The sides' medians may land on saves (few steps), but a
    save is a kind of step the window holds too."""
    steps = [100.0 if s % 5 == 4 else 10.0 for s in range(34)]
    steps[5:7] = [100.0, 100.0]  # the warm-up tail's steps land on saves and a loader stall
    steps[30:34] = [100.0, 10.0, 100.0, 100.0]
    record = _record(steps, 6, 24)
    check = corroborate_launch(0, [record], _stamps(record))
    assert check.consistency != "measurement_dependent", check.reasons


def test_a_window_faster_than_both_sides_is_still_measurement_dependent() -> None:
    """Skipped work shows on both edges of the window, whatever the load does to the steps around it."""
    record = _record([12.0, 30.0, 14.0, 25.0] + [1.0] * 20 + [12.0, 35.0, 13.0, 20.0, 12.0], 4, 20)
    check = corroborate_launch(0, [record], _stamps(record))
    assert check.consistency == "measurement_dependent" and check.blocks_keep, check
    assert "on both sides" in check.reasons[0]


def test_a_late_stamp_on_a_busy_host_is_not_a_bent_clock() -> None:
    """The demo's candidate beside two burners: the stamping thread waited 70 ms for a core before it read
    the window's last boundary (a stamp is never early, only late). Nearby prompt stamps tell the truth."""
    record = _record([15.0] * 35, 5, 30)
    ticks = _stamps(record)
    ticks.stamps[0][35] += 70_000_000
    ticks.ended_ns += 70_000_000
    for b in range(20, 24):  # a burst: four boundaries read at once, stamped with the last one's time
        ticks.stamps[0][b] = ticks.stamps[0][24]
    check = corroborate_launch(0, [record], ticks)
    assert check.status == "corroborated", check.reasons
    # the same stamps against a record whose clock ran 20% fast over its window: still untrusted
    bent = _record([15.0] * 5 + [12.0] * 30, 5, 30)
    check = corroborate_launch(0, [bent], _stamps(record))
    assert check.status == "untrusted" and check.blocks_keep, check.reasons
    assert any("window 0 took" in r for r in check.reasons), check.reasons
