"""Name the walls a profile runs into: ranked findings with figures, time at stake, candidate and guard.

Each rule reads the analyses already in a `RankProfile` (host phases, device temporal and idle
breakdowns, kernel categories, syncs, steps) and the cross-rank comparison. A finding fires when its
share of the step passes a threshold; its ``time_at_stake_us`` is an upper bound on what removing the
wall can save per step (the time the step demonstrably spends on it: the union of the finding's own
intervals, never a span from its first event to its last across other work). Findings are ranked by time at
stake weighted by confidence (high 1.0, medium 0.7, low 0.4): a sure 30% beats a guessed 35%.

Thresholds (share of the step, per rank unless said otherwise):

========================  ===========================================================================
wall                      fires when
========================  ===========================================================================
input_pipeline            DataLoader ``__next__`` time >= 10% of the step
evaluation_in_step        ops recorded with grad mode off >= 15% of the step
synchronization           the time the host waits in sync calls (the union of their own intervals:
                          .item()/nonzero value fetches, blocking runtime syncs and copies) >= 5%
exposed_communication     collective wait not hidden by compute >= 10% (across ranks: the least any
                          rank waits; the rest is imbalance)
rank_imbalance            busy-time spread across ranks >= 10% of the mean step
host_overhead             CPU: >= 300 top-level ops per step with a median under 20 us, and the time
                          in those short ops plus uncovered host time >= 10%; device: idle time whose
                          launch came late (host wait) >= 10% of the device span
memory_bound              copies/memsets plus elementwise/reduction kernels >= 50% of device time,
                          and the time they run (union of their intervals) >= 10% of the step
compute_efficiency        compute covers >= 80% of the device span and GEMM/conv/attention >= 50% of
                          device time (then MFU, not the trace, says how far from peak it is)
op efficiency             traces with shapes and a device whose peak the table holds: GEMM/attention
                          ops taking >= 10% of the step below 50% of the dense peak. Operands under
                          50 FLOPs/byte (below every listed accelerator's ridge point) make it
                          memory_bound (small shapes), the rest compute_efficiency; time at stake:
                          their time minus the time at peak
small_micro_batch         >= 4 backward() passes per optimizer step and the tiny-op plus uncovered host time
                          >= 10% of the step. Time at stake: (1 - 1/passes) of that time (one pass of the
                          same global batch keeps one pass's per-call cost)
profiler_artefact         fewer than 2 steps in the window, or the slowest step >= 3x the median
host_contention           captured runs only (profile_segment mode='run'): other processes used >= 25%
                          of the CPUs the job may run on, and job + others kept >= 75% of them busy
                          (the job could not simply use idle CPUs). Time at stake: step x that share.
                          It is ranked above op-level findings (host_overhead, memory_bound,
                          compute_efficiency), whose confidence drops one level: contention inflates
                          op times, so the top ops point away from the cause. Unknown load (traces
                          analyzed without a capture) never fires it.
========================  ===========================================================================

Candidates and guards follow the evidence -> first candidate -> required guard table of the
optimization workflow (data wait -> workers/prefetch, guarded by coverage and input equivalence;
exposed communication -> bucketing/overlap, guarded by all-rank behaviour; compute-bound ->
compile/fusion, guarded by parity and warm-up; logging/eval -> less synchronization, guarded by
required observability).

Each finding names the code that owns its time when the trace can tell (`perfgate.traces.analyses.code`): the
nn.Module and source line of the DataLoader's user code, the no-grad pass, the sync calls, the Python
loop of tiny ops, the line calling backward(); ``Finding.code`` lists them, the summary leads with the
first. A trace without Python stacks says which capture option adds them.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfgate.traces.analyses.code import STACK_HINT
from perfgate.traces.models import (
    CodeSite,
    CodeView,
    Confidence,
    Finding,
    OpEfficiency,
    OpLoop,
    RankProfile,
    RankSkew,
    Wall,
)

__all__ = ["THRESHOLDS", "diagnose"]

THRESHOLDS: dict[str, float] = {
    "input_pipeline": 0.10,
    "evaluation_in_step": 0.15,
    "synchronization": 0.05,
    "exposed_communication": 0.10,
    "rank_imbalance": 0.10,
    "host_overhead": 0.10,
    "host_overhead_ops_per_step": 300,
    "host_overhead_op_p50_us": 20.0,
    "memory_bound": 0.50,
    "compute_efficiency_busy": 0.80,
    "compute_efficiency_matmul": 0.50,
    "profiler_artefact_step_ratio": 3.0,
    "op_efficiency_share": 0.10,
    "op_efficiency_peak": 0.50,
    "op_efficiency_intensity": 50.0,
    "host_contention": 0.25,
    "host_contention_busy": 0.75,
    "small_micro_batch_passes": 4,
    "small_micro_batch": 0.10,
}
# Walls read from op and kernel times, which other processes on the CPUs inflate.
_OP_LEVEL: frozenset[Wall] = frozenset({"host_overhead", "memory_bound", "compute_efficiency"})
_LOWER: dict[Confidence, Confidence] = {"high": "medium", "medium": "low", "low": "low"}
_WEIGHT: dict[Confidence, float] = {"high": 1.0, "medium": 0.7, "low": 0.4}

_PLAYBOOK: dict[Wall, tuple[str, str]] = {
    "input_pipeline": (
        "DataLoader num_workers > 0 with prefetch_factor and persistent_workers (or move per-sample Python "
        "decoding out of __getitem__: cache, vectorize, pre-decode)",
        "sample coverage and order (audit_samples), host memory per worker, identical inputs (compare_tensors "
        "on a batch)",
    ),
    "evaluation_in_step": (
        "run the no-grad pass (validation, metrics) every N steps or outside the timed loop",
        "required observability: the metric is still produced at the needed cadence; keep it out of "
        "throughput windows, not out of the job",
    ),
    "synchronization": (
        "drop the per-step/per-element .item()/bool()/nonzero calls: accumulate on device, fetch once per "
        "log interval",
        "required observability (logged values unchanged at the log interval), numerics of the accumulated "
        "value",
    ),
    "exposed_communication": (
        "overlap and bucket gradient communication: DDP bucket_cap_mb / gradient_as_bucket_view, no_sync() "
        "across accumulation micro-steps, fewer larger all-reduces",
        "version-specific API behaviour, global batch and loss scaling unchanged, all ranks run the same "
        "schedule (compare_tensors on gradients after one step)",
    ),
    "rank_imbalance": (
        "remove the slow rank's extra work (see its own findings): balance shards or sequence lengths, "
        "rank-0-only logging/checkpointing off the step, CPU affinity per rank",
        "all-rank behaviour and global batch unchanged; audit_samples for sharding changes",
    ),
    "host_overhead": (
        "replace per-sample / per-element Python loops with batched tensor ops; then torch.compile or CUDA "
        "graphs for launch-bound steps",
        "forward/backward/update parity (compare_tensors), warm-up and recompilation excluded from windows, "
        "graph breaks",
    ),
    "memory_bound": (
        "fuse elementwise chains (torch.compile), avoid layout copies and redundant casts, larger "
        "contiguous transfers with pinned memory",
        "forward/backward/update parity, warm-up excluded, actual overlap of async copies",
    ),
    "compute_efficiency": (
        "measure MFU first (estimate_flops + compute_mfu); then precision (bf16/TF32), shape alignment, "
        "fused attention or compile",
        "numerics within the declared tolerance (compare_tensors), same model FLOPs per step",
    ),
    "host_contention": (
        "stop or move the other processes named in the figures (or pin the job and them to disjoint CPUs: "
        "taskset / torch.set_num_threads to the free cores), then profile again before trusting op-level "
        "findings",
        "the same host state for baseline and candidate: a benchmark window taken under contention is not "
        "comparable with one taken without it (collect_env before both)",
    ),
    "small_micro_batch": (
        "run the accumulated micro-batches as one larger batch (or fewer, larger micro-batches): the same "
        "global batch per optimizer step with fewer forward/backward calls",
        "same global batch per optimizer step (micro-batch x accumulation unchanged) and loss scaling; "
        "numerics change by reduction order only (compare_tensors on gradients after one step); the larger "
        "batch's activation memory fits",
    ),
    "profiler_artefact": (
        "capture again with a longer schedule (profile_segment warmup >= 1, active >= 3) before deciding",
        "the same steps are compared: profiled step times are never throughput (run_benchmark_window)",
    ),
}


def _finding(
    wall: Wall,
    rank: int | None,
    step_us: float,
    at_stake: float,
    summary: str,
    figures: dict[str, float],
    events: Sequence[str],
    confidence: Confidence,
    reason: str,
    code: Sequence[CodeSite] = (),
) -> Finding:
    at_stake = max(0.0, min(at_stake, step_us)) if step_us > 0 else max(at_stake, 0.0)
    candidate, guard = _PLAYBOOK[wall]
    return Finding(
        code=list(code),
        wall=wall,
        rank=rank,
        summary=summary,
        figures={k: round(v, 4) for k, v in figures.items()},
        events=list(events)[:5],
        time_at_stake_us=at_stake,
        share_of_step=at_stake / step_us if step_us > 0 else 0.0,
        candidate=candidate,
        guard=guard,
        confidence=confidence,
        confidence_reason=reason,
    )


def _step_us(p: RankProfile) -> float:
    if p.host is not None and p.host.step_us > 0:
        return p.host.step_us
    if p.steps is not None and p.steps.mean_us > 0:
        return p.steps.mean_us
    return p.span_us


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def _rank_findings(p: RankProfile, comm_floor_us: float | None) -> list[Finding]:
    out: list[Finding] = []
    step = _step_us(p)
    if step <= 0:
        return out
    per_step = p.steps.count if p.steps is not None and p.steps.count else 1
    host = p.host
    phase = {ph.phase: ph for ph in host.phases} if host is not None else {}
    dev = p.span_us > 0

    def share(us: float) -> float:
        return us / step

    view = p.code
    hint = f" ({STACK_HINT})" if view is not None and not view.stacks else ""

    def sites(ph: str) -> list[CodeSite]:
        return view.phases.get(ph, []) if view is not None else []

    if "data_loading" in phase and share(phase["data_loading"].per_step_us) >= THRESHOLDS["input_pipeline"]:
        ph = phase["data_loading"]
        code = sites("data_loading")
        out.append(
            _finding(
                "input_pipeline", p.rank, step, ph.per_step_us,
                f"rank {p.rank}: {_ms(ph.per_step_us)} of a {_ms(step)} step ({ph.share:.0%}) waits in the DataLoader"
                + (f", {code[0].share:.0%} of it in {code[0].label}" if code else hint),
                {"data_loading_us_per_step": ph.per_step_us, "step_us": step, "share": ph.share},
                ph.top_events, "high", "torch's own DataLoader annotation covers this time", code,
            )
        )  # fmt: skip
    # With stacks, the no-grad call's own time (its Python included) bounds the pass better than its ops.
    no_grad_us = max(
        phase["no_grad"].per_step_us if "no_grad" in phase else 0.0,
        (view.no_grad_call_us_per_step or 0.0) if view is not None else 0.0,
    )
    if "no_grad" in phase and share(no_grad_us) >= THRESHOLDS["evaluation_in_step"]:
        ph = phase["no_grad"]
        code = sites("no_grad")
        model_ops = [
            e for e in ph.top_events if any(k in e for k in ("linear", "addmm", "conv", "matmul", "mm"))
        ]
        out.append(
            _finding(
                "evaluation_in_step", p.rank, step, no_grad_us,
                f"rank {p.rank}: {_where(code)}{_ms(no_grad_us)} per step ({share(no_grad_us):.0%}) runs with grad "
                "mode off (an evaluation or other no-grad pass inside the step)" + ("" if code else hint),
                {"no_grad_us_per_step": ph.per_step_us, "no_grad_call_us_per_step": no_grad_us, "step_us": step,
                 "share": share(no_grad_us)},
                ph.top_events, "high" if model_ops else "medium",
                "ops recorded without an autograd sequence number"
                + (", model ops among them" if model_ops else "; no model op among the heaviest, check them"),
                code,
            )
        )  # fmt: skip
    # The wall is the time the host waits in the sync calls themselves (the union of their intervals),
    # never the span from the first to the last: the work between them is the step's own.
    host_sync_per_step = p.sync.host_sync_us / per_step
    wait_us = host.sync_wait_us_per_step if host is not None else host_sync_per_step
    if host is not None and host.implicit_syncs_per_step >= 1:
        if share(wait_us) >= THRESHOLDS["synchronization"]:
            out.append(
                _finding(
                    "synchronization", p.rank, step, wait_us,
                    f"rank {p.rank}: {_where(sites('sync'))}{host.implicit_syncs_per_step:g} implicit syncs "
                    f"(.item()/nonzero) per step wait {_ms(wait_us)} per step ({share(wait_us):.0%})"
                    + ("" if sites("sync") else hint),
                    {"implicit_syncs_per_step": host.implicit_syncs_per_step, "sync_wait_us_per_step": wait_us,
                     "step_us": step},
                    phase["sync"].top_events if "sync" in phase else ["aten::_local_scalar_dense"],
                    "high" if dev else "medium",
                    "the sync calls' own time (each waits for a device value)" if dev else
                    "CPU-only trace: the sync calls' own time, with no device queue to drain; on an "
                    "accelerator each call also waits for the work queued before it",
                    sites("sync"),
                )
            )  # fmt: skip
    elif share(wait_us) >= THRESHOLDS["synchronization"] and p.sync.host_sync_calls:
        names = [c.name for c in p.sync.calls[:3]]
        out.append(
            _finding(
                "synchronization", p.rank, step, wait_us,
                f"rank {p.rank}: {_ms(wait_us)} per step ({share(wait_us):.0%}) in blocking host "
                "synchronization calls",
                {"sync_wait_us_per_step": wait_us, "host_sync_calls": p.sync.host_sync_calls},
                names, "high", "blocking runtime sync calls on the host timeline, their own time",
            )
        )  # fmt: skip
    wait = _collective_wait(p)
    if wait > 0:
        exposed = wait if comm_floor_us is None else min(wait, comm_floor_us)
        if share(exposed) >= THRESHOLDS["exposed_communication"]:
            events = phase["collectives"].top_events if "collectives" in phase else []
            if not events:
                events = [c.category for c in p.categories if c.kind == "communication"][:1]
            out.append(
                _finding(
                    "exposed_communication", p.rank, step, exposed,
                    f"rank {p.rank}: {_ms(exposed)} per step ({share(exposed):.0%}) waits for communication "
                    "not hidden by compute" + ("" if comm_floor_us is None else " (the least any rank waits)"),
                    {"collective_wait_us_per_step": wait, "exposed_us_per_step": exposed, "step_us": step},
                    events, "high",
                    "collective calls on the timeline with no computing op underneath"
                    if not dev else "communication kernels not overlapped with compute kernels",
                )
            )  # fmt: skip
    if host is not None and host.top_level_op_p50_us is not None:
        other = phase["other"].per_step_us if "other" in phase else 0.0
        many = host.top_level_ops_per_step >= THRESHOLDS["host_overhead_ops_per_step"]
        tiny = host.top_level_op_p50_us < THRESHOLDS["host_overhead_op_p50_us"]
        at_stake = host.short_top_level_op_us_per_step + other
        if many and tiny and share(at_stake) >= THRESHOLDS["host_overhead"] and not dev:
            loop = _tiny_loop(view)
            code = _loop_site(loop, at_stake)
            code += [
                c
                for c in (view.short_ops if view is not None else [])
                if not code or c.label != code[0].label
            ]
            out.append(
                _finding(
                    "host_overhead", p.rank, step, at_stake,
                    f"rank {p.rank}: {_loop_text(loop, code)}{host.top_level_ops_per_step:g} top-level ops per step, "
                    f"median {host.top_level_op_p50_us:.1f} us; {_ms(at_stake)} per step in tiny ops and the Python "
                    "between them" + ("" if code else hint),
                    {"top_level_ops_per_step": host.top_level_ops_per_step,
                     "top_level_op_p50_us": host.top_level_op_p50_us,
                     "short_op_us_per_step": host.short_top_level_op_us_per_step, "uncovered_us_per_step": other}
                    | ({"loop_iterations_per_step": loop.iterations, "loop_ops_per_iteration": loop.ops_per_iteration}
                       if loop is not None else {}),
                    [o.name for o in p.top_self_ops[:3]], "medium",
                    "op counts and durations; the Python time between ops is not recorded, only its gaps",
                    code[:_TOP_SITES],
                )
            )  # fmt: skip
        passes = view.backward_passes_per_step if view is not None else None
        samples = view.samples_per_step if view is not None else None
        if passes is not None and passes >= THRESHOLDS["small_micro_batch_passes"]:
            overhead = (1.0 - 1.0 / passes) * at_stake
            if share(at_stake) >= THRESHOLDS["small_micro_batch"]:
                code = [view.backward_site] if view is not None and view.backward_site is not None else []
                # The model each pass runs: the forward owner with a module.
                code += [c for c in sites("forward") if c.module is not None][:1]
                out.append(
                    _finding(
                        "small_micro_batch", p.rank, step, overhead,
                        f"rank {p.rank}: {_where(code)}{passes:g} backward() passes"
                        + (f" of {samples / passes:g} sample(s)" if samples else "")
                        + " per optimizer step, "
                        f"{host.top_level_ops_per_step:g} top-level ops per step (median "
                        f"{host.top_level_op_p50_us:.1f} us): the same global batch as one pass would cut the "
                        "per-call overhead" + ("" if code else hint),
                        {"backward_passes_per_step": passes, "tiny_op_and_gap_us_per_step": at_stake,
                         "step_us": step}
                        | ({"samples_per_step": samples, "micro_batch": samples / passes} if samples else {}),
                        [o.name for o in p.top_self_ops[:3]], "medium",
                        "backward passes counted as runs of autograd nodes between forward ops; the bound is "
                        "the time in tiny ops and gaps all passes but one would no longer spend",
                        code,
                    )
                )  # fmt: skip
    if dev and p.idle is not None and p.span_us > 0:
        host_wait = p.idle.host_wait_us / per_step
        launch_loop = _tiny_loop(view)
        launch_code = _loop_site(launch_loop, host_wait)
        launch_code += [c for c in (view.short_ops if view is not None else []) if c not in launch_code]
        launch_code = launch_code[:_TOP_SITES]
        if p.idle.host_wait_us / p.span_us >= THRESHOLDS["host_overhead"]:
            out.append(
                _finding(
                    "host_overhead", p.rank, step, host_wait,
                    f"rank {p.rank}: {_loop_text(_tiny_loop(view), launch_code)}the device idles "
                    f"{_ms(host_wait)} per step waiting for launches ({p.idle.host_wait_us / p.span_us:.0%} of its "
                    f"span); {p.idle.host_bound_steps} of {p.idle.steps_checked} steps host-bound"
                    + ("" if launch_code else hint),
                    {"host_wait_us_per_step": host_wait, "idle_fraction": p.idle_fraction or 0.0,
                     "launches_per_step": p.launch.launches_per_step or 0.0},
                    [o.name for o in p.top_self_ops[:3]], "high",
                    "idle gaps ended by kernels whose launch call started after the device went idle",
                    launch_code,
                )
            )  # fmt: skip
    if dev:
        device_total = sum(c.total_us for c in p.categories) or 1.0
        mem = sum(
            c.total_us
            for c in p.categories
            if c.kind == "memory" or c.category in ("elementwise", "reduction")
        )
        # The time those kernels run (the union of their intervals), not busy time scaled by their share.
        at_stake = p.memory_like_us / per_step
        if (
            mem / device_total >= THRESHOLDS["memory_bound"]
            and share(at_stake) >= THRESHOLDS["host_overhead"]
        ):
            out.append(
                _finding(
                    "memory_bound", p.rank, step, at_stake,
                    f"rank {p.rank}: copies and elementwise/reduction kernels take {mem / device_total:.0%} of "
                    "device time",
                    {"memory_like_share": mem / device_total, "busy_us_per_step": p.busy_us / per_step},
                    [k.name[:80] for k in p.top_kernels if k.category in ("elementwise", "reduction")][:3]
                    or [c.category for c in p.categories if c.kind == "memory"][:3],
                    "medium", "kernel categories from names; bytes moved are not in the trace",
                )
            )  # fmt: skip
        matmul = sum(c.total_us for c in p.categories if c.category in ("gemm", "convolution", "attention"))
        if (p.compute_fraction or 0) >= THRESHOLDS["compute_efficiency_busy"] and (
            matmul / device_total >= THRESHOLDS["compute_efficiency_matmul"]
        ):
            out.append(
                _finding(
                    "compute_efficiency", p.rank, step, p.compute_us / per_step,
                    f"rank {p.rank}: compute covers {p.compute_fraction:.0%} of the device span, GEMM/conv/"
                    f"attention {matmul / device_total:.0%} of device time: compute-bound, efficiency unknown "
                    "until MFU is measured",
                    {"compute_fraction": p.compute_fraction or 0.0, "matmul_share": matmul / device_total},
                    [k.name[:80] for k in p.top_kernels[:3]], "low",
                    "the bound is the whole compute time; only MFU says how much of it is recoverable",
                )
            )  # fmt: skip
    out.extend(_op_efficiency_findings(p, step, per_step))
    if p.steps is not None:
        in_window = [s.duration_us for s in p.steps.steps if s.in_window]
        ratio = p.steps.max_us / p.steps.p50_us if p.steps.p50_us > 0 else 1.0
        if len(in_window) < 2 or ratio >= THRESHOLDS["profiler_artefact_step_ratio"]:
            at_stake = p.steps.max_us - p.steps.p50_us
            out.append(
                _finding(
                    "profiler_artefact", p.rank, step, at_stake,
                    f"rank {p.rank}: {len(in_window)} step(s) in the window; slowest step {ratio:.1f}x the median",
                    {"steps_in_window": len(in_window), "max_over_median": ratio},
                    [], "medium", "too few or too uneven steps to tell a steady wall from a one-off",
                )
            )  # fmt: skip
    return out


_TOP_SITES = 3


def _where(code: Sequence[CodeSite]) -> str:
    """The lead of a summary that names its code: ``Module.func (file:line), called from ...: ``."""
    if not code:
        return ""
    c = code[0]
    called = f", called from {c.call_site}" if c.call_site else ""
    return f"{c.label}{called}: "


def _tiny_loop(view: CodeView | None) -> OpLoop | None:
    """The loop of tiny ops with the most time (not a loop's gradient side, which backward() runs)."""
    if view is None:
        return None
    loops = [
        lp for lp in view.loops if not lp.backward and lp.op_p50_us < THRESHOLDS["host_overhead_op_p50_us"]
    ]
    return max(loops, key=lambda lp: lp.us_per_step, default=None)


def _loop_text(loop: OpLoop | None, code: Sequence[CodeSite]) -> str:
    if loop is None:
        return _where(code)
    where = f"{code[0].label}: " if code else ""
    body = loop.ops_per_iteration
    ops = ", ".join(loop.ops[:3]) + (", ..." if len(loop.ops) > 3 or body > len(loop.ops[:3]) else "")
    return (
        f"{where}a Python loop of {loop.iterations:g} iterations of {body} op{'s' if body > 1 else ''} "
        f"({ops}) per step, {_ms(loop.us_per_step)}; "
    )


def _op_efficiency_findings(p: RankProfile, step: float, per_step: int) -> list[Finding]:
    eff = p.op_efficiency
    if eff is None:
        return []
    out: list[Finding] = []
    rows = [o for o in eff.ops if o.kind != "copy" and o.peak_tflops and o.time_us > 0]
    low = THRESHOLDS["op_efficiency_intensity"]
    groups: list[tuple[Wall, list[OpEfficiency]]] = [
        ("memory_bound", [o for o in rows if (o.intensity or 0.0) < low]),
        ("compute_efficiency", [o for o in rows if (o.intensity or 0.0) >= low]),
    ]
    for wall, group in groups:
        t = sum(o.time_us for o in group)
        if not group or t / per_step / step < THRESHOLDS["op_efficiency_share"]:
            continue
        ideal = sum(o.flops / (o.peak_tflops or 1.0) / 1e6 for o in group)
        achieved = sum(o.flops for o in group) / t / 1e6
        peak_mix = sum(o.flops for o in group) / ideal / 1e6 if ideal > 0 else 0.0
        if peak_mix <= 0 or achieved / peak_mix >= THRESHOLDS["op_efficiency_peak"]:
            continue
        worst = sorted(group, key=lambda o: -(o.time_us - o.flops / (o.peak_tflops or 1.0) / 1e6))
        names = [
            f"{o.op} {o.precision} {o.achieved_tflops or 0:.1f}/{o.peak_tflops:g} TFLOP/s" for o in worst[:3]
        ]
        kind = (
            "small-operand GEMM/attention (under {low:g} FLOPs/byte): memory-bound"
            if wall == "memory_bound"
            else "GEMM/attention with enough arithmetic intensity: compute-bound but inefficient"
        ).format(low=low)
        out.append(
            _finding(
                wall, p.rank, step, (t - ideal) / per_step,
                f"rank {p.rank}: {kind}, {achieved:.1f} TFLOP/s achieved of {peak_mix:.0f} peak "
                f"({achieved / peak_mix:.0%}) over {_ms(t / per_step)} per step",
                {"achieved_tflops": achieved, "peak_tflops": peak_mix, "time_us_per_step": t / per_step,
                 "ideal_us_per_step": ideal / per_step},
                names, "medium",
                "FLOPs from recorded shapes over the device time of the kernels each op launched; the peak is "
                "the device's dense figure (fp32 ops may run as TF32 and beat the fp32 peak)",
            )
        )  # fmt: skip
    return out


def _collective_wait(p: RankProfile) -> float:
    from perfgate.traces.analyses.steps import collective_wait_us

    return collective_wait_us(p)


def diagnose(ranks: Sequence[RankProfile], skew: RankSkew | None) -> list[Finding]:
    """Ranked findings for a set of per-rank profiles (see the module docstring)."""
    floor: float | None = None
    if len(ranks) > 1:
        floor = min(_collective_wait(p) for p in ranks)
    findings: list[Finding] = []
    for p in ranks:
        findings.extend(_rank_findings(p, floor))
    if skew is not None and skew.busy_spread_us is not None and skew.per_rank_mean_step_us:
        mean_step = sum(m.mean_step_us for m in skew.per_rank_mean_step_us) / len(skew.per_rank_mean_step_us)
        if mean_step > 0 and skew.busy_spread_us / mean_step >= THRESHOLDS["rank_imbalance"]:
            slow = skew.slowest_rank
            per = {f"busy_us_rank{m.rank}": m.busy_us for m in skew.per_rank_mean_step_us}
            per |= {f"wait_us_rank{m.rank}": m.collective_wait_us for m in skew.per_rank_mean_step_us}
            fast = min(skew.per_rank_mean_step_us, key=lambda m: m.busy_us)
            findings.append(
                _finding(
                    "rank_imbalance", slow, mean_step, skew.busy_spread_us,
                    f"rank {slow} is busy {_ms(skew.busy_spread_us)} per step longer than rank {fast.rank}, "
                    f"which waits for it in collectives ({skew.busy_spread_us / mean_step:.0%} of the step)",
                    per, [], "high" if skew.common_steps >= 2 else "medium",
                    "busy time = step time minus collective wait beyond the least-waiting rank"
                    + ("" if skew.common_steps >= 2 else "; ranks share fewer than 2 step numbers"),
                )
            )  # fmt: skip
    contention = _host_contention(ranks)
    if contention is not None:
        for i, f in enumerate(findings):
            if f.wall in _OP_LEVEL:
                findings[i] = f.model_copy(
                    update={
                        "confidence": _LOWER[f.confidence],
                        "confidence_reason": f.confidence_reason
                        + f"; captured while other processes used {contention.figures['other_cpus']:g} of "
                        f"{contention.figures['cpus']:g} CPUs: op times are inflated",
                    }
                )
        findings.append(contention)
    # One finding per wall and rank: the larger one is kept.
    best: dict[tuple[str, int | None], Finding] = {}
    for f in findings:
        key = (f.wall, f.rank)
        if key not in best or f.time_at_stake_us > best[key].time_at_stake_us:
            best[key] = f
    ranked = sorted(best.values(), key=lambda f: -f.time_at_stake_us * _WEIGHT[f.confidence])
    if contention is not None:
        # Contention outranks the op-level findings it distorts.
        at = next(i for i, f in enumerate(ranked) if f.wall == "host_contention")
        first_op = next((i for i, f in enumerate(ranked) if f.wall in _OP_LEVEL), at)
        if first_op < at:
            ranked.insert(first_op, ranked.pop(at))
    return ranked


def _loop_site(loop: OpLoop | None, at_stake_us: float) -> list[CodeSite]:
    """The code that owns ``loop``, with the loop's time per step and its share of the finding's time."""
    if loop is None or loop.owner is None:
        return []
    share = min(1.0, loop.us_per_step / at_stake_us) if at_stake_us > 0 else 0.0
    return [loop.owner.model_copy(update={"us_per_step": loop.us_per_step, "share": share})]


def _host_contention(ranks: Sequence[RankProfile]) -> Finding | None:
    """One finding for the host (all ranks of a run share it), from the most contended measurement."""
    loads = [p.host_load for p in ranks if p.host_load.measured]
    if not loads:
        return None
    load = max(loads, key=lambda h: h.other_share or 0.0)
    cpus, other, job = load.cpus or 0, load.other_cpus or 0.0, load.job_cpus or 0.0
    share = load.other_share or 0.0
    if cpus <= 0 or share < THRESHOLDS["host_contention"]:
        return None
    if (other + job) / cpus < THRESHOLDS["host_contention_busy"]:
        return None
    steps = [_step_us(q) for q in ranks]
    step = sum(steps) / len(steps)
    names = [f"{o.name} (pid {o.pid}, {o.cpus:g} CPUs)" for o in load.top_other]
    figures = {"other_cpus": other, "cpus": float(cpus), "other_share": share, "job_cpus": job}
    if load.load_avg_1m is not None:
        figures["load_avg_1m"] = load.load_avg_1m
    return _finding(
        "host_contention", None, step, step * share,
        f"other processes used {other:.2f} of the job's {cpus} CPUs ({share:.0%}) during the capture"
        + (f", most {names[0]}" if names else ""),
        figures, names, "medium",
        "measured from /proc over the whole launch (start-up included), not per step; intra-op threads that "
        "wait for each other can lose more than this share",
    )  # fmt: skip
