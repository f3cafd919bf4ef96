"""Peak memory at keep: growth beyond noise is refused unless accepted in the ledger.

The noise is the larger of the sides' own spread (their windows' peaks) and `NOISE_FRACTION` of the
baseline's peak (allocator rounding and caching move a peak by a few per cent between launches). An
acceptance is recorded: a `memory_budget_bytes` fixed at open, or a `memory_growth_reason` given with the
keep. A peak that was not observed (no counter on the device, a log without memory) is `unavailable`,
never a pass or a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from perfgate.decisions.experiments import Experiment
from perfgate.evidence import EvidenceRecord

__all__ = ["NOISE_FRACTION", "MemoryVerdict", "peak_memory_verdict"]

NOISE_FRACTION = 0.05
"""Peak growth up to this share of the baseline's peak is noise."""

Lookup = Callable[[str], EvidenceRecord | None]


@dataclass(frozen=True)
class MemoryVerdict:
    status: Literal["passed", "failed", "unavailable"]
    reason: str
    growth_bytes: int | None = None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 2**20 else f"{n} B"


def peak_memory_verdict(
    exp: Experiment, baseline: list[str], candidate: list[str], lookup: Lookup, accepted: str | None
) -> MemoryVerdict:
    peaks: dict[str, list[int]] = {"baseline": [], "candidate": []}
    kinds: set[str] = set()
    unseen: list[str] = []
    for side, ids in (("baseline", baseline), ("candidate", candidate)):
        for wid in ids:
            record = lookup(wid)
            value = record.result.get("peak_memory_bytes") if record is not None else None
            if not isinstance(value, int) or isinstance(value, bool):
                why = record.result.get("peak_memory_unavailable") if record is not None else None
                unseen.append(f"{wid}" + (f" ({why})" if isinstance(why, str) and why else ""))
                continue
            peaks[side].append(value)
            kind = record.result.get("peak_memory_kind") if record is not None else None
            if isinstance(kind, str):
                kinds.add(kind)
    if unseen or not peaks["baseline"] or not peaks["candidate"]:
        return MemoryVerdict(
            "unavailable",
            "peak memory was not observed for "
            + (", ".join(unseen[:4]) or "a side")
            + ": growth cannot be judged here (report it as unmeasured)",
        )
    if len(kinds) > 1:
        return MemoryVerdict(
            "unavailable",
            f"the sides' peaks are of different kinds ({', '.join(sorted(kinds))}): not comparable",
        )
    base, cand = max(peaks["baseline"]), max(peaks["candidate"])
    growth = cand - base
    figures = f"candidate peak {cand} B vs baseline {base} B: growth {growth} B"
    if exp.memory_budget_bytes is not None:
        ok = growth <= exp.memory_budget_bytes
        return MemoryVerdict(
            "passed" if ok else "failed", f"{figures}, budget {exp.memory_budget_bytes} B", growth
        )
    spread = max(max(v) - min(v) for v in peaks.values())
    noise = max(spread, int(NOISE_FRACTION * base))
    if growth <= noise:
        return MemoryVerdict("passed", f"{figures}, within noise ({_mib(noise)})", growth)
    if accepted:
        return MemoryVerdict(
            "passed", f"{figures} ({_mib(growth)}), accepted with the keep: {accepted}", growth
        )
    return MemoryVerdict(
        "failed",
        f"{figures} ({_mib(growth)}, {growth / max(base, 1):+.0%}), beyond noise ({_mib(noise)}) and not accepted",
        growth,
    )
