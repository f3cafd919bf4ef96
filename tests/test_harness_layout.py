"""What ran, checked against the contract on a real tiny CPU run: the batch of a sequence-first LSTM read
from the dimension that holds it, and a declared precision the parameters did not run in, both failing the
window run itself (`perfgate.benchmarking.runs.measured.observe_batch`), not only a later keep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _window_records import Artifacts
from perfgate.benchmarking import Contract
from perfgate.benchmarking.windows.window_plan import WindowPlan
from perfgate.benchmarking.windows.window_run import Launched, LaunchFn, WindowRun, measure_windows
from test_harness_steps import MANUAL_LOOP

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
pytest.importorskip("torch")

WARMUP, MEASURE = 2, 5


@pytest.fixture(scope="module")
def lstm_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launch of the word-level LSTM loop: inputs of (sequence 7, batch 4), no optimizer."""
    tmp = tmp_path_factory.mktemp("lstm")
    script = tmp / "train.py"
    script.write_text(MANUAL_LOOP)
    records = tmp / "records"
    argv = [sys.executable, "-m", "perfgate.harness", "--record-dir", str(records)]
    argv += ["--warmup-steps", str(WARMUP), "--measure-steps", str(MEASURE), "--", str(script), "100000"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFGATE_")} | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return records


def _once(records: Path) -> LaunchFn:
    async def launch_once(launch: int, label: str) -> Launched:
        return Launched(0, None, records, records / "none.log")

    return launch_once


async def _measure(tmp: Path, records: Path, **invariants: Any) -> WindowRun:
    execution = invariants.pop("execution", {})
    contract = Contract({"model": "lstm", "dataset": "random", **invariants}, execution)
    plan = WindowPlan(warmup_steps=WARMUP, measure_steps=MEASURE, contract=contract)
    return await measure_windows(plan, Artifacts(tmp / "ev"), _once(records), workspace=tmp)


async def test_a_sequence_first_lstm_batch_is_read_from_its_second_dimension(
    tmp_path: Path, lstm_records: Path
) -> None:
    record = json.loads((lstm_records / "rank0.json").read_text())
    assert record["steps"]["model_samples"] == [4] * (WARMUP + MEASURE)  # the first forward corrected too
    assert record["batch_layout"] == {"dim": 1, "layer": "torch.nn.modules.rnn.LSTM", "layer_batch": 4}
    got = await _measure(tmp_path, lstm_records, global_batch=4, precision="fp32")
    assert got.failure is None, got.failure
    assert got.batch is not None and (got.batch.batch, got.batch.source) == (4, "model_inputs")
    assert any("read from dimension 1" in w and "LSTM" in w for w in got.warnings), got.warnings


async def test_the_sequence_length_declared_as_the_batch_is_refused_at_run_time(
    tmp_path: Path, lstm_records: Path
) -> None:
    got = await _measure(tmp_path, lstm_records, global_batch=7, precision="fp32")
    assert got.failure is not None
    assert "contract declares global_batch 7 but the ranks processed 4 samples" in got.failure


async def test_a_declared_layout_that_contradicts_the_lstm_names_both_readings(
    tmp_path: Path, lstm_records: Path
) -> None:
    got = await _measure(
        tmp_path, lstm_records, global_batch=7, precision="fp32", execution={"batch_first": True}
    )
    assert got.failure is not None
    assert "contract declares batch_first true (the batch in dimension 0" in got.failure
    assert "LSTM inside the model saw a batch of 4, dimension 1" in got.failure


async def test_a_declared_sequence_first_layout_is_read_as_declared(
    tmp_path: Path, lstm_records: Path
) -> None:
    got = await _measure(
        tmp_path, lstm_records, global_batch=4, precision="fp32", execution={"batch_first": False}
    )
    assert got.failure is None, got.failure
    assert any("as contract batch_first declares" in w for w in got.warnings)


async def test_a_contract_saying_float64_fails_a_float32_run_naming_both(
    tmp_path: Path, lstm_records: Path
) -> None:
    record = json.loads((lstm_records / "rank0.json").read_text())
    assert record["model"]["param_dtype"] == "float32" and record["autocast"] == ["none"]
    got = await _measure(tmp_path, lstm_records, global_batch=4, precision="float64")
    assert got.summary is not None and got.failure is not None  # measured, and refused as evidence
    assert (
        "contract declares precision 'float64' but the model's parameters ran float32 without autocast"
        in got.failure
    )
    # an honest declaration of the dtype autocast computes in passes
    assert (await _measure(tmp_path, lstm_records, global_batch=4, precision="float32")).failure is None


SEQUENCE_FIRST_LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset

def collate(rows):  # (sequence, batch) as sequence-first models take it
    return torch.stack([r[0] for r in rows], dim=1)

model = torch.nn.GRU(3, 5)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(58, 11, 3)), batch_size=4, collate_fn=collate)
for epoch in range(2):
    for x in loader:
        model(x)[0].sum().backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_loaders_batch_is_its_samplers_whatever_layout_the_collate_gives(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SEQUENCE_FIRST_LOADER)
    records = tmp_path / "records"
    argv = [sys.executable, "-m", "perfgate.harness", "--record-dir", str(records), "--finish"]
    argv += ["--warmup-steps", "2", "--measure-steps", "28", "--", str(script)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFGATE_")} | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    steps = json.loads((records / "rank0.json").read_text())["steps"]
    # 58 rows in batches of 4: 14 full batches and one of 2 an epoch, never the sequence length 11
    assert steps["samples"] == ([4] * 14 + [2]) * 2
    assert steps["model_samples"] == ([4] * 14 + [2]) * 2  # the GRU saw its batch in dimension 1
