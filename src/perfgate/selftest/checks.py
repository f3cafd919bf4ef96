"""The selftest's judgements: pure functions from what the tools recorded to pass / fail / unavailable.

Every check names the figure it measured and the figure it compares against. Inputs are the plain
JSON the tools and the selftest job wrote (harness rank records, tool outputs, ``facts.json``), so the
device-side logic is testable without a device; on a real run nothing here invents a value.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

__all__ = [
    "MATMUL_MIN_UTILIZATION",
    "MEMORY_SLACK_BYTES",
    "PROFILE_STEP_RATIO",
    "STEP_ATOL_MS",
    "STEP_MEDIAN_ATOL_MS",
    "STEP_MEDIAN_RTOL",
    "STEP_RTOL",
    "Check",
    "Status",
    "environment_check",
    "matmul_check",
    "memory_check",
    "parity_check",
    "profile_check",
    "step_time_check",
    "window_steps_ms",
]

Status = Literal["pass", "fail", "unavailable"]

# Step times: the window's figure and the job's own synchronized wall clock over the same steps.
STEP_RTOL = 0.05
"""Total over the compared steps: |window - wall| <= STEP_RTOL * wall + STEP_ATOL_MS."""
STEP_ATOL_MS = 2.0
STEP_MEDIAN_RTOL = 0.05
"""Per step: median |window step - wall step| <= STEP_MEDIAN_RTOL * median wall step + STEP_MEDIAN_ATOL_MS.
A window shifted by one step, or events that miss part of a step, fail this on any uneven step series."""
STEP_MEDIAN_ATOL_MS = 0.1

MEMORY_SLACK_BYTES = 96 * 1024 * 1024
"""Allowed above the known allocations: allocator rounding, library workspaces (cuBLAS, ...)."""

MATMUL_MIN_UTILIZATION = 0.05
"""A large bf16 matmul reaches far more than 5% of a correct dense peak; below it the peak or the
device naming is suspect. Above 100% is refused by compute_mfu itself."""

PROFILE_STEP_RATIO = (0.5, 4.0)
"""The fastest profiled step must lie between 0.5 x the window's fastest step and 4 x its slowest: the
profiler adds overhead and never removes work, and a unit or step-boundary slip lands far outside."""
BREAKDOWN_RTOL = 0.01
"""idle + compute + non-compute must add up to the span."""


def items(value: object) -> list[dict[str, Any]]:
    """The JSON objects in a list (anything else, or a missing list, gives none)."""
    if not isinstance(value, list):
        return []
    return [cast("dict[str, Any]", v) for v in cast("list[object]", value) if isinstance(v, dict)]


def obj(value: object) -> dict[str, Any]:
    """A JSON object, or an empty one."""
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}


def strings(value: object) -> list[str]:
    return [str(v) for v in cast("list[object]", value)] if isinstance(value, list) else []


@dataclass
class Check:
    """One line of the report and one entry of the ledger record."""

    name: str
    status: Status
    figure: str = ""
    against: str = ""
    reason: str | None = None
    values: dict[str, Any] = field(default_factory=dict[str, Any])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ms(ns: float) -> float:
    return ns / 1e6


def step_time_check(record: Mapping[str, Any], clock: Mapping[str, Any]) -> Check:
    """The harness window's step times against the job's synchronized wall clock, same steps.

    ``record`` is the harness rank record (rank 0, first window); ``clock`` holds ``stamps_ns``: the
    job's host clock before step 0 and after each step, each taken right after synchronizing the device.
    The window's last step ends inside the harness (which writes its record before stopping the job),
    so the comparison covers the window's steps but its last.
    """
    windows = items(record.get("windows"))
    if not windows:
        return Check("step_time", "fail", reason="the harness record holds no measured window")
    w = windows[0]
    first, last = int(w["first_step"]), int(w["last_step"])
    stamps = [int(v) for v in cast("list[int]", clock.get("stamps_ns") or [])]
    if len(stamps) < last + 1 or last - first < 2:
        return Check(
            "step_time",
            "fail",
            reason=f"the job's clock has {len(stamps)} stamps; steps {first}..{last} need {last + 1}",
        )
    steps = range(first, last)  # the last step ends inside the harness's own record write
    wall = [_ms(stamps[i + 1] - stamps[i]) for i in steps]
    device_ms = cast("list[float] | None", w.get("device_step_ms"))
    if device_ms:
        source = "device events"
        window = [float(v) for v in device_ms[: len(wall)]]
    else:
        source = "host clock"
        step_ns = [int(v) for v in cast("list[int]", obj(record.get("steps")).get("step_time_ns") or [])]
        window = [_ms(step_ns[i]) for i in steps]
    total_window, total_wall = sum(window), sum(wall)
    diff = abs(total_window - total_wall)
    allowed = STEP_RTOL * total_wall + STEP_ATOL_MS
    per_step = statistics.median(abs(a - b) for a, b in zip(window, wall, strict=True))
    median_wall = statistics.median(wall)
    per_step_allowed = STEP_MEDIAN_RTOL * median_wall + STEP_MEDIAN_ATOL_MS
    ok = diff <= allowed and per_step <= per_step_allowed
    kind = str(obj(record.get("device")).get("kind") or "cpu")
    note = None
    if source == "host clock":
        note = f"{kind}: no device timing events, so the harness's host clock is what is checked"
    values = {
        "source": source,
        "steps_compared": len(wall),
        "window_total_ms": total_window,
        "wall_total_ms": total_wall,
        "total_diff_ms": diff,
        "total_allowed_ms": allowed,
        "median_step_diff_ms": per_step,
        "median_step_allowed_ms": per_step_allowed,
        "median_wall_step_ms": median_wall,
        "window_elapsed_ms": _ms(float(w["elapsed_ns"])),
        "device_elapsed_ms": w.get("device_elapsed_ms"),
    }
    return Check(
        "step_time",
        "pass" if ok else "fail",
        figure=f"window ({source}) {total_window:.2f} ms over {len(wall)} steps",
        against=f"synchronized wall clock {total_wall:.2f} ms (|diff| {diff:.2f} <= {allowed:.2f} ms; "
        f"median step diff {per_step:.3f} <= {per_step_allowed:.3f} ms)",
        reason=None if ok else "the window's step times disagree with the wall clock beyond the tolerance",
        values={**values, "note": note},
    )


def window_steps_ms(record: Mapping[str, Any]) -> list[float]:
    """The first window's per-step times (device events where recorded, else the host clock), ms."""
    windows = items(record.get("windows"))
    if not windows:
        return []
    w = windows[0]
    device_ms = cast("list[float] | None", w.get("device_step_ms"))
    if device_ms:
        return [float(v) for v in device_ms]
    step_ns = cast("list[int]", obj(record.get("steps")).get("step_time_ns") or [])
    first, last = int(w["first_step"]), int(w["last_step"])
    return [_ms(step_ns[i]) for i in range(first, min(last + 1, len(step_ns)))]


def memory_check(rank: Mapping[str, Any], clock: Mapping[str, Any], kind: str) -> Check:
    """Peak allocated / reserved memory against the job's known allocations (ballast + model).

    ``rank`` is run_benchmark_window's ``ranks[0]``.
    """
    allocated = rank.get("peak_allocated_bytes")
    reserved = rank.get("peak_reserved_bytes")
    ballast = int(clock.get("ballast_bytes", 0))
    if allocated is None:
        rss = rank.get("host_peak_rss_bytes")
        shown = "unknown" if rss is None else f"{rss / 2**20:.0f} MiB"
        return Check(
            "memory",
            "unavailable",
            figure=f"host peak RSS {shown}",
            against=f"ballast {ballast / 2**20:.0f} MiB (not comparable with RSS)",
            reason=f"{kind}: torch keeps no allocator peak for host memory; only the process RSS is known",
            values={"host_peak_rss_bytes": rss},
        )
    params = int(clock.get("param_bytes", 0))
    activations = int(clock.get("activation_bytes", 0))
    floor = ballast
    ceiling = ballast + 4 * params + 4 * activations + MEMORY_SLACK_BYTES
    problems: list[str] = []
    if allocated < floor:
        problems.append(f"peak allocated {allocated} B is below the live ballast {ballast} B")
    if allocated > ceiling:
        problems.append(f"peak allocated {allocated} B exceeds everything the job allocates ({ceiling} B)")
    if reserved is None:
        problems.append("peak reserved was not reported")
    elif reserved < allocated:
        problems.append(f"peak reserved {reserved} B is below peak allocated {allocated} B")
    return Check(
        "memory",
        "fail" if problems else "pass",
        figure=f"peak allocated {allocated / 2**20:.1f} MiB, reserved "
        + ("?" if reserved is None else f"{reserved / 2**20:.1f} MiB"),
        against=f"known allocations {floor / 2**20:.1f}..{ceiling / 2**20:.1f} MiB "
        f"(ballast {ballast / 2**20:.0f} MiB + params/grads/momentum/activations + "
        f"{MEMORY_SLACK_BYTES // 2**20} MiB slack); reserved >= allocated",
        reason="; ".join(problems) or None,
        values={
            "peak_allocated_bytes": allocated,
            "peak_reserved_bytes": reserved,
            "floor_bytes": floor,
            "ceiling_bytes": ceiling,
        },
    )


def matmul_check(
    spec: Mapping[str, Any],
    median_step_ms: float | None,
    mfu: Mapping[str, Any] | None,
    refusal: str | None,
    device_name: str,
) -> Check:
    """Measured TFLOP/s of the known-FLOP loop, and utilization against the peak table's entry.

    ``mfu`` is compute_mfu's output; ``refusal`` its error text when it refused (no peak in the table).
    """
    if median_step_ms is None or median_step_ms <= 0:
        return Check("matmul", "fail", reason="the matmul window measured no step time")
    flops = float(spec["flops_per_step"])
    tflops = flops / (median_step_ms / 1e3) / 1e12
    precision = str(spec["dtype"])
    figure = (
        f"{tflops:.4g} TFLOP/s {precision} ({spec['reps']} x {spec['n']}^3 matmuls per step, "
        f"median step {median_step_ms:.3f} ms)"
    )
    values: dict[str, Any] = {"measured_tflops": tflops, "flops_per_step": flops, "precision": precision}
    if mfu is None:
        return Check(
            "matmul",
            "unavailable",
            figure=figure,
            against=f"no peak for {device_name!r} {precision}",
            reason=f"compute_mfu has no peak to compare with: {refusal or 'not called'}",
            values=values,
        )
    peak = float(mfu["peak_tflops"])
    util = mfu.get("utilization")
    values.update({"peak_tflops": peak, "peak_source": mfu.get("peak_source"), "utilization": util})
    against = f"peak {peak:g} TFLOP/s ({mfu.get('peak_source')})"
    if util is None:
        return Check(
            "matmul",
            "fail",
            figure=figure,
            against=against,
            reason=str(mfu.get("utilization_reason") or "utilization could not be computed"),
            values=values,
        )
    ok = MATMUL_MIN_UTILIZATION <= float(util) <= 1.0
    return Check(
        "matmul",
        "pass" if ok else "fail",
        figure=f"{figure}: utilization {float(util):.1%}",
        against=f"{against}; plausible {MATMUL_MIN_UTILIZATION:.0%}..100%",
        reason=None
        if ok
        else f"utilization {float(util):.1%} is implausibly low: the table's peak for {device_name!r} or the "
        "device naming is suspect",
        values=values,
    )


def _categories(rank: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in items(rank.get("categories")):
        out[str(c["category"])] = out.get(str(c["category"]), 0) + int(c["count"])
    return out


def profile_check(
    profile: Mapping[str, Any], window_steps_ms: list[float] | None, kind: str, world: int
) -> Check:
    """Device kernels, memcpy and (2+ ranks) a collective in the captured trace; the temporal breakdown
    adds up and the profiled step time is consistent with the window's. On the host: CPU ops present."""
    ranks = items(profile.get("ranks"))
    if profile.get("state") == "failed" or not ranks:
        return Check(
            "profile", "fail", reason=str(profile.get("failure_reason") or "the capture produced no trace")
        )
    rank = ranks[0]
    problems: list[str] = []
    found: list[str] = []
    cats = _categories(rank)
    values: dict[str, Any] = {"categories": cats, "ranks": len(ranks)}
    if kind != "cpu":
        compute = sum(n for c, n in cats.items() if c not in _NON_COMPUTE)
        memcpy = sum(n for c, n in cats.items() if c.startswith("memcpy"))
        found.append(f"{compute} compute kernels, {memcpy} copies")
        if compute == 0:
            problems.append("no device kernels in the trace")
        if memcpy == 0:
            problems.append("no memcpy in the trace (the job copies each batch to the device)")
        if world >= 2:
            comm = cats.get("communication", 0)
            found.append(f"{comm} collective kernels on {len(ranks)} ranks")
            if comm == 0:
                problems.append(f"no collective kernel although {world} ranks all-reduce gradients")
            if len(ranks) < world:
                problems.append(f"{len(ranks)} trace(s) for {world} ranks")
        span = float(rank.get("span_us") or 0.0)
        parts = float(rank.get("idle_us", 0.0)) + float(rank.get("compute_us", 0.0))
        parts += float(rank.get("non_compute_us", 0.0))
        values.update({"span_us": span, "idle_compute_noncompute_us": parts})
        if span <= 0 or abs(parts - span) > BREAKDOWN_RTOL * span:
            problems.append(f"idle + compute + non-compute = {parts:.1f} us but the span is {span:.1f} us")
    else:
        ops = {str(o.get("name")) for o in items(rank.get("top_ops"))}
        host_ops = sorted(o for o in ops if o.startswith("aten::"))
        found.append(f"{len(host_ops)} aten ops among the top ops (e.g. {', '.join(host_ops[:3]) or 'none'})")
        if not host_ops:
            problems.append("no aten:: host operators in the trace")
    steps = obj(rank.get("steps"))
    in_window = [float(x["duration_us"]) for x in items(steps.get("steps")) if x.get("in_window")]
    # The fastest profiled step: a preempted step on a busy host says nothing about the measurement.
    step_us = min(in_window) if in_window else steps.get("mean_us")
    against = "the window's step times are unknown"
    if step_us is None:
        problems.append("the trace has no ProfilerStep to compare with the window")
    elif window_steps_ms:
        profiled = float(step_us) / 1e3
        lo_factor, hi_factor = PROFILE_STEP_RATIO
        lo, hi = lo_factor * min(window_steps_ms), hi_factor * max(window_steps_ms)
        median = statistics.median(window_steps_ms)
        values.update({"profiled_step_ms": profiled, "window_median_ms": median, "allowed_ms": [lo, hi]})
        against = (
            f"window steps {min(window_steps_ms):.3f}..{max(window_steps_ms):.3f} ms (median {median:.3f}); "
            f"allowed {lo:.3f}..{hi:.3f} ms ({lo_factor:g} x fastest .. {hi_factor:g} x slowest)"
        )
        if not lo <= profiled <= hi:
            problems.append(f"profiled step {profiled:.3f} ms is outside {lo:.3f}..{hi:.3f} ms")
    figure = "; ".join(found)
    if step_us is not None:
        figure += f"; fastest profiled step {float(step_us) / 1e3:.3f} ms"
    return Check(
        "profile",
        "fail" if problems else "pass",
        figure=figure,
        against=against,
        reason="; ".join(problems) or None,
        values=values,
    )


_NON_COMPUTE = {"communication", "memcpy_h2d", "memcpy_d2h", "memcpy_d2d", "memcpy_other", "memset", "sync"}


def parity_check(
    name: str,
    result: Mapping[str, Any] | None,
    control: Mapping[str, Any] | None,
    unavailable: str | None = None,
) -> Check:
    """compare_tensors between the host reference and the device dump must match; the negative
    control (one element changed) must be reported as a mismatch of exactly that element."""
    if unavailable is not None:
        return Check(name, "unavailable", reason=unavailable)
    if result is None:
        return Check(name, "fail", reason="compare_tensors did not run")
    problems: list[str] = []
    tensors = {str(t.get("key")): t for t in items(result.get("tensors"))}
    if result.get("status") != "match":
        problems.append(f"device vs host: {result.get('summary')}")
    errors = {
        k: (t.get("max_abs_error"), t.get("max_rel_error"), t.get("atol"), t.get("rtol"))
        for k, t in tensors.items()
    }
    figure = "; ".join(
        f"{k}: max abs err {_num(e[0])}, max rel err {_num(e[1])}" for k, e in sorted(errors.items())
    )
    against = "; ".join(f"{k}: atol {e[2]:g}, rtol {e[3]:g}" for k, e in sorted(errors.items()))
    if control is not None:
        ctl = {str(t.get("key")): t for t in items(control.get("tensors"))}
        changed = ctl.get("exact")
        if control.get("status") != "mismatch" or changed is None or changed.get("mismatched") != 1:
            problems.append(
                f"the negative control (one element changed) was not caught: {control.get('summary')}"
            )
        else:
            figure += "; negative control caught (1 element)"
    return Check(
        name,
        "fail" if problems else "pass",
        figure=figure,
        against=against,
        reason="; ".join(problems) or None,
        values={"errors": {k: {"max_abs": e[0], "max_rel": e[1]} for k, e in errors.items()}},
    )


def _num(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.3g}"


def environment_check(env: Mapping[str, Any], facts: Mapping[str, Any]) -> Check:
    """collect_env (its own probe, same interpreter) against what torch reported inside the job."""
    summary = obj(env.get("summary"))
    kind = str(facts.get("backend") or facts["kind"])
    rows: list[tuple[str, Any, Any, bool | None]] = []

    def row(what: str, collected: Any, torch_says: Any, comparable: bool = True) -> None:
        rows.append((what, collected, torch_says, (collected == torch_says) if comparable else None))

    row("backend", summary.get("backend"), kind)
    devices = items(summary.get("devices"))
    row("device count", len(devices), int(facts.get("device_count", 0)))
    row("device names", [d.get("name") for d in devices], strings(facts.get("device_names")))
    row("torch", summary.get("torch_version"), facts.get("torch_version"))
    row("runtime", summary.get("runtime_version"), facts.get("runtime_version"))
    tools = {str(t.get("name")): t for t in items(env.get("system_tools")) if t.get("found")}
    driver_note: str | None = None
    if kind == "cuda":
        smi = tools.get("nvidia-smi") or tools.get("nvml")
        if smi is None or smi.get("runtime_version") is None:
            driver_note = "driver: no nvidia-smi/NVML figure to compare with torch's driver API version"
        elif facts.get("driver_api_version") is None:
            driver_note = (
                f"driver CUDA version {smi.get('runtime_version')} ({smi['name']}): the job could not read "
                "the driver API version (no torch wrapper, libcuda not loadable), so it is not compared"
            )
        else:
            row(
                f"driver CUDA version ({smi['name']})",
                smi.get("runtime_version"),
                facts.get("driver_api_version"),
            )
    elif kind in ("rocm", "musa"):
        driver_note = (
            f"driver {summary.get('driver_version') or 'unknown'} ({summary.get('driver_source') or 'no tool'}): "
            f"torch reports no {kind} driver version to compare with"
        )
    mismatched = [r for r in rows if r[3] is False]
    figure = "; ".join(f"{w} {_short(c)}" for w, c, _, _ in rows)
    against = "torch in the job: " + "; ".join(f"{w} {_short(t)}" for w, _, t, _ in rows)
    reason = None
    if mismatched:
        reason = "; ".join(f"{w}: collect_env {_short(c)} != torch {_short(t)}" for w, c, t, _ in mismatched)
    return Check(
        "environment",
        "fail" if mismatched else "pass",
        figure=figure,
        against=against,
        reason=reason,
        values={
            "compared": [{"item": w, "collect_env": c, "torch": t, "agree": ok} for w, c, t, ok in rows],
            "note": driver_note,
        },
    )


def _short(value: Any) -> str:
    if isinstance(value, list):
        items = [str(v) for v in value]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        if items and len(set(items)) == 1:
            return f"{len(items)} x {items[0]}"
        return "[" + ", ".join(items) + "]"
    return "none" if value is None else str(value)
