"""The in-process harness, driven directly: windows, step columns, probes, device edges, config."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import perfgate.harness as harness_pkg
from perfgate.harness import ConfigError, HarnessConfig, ProfileConfig, Window, WindowComplete
from perfgate.harness import window as window_mod
from perfgate.harness.device import DeviceBackend
from perfgate.harness.hooks import batch_size
from perfgate.harness.record import RECORD_SCHEMA, record_path


class FakeClock:
    """Stands in for time.perf_counter_ns so step durations are exact."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance_ms(self, ms: float) -> None:
        self.ns += int(ms * 1e6)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(window_mod, "_now", fake)
    return fake


def _config(**kw: Any) -> HarnessConfig:
    return HarnessConfig(**{"warmup_steps": 2, "measure_steps": 4, **kw})


def test_warmup_steps_are_recorded_but_excluded_from_the_window(clock: FakeClock) -> None:
    w = Window(config=_config(), instrument=False)
    durations = [50, 30, 10, 11, 12, 13]
    for ms in durations:
        with w.step(samples=8):
            clock.advance_ms(ms)
    rec = w.to_record()
    assert w.done
    assert rec["steps"]["count"] == 6 and rec["steps"]["warmup"] == 2
    assert [t / 1e6 for t in rec["steps"]["step_time_ns"]] == pytest.approx(durations)
    (win,) = rec["windows"]
    assert (win["first_step"], win["last_step"], win["steps"]) == (2, 5, 4)
    assert win["elapsed_ns"] == sum(rec["steps"]["step_time_ns"][2:])
    assert rec["steps"]["samples"] == [8] * 6
    assert rec["complete"] and rec["stop_reason"] == "window_complete"


def test_steps_after_the_last_window_are_ignored(clock: FakeClock) -> None:
    w = Window(config=_config(warmup_steps=1, measure_steps=2), instrument=False)
    for _ in range(10):
        w.mark_step()
        clock.advance_ms(1)
    assert w.steps_completed == 3
    assert w.to_record()["steps"]["count"] == 3


def test_consecutive_windows_cover_disjoint_step_ranges(clock: FakeClock) -> None:
    w = Window(config=_config(windows=3), instrument=False)
    for _ in range(2 + 4 * 3):
        with w.step():
            clock.advance_ms(5)
    wins = w.to_record()["windows"]
    assert [(x["first_step"], x["last_step"]) for x in wins] == [(2, 5), (6, 9), (10, 13)]
    assert all(x["elapsed_ns"] == 20_000_000 for x in wins)


def test_mark_step_measures_boundary_to_boundary_including_gaps(clock: FakeClock) -> None:
    # The time between two `with` blocks (data loading in the loop, logging) belongs to the next step.
    w = Window(config=_config(warmup_steps=0, measure_steps=3), instrument=False)
    for _ in range(3):
        clock.advance_ms(2)  # outside the block
        with w.step():
            clock.advance_ms(8)
    rec = w.to_record()
    assert [t / 1e6 for t in rec["steps"]["step_time_ns"]] == pytest.approx([8, 10, 10])
    assert rec["windows"][0]["first_step"] == 0


def test_stop_raises_window_complete_after_the_last_window(clock: FakeClock) -> None:
    w = Window(config=_config(warmup_steps=0, measure_steps=2), stop=True, instrument=False)
    while not w.done:
        w.mark_step()
    # the script's own output of its last step runs; its next step's work does not
    with pytest.raises(WindowComplete), w.step():
        pytest.fail("the step after the last window ran")
    # WindowComplete is not an Exception: `except Exception` in a training script cannot swallow it
    assert not issubclass(WindowComplete, Exception)


def test_a_failed_step_is_not_counted(clock: FakeClock) -> None:
    w = Window(config=_config(), instrument=False)
    with pytest.raises(RuntimeError), w.step():
        raise RuntimeError("boom")
    assert w.steps_completed == 0


def test_the_record_file_is_written_at_completion_and_is_valid_json(clock: FakeClock, tmp_path: Path) -> None:
    w = Window(config=_config(record_dir=str(tmp_path)), instrument=False)
    for _ in range(6):
        w.mark_step(tokens=128)
        clock.advance_ms(3)
    path = record_path(tmp_path, 0)
    assert w.record_file == path
    data = json.loads(path.read_text())
    assert data["schema"] == RECORD_SCHEMA and data["version"] == 1
    assert data["steps"]["tokens"] == [128] * 6
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temporary file


def test_an_unfinished_window_is_written_as_incomplete_on_close(clock: FakeClock, tmp_path: Path) -> None:
    w = Window(config=_config(record_dir=str(tmp_path)), instrument=False)
    for _ in range(3):
        w.mark_step()
    w.close("script_exit", error="ValueError: data ran out")
    data = json.loads(record_path(tmp_path, 0).read_text())
    assert not data["complete"] and data["windows"] == []
    assert data["stop_reason"] == "script_exit" and data["error"] == "ValueError: data ran out"


def test_the_rank_comes_from_the_launcher_environment(
    clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    w = Window(config=_config(record_dir=str(tmp_path), warmup_steps=0, measure_steps=1), instrument=False)
    w.mark_step()
    data = json.loads((tmp_path / "rank3.json").read_text())
    assert (data["rank"], data["local_rank"], data["world_size"]) == (3, 1, 4)


def test_only_the_first_optimizer_delimits_steps(clock: FakeClock) -> None:
    w = Window(config=_config(warmup_steps=0, measure_steps=3), instrument=False, _optimizer_mode=True)
    gen, disc = object(), object()
    for _ in range(3):
        clock.advance_ms(4)
        w.optimizer_step(gen)
        w.optimizer_step(disc)
    rec = w.to_record()
    assert rec["steps"]["count"] == 3
    assert rec["other_optimizer_steps"] == 3
    assert rec["notes"] and "other optimizers" in rec["notes"][0]


class _FakeEvent:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: int | None = None

    def record(self) -> None:
        self.at = self.clock.ns

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) / 1e6


class _FakeAccelerator:
    """The slice of a torch device module (torch.cuda, torch.musa, ...) the harness uses."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.syncs = 0
        self.resets = 0
        self.peak = 0

    def synchronize(self) -> None:
        self.syncs += 1

    def current_device(self) -> int:
        return 0

    def get_device_name(self, index: int) -> str:
        return "Fake Accelerator"

    def Event(self, enable_timing: bool = False) -> _FakeEvent:
        return _FakeEvent(self.clock)

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1
        self.peak = 0

    def max_memory_allocated(self) -> int:
        return self.peak

    def max_memory_reserved(self) -> int:
        return self.peak * 2


def test_the_device_is_synchronised_only_at_window_edges(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeAccelerator(clock)
    monkeypatch.setattr(window_mod, "detect_backend", lambda *a: DeviceBackend("cuda", fake))
    w = Window(config=_config(warmup_steps=3, measure_steps=5), instrument=False)
    for i in range(8):
        with w.step():
            clock.advance_ms(10 + i)
            if i == 5:
                fake.peak = 4096  # allocated during the window
    rec = w.to_record()
    assert fake.syncs == 2  # window start and window end, never per step
    assert fake.resets == 1  # peak memory reset at the window start
    (win,) = rec["windows"]
    assert win["peak_allocated_bytes"] == 4096 and win["peak_reserved_bytes"] == 8192
    assert win["device_step_ms"] == pytest.approx([13, 14, 15, 16, 17])
    assert win["device_elapsed_ms"] == pytest.approx(75)
    assert rec["device"]["kind"] == "cuda" and rec["device"]["name"] == "Fake Accelerator"


def test_a_custom_synchronize_callable_runs_at_edges(clock: FakeClock) -> None:
    calls: list[int] = []
    w = Window(
        config=_config(warmup_steps=1, measure_steps=2), synchronize=lambda: calls.append(1), instrument=False
    )
    for _ in range(3):
        w.mark_step()
    assert len(calls) == 2
    assert w.to_record()["device"]["kind"] == "custom"


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        ([[1, 2]], None),
        ({"x": type("T", (), {"shape": (16, 3)})()}, 16),
        ((type("T", (), {"shape": (4,)})(), 0), 4),
        (type("T", (), {"shape": ()})(), None),
        ("text", None),
        ([], None),
    ],
)
def test_batch_size_is_the_leading_dimension_of_the_first_tensor(batch: object, expected: int | None) -> None:
    assert batch_size(batch) == expected


def test_data_loader_waits_and_batch_sizes_are_recorded() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(40, 3)), batch_size=5)
    with Window(config=_config(warmup_steps=1, measure_steps=3)) as w:
        batches = iter(loader)
        for _ in range(4):
            with w.step():
                next(batches)
                next(batches)  # two micro-batches in one step
    steps = w.to_record()["steps"]
    assert steps["samples"] == [10, 10, 10, 10]
    assert all(ns > 0 for ns in steps["data_wait_ns"])


def test_backward_time_is_recorded_per_step() -> None:
    torch = pytest.importorskip("torch")
    x = torch.ones(4, requires_grad=True)
    with Window(config=_config(warmup_steps=0, measure_steps=2)) as w:
        for _ in range(2):
            with w.step():
                (x * 2).sum().backward()
    assert all(ns > 0 for ns in w.to_record()["steps"]["backward_ns"])


def test_config_round_trips_through_the_environment() -> None:
    cfg = HarnessConfig(
        record_dir="/tmp/r",
        warmup_steps=3,
        measure_steps=7,
        windows=2,
        stop=False,
        timing="explicit",
        samples_per_step=32,
        tokens_per_step=4096,
        data_wait=False,
        device_events=False,
        progress_every=5,
        label="baseline",
        profile=ProfileConfig(trace_dir="/tmp/t", skip_first=2, wait=1, warmup=2, active=3, with_flops=True),
    )
    assert HarnessConfig.from_env(cfg.to_env()) == cfg
    assert HarnessConfig.from_env({}) == HarnessConfig()


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"PERFGATE_WARMUP_STEPS": "five"}, "PERFGATE_WARMUP_STEPS must be an integer"),
        ({"PERFGATE_STOP": "maybe"}, "PERFGATE_STOP must be 1 or 0"),
        ({"PERFGATE_TIMING": "wall"}, "PERFGATE_TIMING must be one of"),
        ({"PERFGATE_MEASURE_STEPS": "0"}, "measure_steps must be >= 1"),
        ({"PERFGATE_PROFILE_DIR": "/t", "PERFGATE_PROFILE_WARMUP": "0"}, "warmup must be >= 1"),
    ],
)
def test_bad_settings_name_what_to_fix(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        HarnessConfig.from_env(env)


def test_importing_the_harness_loads_neither_torch_nor_mcp() -> None:
    code = (
        "import sys, perfgate.harness, perfgate.harness.launch;"
        "print(sorted(m for m in ('torch', 'mcp', 'numpy', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_lazy_exports_resolve_on_first_access() -> None:
    for module in (
        importlib.import_module("perfgate.harness.dump"),
        importlib.import_module("perfgate.harness.samples"),
    ):
        for name in module.__all__:
            assert name in harness_pkg.__all__
            assert getattr(harness_pkg, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = harness_pkg.not_a_name  # pyright: ignore[reportAttributeAccessIssue] -- the point of the test


def test_an_accelerator_initialised_after_the_first_edge_is_still_synchronised(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Optimizer mode with no warm-up opens the window before the script has touched the device.
    fake = _FakeAccelerator(clock)
    in_use: list[bool] = [False]
    monkeypatch.setattr(
        window_mod,
        "detect_backend",
        lambda *a: DeviceBackend("cuda", fake) if in_use[0] else DeviceBackend("cpu"),
    )
    w = Window(config=_config(warmup_steps=0, measure_steps=3), instrument=False, _optimizer_mode=True)
    in_use[0] = True  # the script now initialises the accelerator
    opt = object()
    for _ in range(3):
        clock.advance_ms(5)
        w.optimizer_step(opt)
    assert fake.syncs == 1  # the window's end edge
    assert w.to_record()["device"]["kind"] == "cuda"


# ---------------------------------------------------------------- nothing of perfgate's inside a window


def _steps(w: Window, clock: FakeClock, n: int, during: dict[int, Any] | None = None) -> None:
    for _ in range(n):
        with w.step(samples=4):
            clock.advance_ms(10)
            if during and w.steps_completed in during:
                during[w.steps_completed]()


def test_a_tensor_dump_inside_a_window_restarts_it_after_a_fresh_warm_up(
    clock: FakeClock, tmp_path: Path
) -> None:
    import numpy as np

    from perfgate.harness import dump_tensors

    w = Window(config=_config(warmup_steps=2, measure_steps=4))  # instrumented: the dump finds it
    try:
        dump = {3: lambda: dump_tensors(tmp_path / "d.safetensors", {"x": np.zeros(3, np.float32)})}
        _steps(w, clock, 10, dump)
    finally:
        w.close()
    rec = w.to_record()
    (win,) = rec["windows"]
    # the dump ran in step 3, inside the window that began at step 2: a new one starts after the
    # dump's step and 2 more warm-up steps, so no window holds step 3 or the two after it
    assert (win["first_step"], win["last_step"]) == (6, 9)
    assert rec["complete"] and w.done
    assert any("dump_tensors ran inside window 0 at step 3" in n for n in rec["notes"]), rec["notes"]


def test_a_dump_outside_every_window_changes_nothing(clock: FakeClock, tmp_path: Path) -> None:
    import numpy as np

    from perfgate.harness import dump_tensors

    w = Window(config=_config(warmup_steps=2, measure_steps=4))
    try:
        _steps(w, clock, 6, {1: lambda: dump_tensors(tmp_path / "d.safetensors", {"x": np.zeros(2)})})
    finally:
        w.close()
    rec = w.to_record()
    assert [(x["first_step"], x["last_step"]) for x in rec["windows"]] == [(2, 5)]
    assert rec["notes"] == []


def test_sample_records_are_written_at_the_window_end_not_inside_it(clock: FakeClock, tmp_path: Path) -> None:
    from perfgate.harness import SampleLog

    log = SampleLog(tmp_path / "s")
    w = Window(config=_config(warmup_steps=1, measure_steps=3))
    sizes: list[int] = []
    try:
        for i in range(4):
            with w.step(samples=1):
                clock.advance_ms(10)
                log.record([i], epoch=0, step=i)
                sizes.append(len(log.path.read_text().splitlines()) if log.path.exists() else 0)
    finally:
        w.close()
    # step 0 (warm-up) is written at once; steps 1-3 are held while the window measures them
    assert sizes == [1, 1, 1, 1]
    assert [json.loads(line)["sample_id"] for line in log.path.read_text().splitlines()] == [0, 1, 2, 3]


def test_modules_the_script_imports_inside_a_window_are_named(
    clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "late_module_for_window_test.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    w = Window(config=_config(warmup_steps=1, measure_steps=3), instrument=False)
    _steps(w, clock, 4, {2: lambda: importlib.import_module("late_module_for_window_test")})
    notes = w.to_record()["notes"]
    assert any("late_module_for_window_test" in n and "window 0" in n for n in notes), notes


def test_a_torch_save_inside_a_window_is_named_and_kept_in_the_time(clock: FakeClock, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    w = Window(config=_config(warmup_steps=1, measure_steps=3))
    try:
        _steps(w, clock, 4, {2: lambda: torch.save({"a": 1}, tmp_path / "ckpt.pt")})
    finally:
        w.close()
    rec = w.to_record()
    assert [(x["first_step"], x["last_step"]) for x in rec["windows"]] == [(1, 3)]
    assert any("torch.save ran 1 time(s) inside it from step 2" in n for n in rec["notes"]), rec["notes"]


def test_dumping_torch_tensors_never_imports_the_numpy_dtype_extensions() -> None:
    pytest.importorskip("torch")
    code = (
        "import sys, tempfile, os, torch; from perfgate.harness import dump_tensors;"
        "dump_tensors(os.path.join(tempfile.mkdtemp(), 'd.safetensors'), {'w': torch.zeros(2, dtype=torch.bfloat16)});"
        "print('ml_dtypes' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"


def test_process_settings_are_read_at_the_first_boundary_and_a_later_change_is_noted(
    clock: FakeClock,
) -> None:
    """The fingerprint is what the script set up in its first step (a window open from step 0, as a profiled
    run's is, sees the same settings as one opened after a warm-up); a change after that is noted."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    set_up, changed = (1, 2) if before != 1 else (2, 3)
    w = Window(config=_config(warmup_steps=0, measure_steps=1, windows=3), instrument=False)
    try:
        with w.step():  # window 0 opens at its start, before the script's set-up
            torch.set_num_threads(set_up)  # the script's own set-up (torch.set_num_threads(1) in main)
        with w.step():  # window 1 opened at the first boundary, after the fingerprint was read
            torch.set_num_threads(changed)  # a change inside the loop
        with w.step():  # window 2 opened after the change
            pass
    finally:
        torch.set_num_threads(before)
    record = w.to_record()
    assert record["runtime_env"]["num_threads"] == str(set_up)
    assert record["runtime_env"]["matmul_precision"] == torch.get_float32_matmul_precision()
    notes = [n for n in record["notes"] if "settings changed" in n]
    assert (
        len(notes) == 1
        and notes[0].startswith("window 2: ")
        and f"num_threads {set_up}->{changed}" in notes[0]
    )


def test_process_settings_do_not_import_torch_for_a_job_without_it() -> None:
    code = (
        "import sys; from perfgate.harness.runtime_env import measure_runtime_env; env = measure_runtime_env(); "
        "assert 'torch' not in sys.modules and 'mcp' not in sys.modules, sorted(sys.modules); "
        "assert 'num_threads' not in env and 'OMP_NUM_THREADS' in env"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
