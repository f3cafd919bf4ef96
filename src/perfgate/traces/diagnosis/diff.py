"""Diff two profiles (baseline vs candidate): what got faster or slower, per step, and where.

Both sides are sets of per-rank profiles; every figure is normalized per step (the steps of each
rank's analysis window) and averaged over ranks, so a candidate captured with a different number of
steps or ranks still compares. Rows are sorted by the size of the change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from perfgate.security.quoting import file_text
from perfgate.traces.models import DiffRow, Finding, ProfileDiff, RankProfile

__all__ = ["diff_profiles"]

_SHOWN = 10


def _steps(p: RankProfile) -> int:
    if p.host is not None and p.host.steps:
        return p.host.steps
    return p.steps.count if p.steps is not None and p.steps.count else 1


def _step_us(p: RankProfile) -> float:
    if p.host is not None:
        return p.host.step_us
    return p.steps.mean_us if p.steps is not None else p.span_us


def _mean(ranks: Sequence[RankProfile], value: Callable[[RankProfile], dict[str, float]]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for p in ranks:
        for k, v in value(p).items():
            sums[k] += v
    return {k: v / max(len(ranks), 1) for k, v in sums.items()}


def _row(name: str, b: float, c: float) -> DiffRow:
    return DiffRow(name=name, baseline=b, candidate=c, delta=c - b, ratio=c / b if b else None)


def _rows(base: dict[str, float], cand: dict[str, float], keys: Iterable[str] | None = None) -> list[DiffRow]:
    names = list(keys) if keys is not None else sorted(set(base) | set(cand))
    rows = [_row(k, base.get(k, 0.0), cand.get(k, 0.0)) for k in names]
    return sorted(rows, key=lambda r: -abs(r.delta))


def _walls(findings: Sequence[Finding]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for f in findings:
        out[f.wall] = max(out[f.wall], f.time_at_stake_us)
    return out


def _ms(us: float) -> str:
    return f"{us / 1e3:+.2f} ms" if abs(us) >= 100 else f"{us:+.1f} us"


def diff_profiles(
    baseline: Sequence[RankProfile],
    candidate: Sequence[RankProfile],
    baseline_findings: Sequence[Finding] = (),
    candidate_findings: Sequence[Finding] = (),
) -> ProfileDiff:
    """The per-step differences between two sets of per-rank profiles."""

    def phases(p: RankProfile) -> dict[str, float]:
        return {ph.phase: ph.per_step_us for ph in p.host.phases} if p.host is not None else {}

    def device(p: RankProfile) -> dict[str, float]:
        n = _steps(p)
        return {
            "idle": p.idle_us / n,
            "compute": p.compute_us / n,
            "communication": p.communication_us / n,
            "memory": p.memory_us / n,
        }

    def categories(p: RankProfile) -> dict[str, float]:
        n = _steps(p)
        return {c.category: c.total_us / n for c in p.categories}

    def kernels(p: RankProfile) -> dict[str, float]:
        n = _steps(p)
        return {k.name: k.total_us / n for k in p.top_kernels}

    def ops(p: RankProfile) -> dict[str, float]:
        n = _steps(p)
        return {o.name: o.total_us / n for o in p.top_ops}

    def counts(p: RankProfile) -> dict[str, float]:
        n = _steps(p)
        out = {
            "launches": float(p.launch.launches) / n,
            "implicit_syncs": float(p.sync.implicit_sync_ops) / n,
            "host_sync_calls": float(p.sync.host_sync_calls) / n,
        }
        if p.host is not None:
            out["cpu_ops"] = p.host.ops_per_step
        return out

    b_step = sum(_step_us(p) for p in baseline) / max(len(baseline), 1)
    c_step = sum(_step_us(p) for p in candidate) / max(len(candidate), 1)
    b_k, c_k = _mean(baseline, kernels), _mean(candidate, kernels)
    b_o, c_o = _mean(baseline, ops), _mean(candidate, ops)
    common_k = [k for k in b_k if k in c_k]
    common_o = [k for k in b_o if k in c_o]
    phase_rows = _rows(_mean(baseline, phases), _mean(candidate, phases))
    device_rows = (
        _rows(_mean(baseline, device), _mean(candidate, device))
        if any(p.span_us > 0 for p in [*baseline, *candidate])
        else []
    )
    step = _row("step", b_step, c_step)
    diff = ProfileDiff(
        basis="candidate minus baseline, microseconds per step, mean over ranks",
        step=step,
        phases=phase_rows,
        device=device_rows,
        categories=_rows(_mean(baseline, categories), _mean(candidate, categories))[:_SHOWN],
        kernels=_rows(b_k, c_k, common_k)[:_SHOWN],
        ops=_rows(b_o, c_o, common_o)[:_SHOWN],
        new_kernels=[k for k in c_k if k not in b_k][:_SHOWN],
        vanished_kernels=[k for k in b_k if k not in c_k][:_SHOWN],
        new_ops=[k for k in c_o if k not in b_o][:_SHOWN],
        vanished_ops=[k for k in b_o if k not in c_o][:_SHOWN],
        counts=_rows(_mean(baseline, counts), _mean(candidate, counts)),
        walls=_rows(_walls(baseline_findings), _walls(candidate_findings)),
        summary=[],
    )
    diff.summary = _summary(diff)
    return diff


def _summary(d: ProfileDiff) -> list[str]:
    lines = [
        f"step {d.step.baseline / 1e3:.2f} -> {d.step.candidate / 1e3:.2f} ms ({_ms(d.step.delta)} per step"
        + (f", x{d.step.ratio:.2f}" if d.step.ratio else "")
        + ")"
    ]
    moved = [r for r in d.phases if abs(r.delta) >= 0.02 * max(d.step.baseline, 1.0)][:3]
    if moved:
        lines.append("host phases: " + ", ".join(f"{r.name} {_ms(r.delta)}" for r in moved))
    dev = [r for r in d.device if abs(r.delta) >= 0.02 * max(d.step.baseline, 1.0)][:3]
    if dev:
        lines.append("device: " + ", ".join(f"{r.name} {_ms(r.delta)}" for r in dev))
    if d.kernels:
        lines.append(
            "kernels: " + ", ".join(f"{file_text(r.name, 60)} {_ms(r.delta)}" for r in d.kernels[:2])
        )
    if d.new_kernels or d.vanished_kernels:
        lines.append(
            f"{len(d.new_kernels)} new and {len(d.vanished_kernels)} vanished kernels among the top lists"
        )
    if d.new_ops or d.vanished_ops:
        lines.append(
            "ops new: " + (", ".join(file_text(o, 60) for o in d.new_ops[:2]) or "none")
            + "; vanished: " + (", ".join(file_text(o, 60) for o in d.vanished_ops[:2]) or "none")
        )  # fmt: skip
    changed = [r for r in d.counts if r.baseline and r.ratio is not None and abs(r.ratio - 1) >= 0.1]
    if changed:
        lines.append(
            "per step: " + ", ".join(f"{r.name} {r.baseline:g} -> {r.candidate:g}" for r in changed[:3])
        )
    walls = [r for r in d.walls if abs(r.delta) > 0][:3]
    if walls:
        lines.append("walls: " + ", ".join(f"{r.name} {_ms(r.delta)}" for r in walls))
    return lines
