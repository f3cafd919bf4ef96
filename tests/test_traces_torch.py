"""Traces recorded here with torch.profiler on CPU, then analyzed (skipped without torch)."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from perfgate.traces import AnalysisOptions, analyze_trace, analyze_traces, discover_trace_files

torch = pytest.importorskip("torch")


def record(paths: list[Path]) -> list[Path]:
    """A tiny MLP under one profiler session whose schedule repeats once per path (1 warm-up, 3 active).

    One session only: with torch 2.13 on CPU a second profiler session in the same process can crash
    when it stops, so every trace comes from one session's repeated cycles.
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    written: list[Path] = []

    def save(prof: object) -> None:
        path = paths[len(written)]
        prof.export_chrome_trace(str(path))  # type: ignore[attr-defined]
        written.append(path)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    with warnings.catch_warnings():
        # torch warns that each cycle's events are cleared; one trace per cycle is what we want.
        warnings.simplefilter("ignore", UserWarning)
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=3, repeat=len(paths)),
            on_trace_ready=save,
        ) as prof:
            for _ in range(4 * len(paths)):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss.item()
                prof.step()
    assert written == paths
    return written


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("torch_traces")
    record([folder / "worker_rank0.pt.trace.json", folder / "worker_rank1.pt.trace.json"])
    return folder


def step_durations(path: Path) -> dict[int, float]:
    doc = json.loads(path.read_text())
    return {
        int(e["name"].split("#")[1]): float(e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    }


def test_a_cpu_training_trace_yields_steps_ops_and_implicit_syncs(traces: Path) -> None:
    path = traces / "worker_rank0.pt.trace.json"
    p = analyze_trace(path)
    assert (p.rank, p.rank_source, p.backend) == (0, "file_name", "cpu")
    assert any("no device activity" in w for w in p.warnings)
    assert p.span_us == 0 and p.categories == []
    durations = step_durations(path)
    assert p.steps is not None and len(p.steps.steps) == len(durations) == 3
    assert {s.step: s.duration_us for s in p.steps.steps} == pytest.approx(durations)
    # The last ProfilerStep is outside the window: statistics cover the other two.
    assert [s.in_window for s in p.steps.steps] == [True, True, False]
    assert p.steps.count == 2
    names = {o.name for o in p.top_ops}
    assert {"aten::linear", "aten::addmm"} & names
    assert all(0 <= o.self_us <= o.total_us + 1e-6 for o in p.top_ops)
    # loss.item() in each of the two windowed steps ends in _local_scalar_dense.
    assert p.sync.implicit_sync_ops == 2


def test_a_folder_of_per_rank_cpu_traces_is_compared_across_ranks(traces: Path) -> None:
    files = discover_trace_files([traces])
    assert [f.name for f in files] == ["worker_rank0.pt.trace.json", "worker_rank1.pt.trace.json"]
    report = analyze_traces(files, AnalysisOptions(top_k=3))
    assert [p.rank for p in report.ranks] == [0, 1]
    assert all(len(p.top_ops) == 3 for p in report.ranks)
    skew = report.rank_skew
    assert skew is not None and skew.ranks == 2
    # The two cycles of one session number their steps differently: no step is shared, but every
    # rank's mean step time is compared.
    assert skew.common_steps == 0 and skew.max_step_skew_us is None
    assert [m.rank for m in skew.per_rank_mean_step_us] == [0, 1]
    assert skew.slowest_rank in (0, 1)


def test_gzip_and_plain_copies_of_a_recorded_trace_analyze_identically(traces: Path, tmp_path: Path) -> None:
    src = traces / "worker_rank1.pt.trace.json"
    gz = tmp_path / "worker_rank1.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    plain, packed = analyze_trace(src), analyze_trace(gz, AnalysisOptions(chunk_bytes=4096))
    assert packed.model_dump(exclude={"path", "event_counts"}) == plain.model_dump(
        exclude={"path", "event_counts"}
    )
    assert packed.event_counts["events"] == plain.event_counts["events"]
