"""Trace analyses on small hand-built traces whose answers are computed by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.traces import (
    CATEGORIES,
    AnalysisOptions,
    RankProfile,
    analyze_trace,
    analyze_traces,
    classify_device,
)
from perfgate.traces.analyses import ops
from perfgate.traces.analyses.intervals import intersection_length, merge, union_length
from perfgate.traces.analyses.ops import self_times

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
MUSA = FIXTURES / "musa_s4000_rank1.json"
ROCM = FIXTURES / "rocm_mi300x_rank-3.json"


def category(profile: RankProfile, name: str) -> Any:
    return next(c for c in profile.categories if c.category == name)


# --------------------------------------------------------------------------- MUSA naming


def test_musa_trace_breakdown_matches_the_hand_computed_timeline() -> None:
    p = analyze_trace(MUSA)
    assert (p.rank, p.rank_source, p.world_size) == (1, "distributedInfo", 2)
    assert (p.backend, p.device) == ("musa", "MTT S4000")
    # Window: launches before ProfilerStep#5 (ts 1800). Device work from 1050 to 1540.
    assert p.window.excluded_last_step and p.window.end_us == pytest.approx(1800 - 1000)
    assert p.span_us == 490
    # busy: [1050,1230) + [1240,1242) + [1450,1525) + [1530,1540) = 180 + 2 + 75 + 10
    assert p.busy_us == 267 and p.idle_us == 223
    # compute: gemm 100 + elementwise 2 + flash attention 50; the all-reduce under the gemm is compute time
    assert p.compute_us == 152 and p.non_compute_us == 115
    assert p.communication_us == 100 and p.memory_us == 45 and p.sync_us == 0
    assert p.comm_compute_overlap_us == 20 and p.comm_compute_overlap_fraction == pytest.approx(0.2)
    assert p.idle_fraction == pytest.approx(223 / 490)
    assert p.streams == 2


def test_musa_categories_cover_gemm_attention_mccl_and_copies_with_bandwidth() -> None:
    p = analyze_trace(MUSA)
    assert {c.category for c in p.categories} == {
        "gemm",
        "communication",
        "attention",
        "elementwise",
        "memcpy_h2d",
        "memcpy_d2h",
        "memcpy_d2d",
        "memset",
    }
    h2d = category(p, "memcpy_h2d")
    assert (h2d.count, h2d.total_us, h2d.bytes) == (1, 10, 1e6)
    assert h2d.bandwidth_gb_per_s == pytest.approx(100.0)  # 1 MB in 10 us
    assert category(p, "memcpy_d2d").bandwidth_gb_per_s == pytest.approx(1000.0)
    assert category(p, "communication").kind == "communication"
    assert category(p, "memset").kind == "memory"
    assert sum(c.share for c in p.categories) == pytest.approx(1.0)
    # The gemm launched in the excluded last step is not counted.
    assert category(p, "gemm").count == 1
    assert p.top_kernels[0].total_us == 100 and p.top_kernels[0].category in ("gemm", "communication")


def test_musa_host_side_launches_delays_queue_and_syncs() -> None:
    launch = analyze_trace(MUSA).launch
    assert launch.launches == 8 and launch.launches_per_step == 4
    assert launch.api_counts == {"musaLaunchKernel": 4, "musaMemcpyAsync": 3, "musaMemsetAsync": 1}
    assert launch.unmatched_device_events == 0
    # kernel start - launch start: 20, 40, 10, 40, 40, 80, 90, 90
    assert launch.launch_delay_us is not None
    assert launch.launch_delay_us.mean_us == pytest.approx(51.25)
    assert launch.launch_delay_us.max_us == 90
    # The 2 us elementwise kernel ran shorter than its 5 us launch call.
    assert launch.launch_bound_kernels == 1 and launch.launch_bound_fraction == pytest.approx(1 / 3)
    assert launch.short_kernels == 1 and launch.short_kernel_time_us == 2
    # Outstanding launches peak at 4 (1440-1500); nothing is queued from 1242 to 1410.
    assert launch.queue_depth_max == 4
    assert launch.queue_depth_mean == pytest.approx(687 / 490)
    assert launch.queue_empty_fraction == pytest.approx(168 / 490)
    sync = analyze_trace(MUSA).sync
    assert (sync.host_sync_calls, sync.host_sync_us) == (1, 50)
    assert (sync.implicit_sync_ops, sync.implicit_sync_us) == (1, 3)
    assert sync.calls[0].name == "musaStreamSynchronize"


def test_musa_steps_ops_and_profiler_attributed_flops() -> None:
    p = analyze_trace(MUSA)
    assert p.steps is not None
    assert [(s.step, s.duration_us, s.launches, s.in_window) for s in p.steps.steps] == [
        (3, 400, 4, True),
        (4, 400, 4, True),
        (5, 300, 0, False),
    ]
    assert p.steps.count == 2 and p.steps.mean_us == 400
    linear = next(o for o in p.top_ops if o.name == "aten::linear")
    assert (linear.total_us, linear.self_us) == (100, 20)  # addmm (80) is its child
    assert all(not o.name.startswith("ProfilerStep") for o in p.top_ops)
    assert p.flops is not None and "profiler-attributed" in p.flops.basis
    assert p.flops.profiler_attributed_flops == 2e9 and p.flops.flops_per_step == 1e9
    assert next(o for o in p.top_ops if o.name == "aten::addmm").flops == 2e9


def test_including_the_last_step_adds_its_kernels() -> None:
    p = analyze_trace(MUSA, AnalysisOptions(include_last_step=True))
    assert not p.window.excluded_last_step
    assert category(p, "gemm").count == 2
    assert p.span_us == 1920 - 1050


# --------------------------------------------------------------------------- ROCm naming


def test_rocm_trace_uses_hip_names_rccl_kernels_and_the_rank_in_the_file_name() -> None:
    p = analyze_trace(ROCM)
    assert (p.rank, p.rank_source, p.backend, p.device) == (3, "file_name", "rocm", "AMD Instinct MI300X")
    assert {c.category for c in p.categories} == {"communication", "gemm", "memcpy_h2d", "reduction"}
    # copy [120.4,130.7) gemm [180.6,231.4) rccl [200.3,260.7) reduce [250.9,254.2)
    assert p.span_us == pytest.approx(140.3)
    assert p.busy_us == pytest.approx(10.3 + 80.1)
    assert p.compute_us == pytest.approx(50.8 + 3.3)
    assert p.comm_compute_overlap_us == pytest.approx(31.1 + 3.3)
    # hipMemcpyWithStream reports the size on the host call; the device copy inherits it.
    assert category(p, "memcpy_h2d").bytes == 4096
    assert (p.sync.blocking_copy_calls, p.sync.host_sync_calls) == (1, 1)


def test_hta_rounding_truncates_each_event_to_whole_microseconds() -> None:
    p = analyze_trace(ROCM, AnalysisOptions(time_basis="hta_rounded"))
    # ceil(start), floor(end): copy [121,130) gemm [181,231) rccl [201,260) reduce [251,254)
    assert p.time_basis == "hta_rounded"
    assert (p.span_us, p.idle_us, p.compute_us, p.non_compute_us) == (139, 51, 53, 35)


# --------------------------------------------------------------------------- edge cases


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


def kernel(
    name: str, ts: float, dur: float, corr: int, stream: int = 7, cat: str = "kernel"
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": corr, "device": 0},
    }


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 9, "tid": 9, "ts": ts, "dur": 3,
            "args": {"correlation": corr}}  # fmt: skip


def test_a_trace_without_profiler_steps_is_analyzed_whole_with_a_warning(tmp_path: Path) -> None:
    events = [launch(0, 1), kernel("sgemm_128x128", 10, 20, 1), launch(5, 2), kernel("nccl_all", 40, 10, 2)]
    p = analyze_trace(write_trace(tmp_path / "t.json", events))
    assert p.steps is None and p.window.end_us is None
    assert any("no ProfilerStep" in w for w in p.warnings)
    assert (p.span_us, p.compute_us, p.non_compute_us, p.idle_us) == (40, 20, 10, 10)


def test_a_cpu_only_trace_gives_an_empty_breakdown_and_host_results(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 50,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "no_duration", "pid": 1, "tid": 1, "ts": 6},
    ]
    p = analyze_trace(write_trace(tmp_path / "cpu.json", events))
    assert any("1 complete events lacked ts or dur" in w for w in p.warnings)
    assert (p.backend, p.device, p.span_us, p.compute_us) == ("cpu", "CPU", 0, 0)
    assert p.idle_fraction is None and p.categories == [] and p.top_kernels == []
    assert any("no device activity" in w for w in p.warnings)
    assert [o.name for o in p.top_ops] == ["aten::mm"]


def test_stream_waits_count_as_non_compute_device_time(tmp_path: Path) -> None:
    events = [
        launch(0, 1),
        kernel("sgemm", 10, 10, 1),
        launch(1, 2, "cudaStreamWaitEvent"),
        kernel("Stream Wait Event", 20, 5, 2, cat="cuda_sync"),
        # An event sync without a stream is a host wait, not device time.
        {
            "ph": "X",
            "cat": "cuda_sync",
            "name": "Event Sync",
            "pid": 0,
            "tid": -1,
            "ts": 30,
            "dur": 40,
            "args": {"stream": -1, "correlation": 3},
        },
    ]
    p = analyze_trace(write_trace(tmp_path / "t.json", events))
    assert (p.span_us, p.compute_us, p.sync_us, p.non_compute_us) == (15, 10, 5, 5)
    assert p.sync.device_sync_events == 1


def test_mtia_dma_requests_are_memory_with_direction_from_args(tmp_path: Path) -> None:
    def dma(ts: float, direction: str) -> dict[str, Any]:
        return {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 9, "tid": 1, "ts": ts,
                "dur": 4, "args": {"stream": 1, "direction": direction, "size": 64}}  # fmt: skip

    events = [dma(0, "HOST_TO_DEVICE"), dma(10, "DEVICE_TO_HOST"),
              {"ph": "X", "cat": "mtia_ccp_events", "name": "add-dtype_Float", "pid": 9, "tid": 1, "ts": 4,
               "dur": 6, "args": {"stream": 1}}]  # fmt: skip
    p = analyze_trace(write_trace(tmp_path / "mtia.json", events))
    assert p.backend == "mtia"
    assert {c.category for c in p.categories} == {"memcpy_h2d", "memcpy_d2h", "elementwise"}
    assert (p.memory_us, p.compute_us, p.idle_us) == (8, 6, 0)


def test_rank_falls_back_to_zero_and_duplicates_are_reported(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", [launch(0, 1), kernel("k", 1, 1, 1)])
    b = write_trace(tmp_path / "b.json", [launch(0, 1), kernel("k", 1, 1, 1)])
    report = analyze_traces([a, b])
    assert [(p.rank, p.rank_source) for p in report.ranks] == [(0, "default"), (0, "default")]
    assert any("rank(s) [0]" in w for w in report.warnings)


def test_rank_skew_compares_shared_steps_of_two_ranks(tmp_path: Path) -> None:
    doc = json.loads(MUSA.read_text())
    slow = json.loads(MUSA.read_text())
    slow["distributedInfo"]["rank"] = 0
    for e in slow["traceEvents"]:
        if e.get("name") == "ProfilerStep#4":
            e["dur"] = 460
    (tmp_path / "r1.json").write_text(json.dumps(doc))
    (tmp_path / "r0.json").write_text(json.dumps(slow))
    report = analyze_traces([tmp_path / "r1.json", tmp_path / "r0.json"])
    assert [p.rank for p in report.ranks] == [0, 1]
    skew = report.rank_skew
    assert skew is not None and skew.ranks == 2 and skew.common_steps == 2
    assert (skew.worst_step, skew.max_step_skew_us, skew.mean_step_skew_us) == (4, 60, 30)
    assert skew.slowest_rank == 0
    assert [(m.rank, m.mean_step_us) for m in skew.per_rank_mean_step_us] == [(0, 430), (1, 400)]
    assert analyze_traces([MUSA]).rank_skew is None


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("name", "cat", "expected"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", "communication"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "kernel", "communication"),
        ("mcclKernel_AllGather_RING_LL_Sum_half", "kernel", "communication"),
        ("hccl_all_reduce_kernel", "kernel", "communication"),
        ("cross_device_reduce_1stage<float, 8>", "kernel", "communication"),
        ("volta_sgemm_128x32_nt", "kernel", "gemm"),
        ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN", "kernel", "gemm"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>", "kernel", "gemm"),
        ("triton_tem_fused_mm_0", "kernel", "gemm"),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits>", "kernel", "attention"),
        ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "kernel", "attention"),
        ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>", "kernel", "convolution"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
            "kernel",
            "elementwise",
        ),
        ("triton_poi_fused_add_cos_sin_0", "kernel", "elementwise"),
        ("triton_red_fused_sum_1", "kernel", "reduction"),
        ("void at::native::reduce_kernel<512, 1>", "kernel", "reduction"),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>",
            "kernel",
            "reduction",
        ),
        ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", "memcpy_h2d"),
        ("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", "memcpy_d2h"),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memcpy_d2d"),
        ("Memcpy PtoP (Device -> Device)", "gpu_memcpy", "memcpy_other"),
        ("Memcpy1 HtoD (Pinned -> Device)", "gpu_memcpy", "memcpy_h2d"),
        ("Memcpy3", "gpu_memcpy", "memcpy_other"),
        ("Memset (Device)", "gpu_memset", "memset"),
        ("Stream Sync", "cuda_sync", "sync"),
        ("some_vendor_kernel_xyz", "kernel", "other"),
    ],
)
def test_kernel_names_of_every_vendor_get_a_category(name: str, cat: str, expected: str) -> None:
    assert classify_device(name, cat)[0] == expected
    assert expected in CATEGORIES


# --------------------------------------------------------------------------- numerics


def test_union_and_intersection_of_intervals() -> None:
    s = np.array([5.0, 0.0, 2.0, 20.0, 10.0])
    e = np.array([12.0, 3.0, 4.0, 25.0, 11.0])
    ms, me = merge(s, e)
    assert ms.tolist() == [0.0, 5.0, 20.0] and me.tolist() == [4.0, 12.0, 25.0]
    assert union_length(s, e) == 4 + 7 + 5
    assert union_length(np.empty(0), np.empty(0)) == 0
    assert (
        intersection_length(np.array([0.0]), np.array([10.0]), np.array([5.0, 8.0]), np.array([7.0, 20.0]))
        == 4
    )


def _self_times_by_stack(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray) -> np.ndarray:
    end = ts + dur
    out = dur.astype(float).copy()
    stack: list[int] = []
    current = None
    for i in np.lexsort((-dur, ts, tid)).tolist():
        if dur[i] <= 0:
            continue
        if tid[i] != current:
            current, stack = tid[i], []
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            out[stack[-1]] -= dur[i]
        stack.append(i)
    return np.maximum(out, 0)


def _parents_by_walk(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray) -> list[int]:
    """`parent_rows` by its definition, one event at a time: the starts and ends of each thread in
    time order (ends first at equal times, the longer start first), an event opened at depth d has as
    parent the latest event opened at depth d - 1 (overlapping, not nested, events included)."""
    marks: list[tuple[int, float, int, float, int]] = []
    for i in range(ts.size):
        if dur[i] > 0:
            marks.append((int(tid[i]), float(ts[i]), 1, -float(dur[i]), i))
            marks.append((int(tid[i]), float(ts[i] + dur[i]), 0, 0.0, i))
    parent = [-1] * ts.size
    depth = 0
    last_at: dict[int, int] = {}
    # A stable sort: equal starts of equal length keep row order (the order of equal ends changes no
    # depth).
    for _, _, is_open, _, i in sorted(marks, key=lambda m: m[:4]):
        if not is_open:
            depth -= 1
            continue
        depth += 1
        if depth > 1 and depth - 1 in last_at:
            parent[i] = last_at[depth - 1]
        last_at[depth] = i
    return parent


@pytest.mark.parametrize("threads_looped", [0, 64])
def test_the_parent_walk_finds_each_events_parent_as_a_step_by_step_walk(
    monkeypatch: pytest.MonkeyPatch, threads_looped: int
) -> None:
    # Nested, overlapping, duplicated, equal-start and zero-length events; ends that round onto their
    # start at epoch-microsecond times; rows in walk order and shuffled; one to 70 threads.
    monkeypatch.setattr(ops, "THREADS_LOOPED", threads_looped)
    rng = np.random.default_rng(threads_looped)
    for trial in range(400):
        n = int(rng.integers(1, 70))
        ts = rng.integers(0, 20, n).astype(float) * (0.5 if trial % 2 else 1.0)
        dur = rng.integers(-1, 8, n).astype(float)
        if trial % 3 == 0:
            ts += 1.7e15
            dur *= (1e-3, 0.3, 1.0)[trial % 9 // 3]
        tid = rng.integers(0, (1, 2, 3, 70)[trial % 4], n)
        if trial % 5 < 3:
            order = np.lexsort((-dur, ts, tid))
            ts, dur, tid = ts[order], dur[order], tid[order]
        assert ops.parent_rows(ts, dur, tid).tolist() == _parents_by_walk(ts, dur, tid), trial


def test_the_parent_walk_sorts_only_events_out_of_walk_order(monkeypatch: pytest.MonkeyPatch) -> None:
    ts = np.array([0.0, 0.0, 1.0, 5.0, 0.0, 2.0])
    dur = np.array([10.0, 4.0, 2.0, 1.0, 3.0, 1.0])
    tid = np.array([1, 1, 1, 1, 2, 2])
    expected = [-1, 0, 1, 0, -1, 4]

    def no_sort(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("events already in walk order were sorted")

    with monkeypatch.context() as patch:
        patch.setattr(np, "lexsort", no_sort)
        assert ops.parent_rows(ts, dur, tid).tolist() == expected
    shuffled = np.array([5, 3, 0, 2, 4, 1])
    got = ops.parent_rows(ts[shuffled], dur[shuffled], tid[shuffled])
    assert got.tolist() == [
        int(np.flatnonzero(shuffled == expected[r])[0]) if expected[r] >= 0 else -1 for r in shuffled
    ]


def test_vectorized_self_time_matches_a_stack_walk_on_random_call_trees() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        rows: list[tuple[float, float, int]] = []

        def grow(t0: int, t1: int, depth: int, tid: int, rows: list[tuple[float, float, int]] = rows) -> None:
            t = t0
            while t < t1 and len(rows) < 300:
                a = t + int(rng.integers(0, 3))
                b = min(t1, a + int(rng.integers(0, 25)))
                if b > a:
                    rows.append((a, b - a, tid))
                    if depth < 4 and b - a > 2:
                        grow(a, b, depth + 1, tid, rows)
                t = b + int(rng.integers(0, 3))

        for tid in range(3):
            grow(0, 120, 0, tid)
        arr = np.array(rows, float)[rng.permutation(len(rows))]
        ts, dur, tid = arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int64)
        np.testing.assert_allclose(self_times(ts, dur, tid), _self_times_by_stack(ts, dur, tid))
