"""Whether two sides of an A/B are comparable: each side one workload measured one way, every difference
between them declared and none semantic, and a topology change compared per device; else the reasons."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from perfgate.benchmarking.comparing.differences import ARGV, CODE, Difference, find_differences
from perfgate.benchmarking.comparing.sides import (
    IMPORT_TOOL,
    measured_by,
    observed,
    record_contract,
    record_protocol,
)
from perfgate.benchmarking.workload.argv import argv_topology
from perfgate.benchmarking.workload.contract import ContractDiff, diff_contracts, same_contract
from perfgate.benchmarking.workload.observed import entries_showing
from perfgate.benchmarking.workload.protocol import same_protocol
from perfgate.benchmarking.workload.vocabulary import (
    VOCABULARY,
    canonical_key,
    vocabulary_name,
    vocabulary_problems,
)
from perfgate.evidence import EvidenceState
from perfgate.evidence.access import as_dict

if TYPE_CHECKING:
    from perfgate.evidence import EvidenceRecord

__all__ = [
    "TOPOLOGY",
    "USABLE",
    "Comparability",
    "busy_neighbours",
    "comparability",
    "difference_reasons",
    "side_reasons",
]

USABLE = frozenset({EvidenceState.EXECUTED, EvidenceState.PASSED})
"""States of window evidence a comparison can rest on."""
TOPOLOGY = (
    "world_size",
    "data_parallel",
    "tensor_parallel",
    "pipeline_parallel",
    "context_parallel",
    "expert_parallel",
)
"""Settings whose change moves each device's share of the work: comparable per device only."""
_OBSERVED_EXECUTION = ("world_size",)


@dataclass(frozen=True)
class Comparability:
    """``reasons``: why the sides are incomparable (empty: comparable); ``differences`` between the first
    windows, each classified; ``unverified``: what a side does not know; ``actual_changes``: the execution
    settings whose values differ; ``busy``: a warning per window run beside a busy neighbour; ``imported``:
    the ids of imported evidence."""

    reasons: list[str]
    differences: list[Difference]
    unverified: list[str]
    actual_changes: list[str]
    busy: list[str]
    imported: list[str]


def side_reasons(side: str, records: Sequence[EvidenceRecord]) -> list[str]:
    """Why one side's windows cannot stand for it: a profiled or failed window, windows of different
    contracts, protocols, devices or global batches, or a contract without invariants.

    Raises:
        BenchmarkError: a stored contract names one entry twice.
    """
    reasons: list[str] = []
    for r in records:
        if r.profiled:
            reasons.append(
                f"{side} evidence {r.id} is profiled: profiler overhead makes it useless for throughput"
            )
        elif r.state not in USABLE:
            why = r.result.get("failure_reason")
            what = "failed" if r.state == EvidenceState.FAILED else f"is {r.state.value}"
            reasons.append(
                f"{side} window {r.id} {what}, so it has no step timing to compare"
                + (f": {why}" if why else "")
            )
    contracts = [record_contract(r) for r in records]
    reasons += [f"{side}: {p}" for p in same_contract(contracts)]
    reasons += [f"{side}: {p}" for p in same_protocol([record_protocol(r) for r in records])]
    for problem in sorted(
        {p for c in contracts for p in vocabulary_problems(c.invariants, c.execution, c.classes)}
    ):
        reasons.append(f"{side} contract: {problem}")
    if not any(c.invariants for c in contracts):
        reasons.append(
            f"{side} declares no contract invariants: re-run with contract.invariants (model, data, precision, "
            "shapes, global_batch, ...) so the comparison can show the workload stayed the same"
        )
    if len({str(sorted(observed(r).items())) for r in records}) > 1:
        reasons.append(f"{side} windows ran on different devices or world sizes")
    batches = {b for r in records if isinstance(b := r.result.get("measured_batch"), int)}
    if len(batches) > 1:
        reasons.append(
            f"{side} windows measured different global batches ({', '.join(map(str, sorted(batches)))} samples per "
            "optimizer step): they are not one workload"
        )
    return reasons


def difference_reasons(
    declared: Sequence[str], diff: ContractDiff, differences: Sequence[Difference], used: set[str]
) -> list[str]:
    """One sentence per undeclared or semantic difference, and per declared change that did not happen
    (``used``: the declared names that explain a difference outside the contract)."""
    reasons: list[str] = []
    for d in differences:
        if d.classification == "semantic":
            reasons.append(
                f"{d.field} changed ({d.baseline!r} -> {d.candidate!r}): a semantic setting ({d.note}); that is a "
                "training_change, never an equivalent speedup"
            )
        elif d.classification == "undeclared":
            reasons.append(
                f"{d.field} differs ({d.baseline!r} vs {d.candidate!r}) but was not declared: {d.note}"
            )
    happened = {
        canonical_key(d.field.split(".", 2)[-1]) for d in differences if d.kind in ("contract", "env")
    }
    happened |= {canonical_key(d.field[len("measured.") :]) for d in differences if d.kind == "measured"}
    happened |= {d.field for d in differences if d.kind == "protocol"}
    happened |= {d.kind for d in differences if d.kind in (CODE, ARGV)}
    happened |= {CODE for d in differences if d.kind == "file"}
    for d in differences:
        if d.kind in ("env", "measured") or d.field.startswith("argv."):  # argv.<option>: a semantic option
            name = d.field.split(".", 1)[1]
            term = VOCABULARY.get(canonical_key(name))
            if term is not None:  # the entry changed, and the member it is stored as (``lr`` of the hparams)
                happened.update((term.name, vocabulary_name(name)))
            if d.kind != "argv":  # where an entry shows (benchmarking.workload.observed): the entry changed
                happened.update(entries_showing("env" if d.kind == "env" else "fingerprint", name))
    for name in sorted(set(declared)):
        key = canonical_key(name[4:] if name.lower().startswith("env:") else name)
        if (
            key not in happened
            and vocabulary_name(key) not in happened
            and name not in diff.actual_changes
            and name not in used
        ):
            reasons.append(f"declared change {name!r} did not happen (same value on both sides)")
    return reasons


def busy_neighbours(records: Sequence[EvidenceRecord], side: str, busy_share: float) -> list[str]:
    """A warning per window whose launches ran beside a busy neighbour: other processes took at least
    ``busy_share`` of its CPUs."""
    out: list[str] = []
    for r in records:
        loads = [as_dict(x) for x in cast("list[Any]", r.result.get("host_load") or [])]
        worst = max((float(x.get("other_share") or 0.0) for x in loads if x.get("measured")), default=0.0)
        if worst >= busy_share:
            out.append(
                f"{side} evidence {r.id} ran beside a busy neighbour (other processes took up to {worst:.0%} of "
                "its CPUs): its windows may be slowed; re-measure both sides on a quiet host before trusting "
                "the speedup"
            )
    return out


def comparability(
    base: Sequence[EvidenceRecord],
    cand: Sequence[EvidenceRecord],
    declared: Sequence[str],
    *,
    per_device: bool,
    busy_share: float,
) -> Comparability:
    """Whether baseline and candidate windows are comparable under the ``declared`` changes (vocabulary
    names, ``env:NAME``, ``protocol.<field>``, 'code', 'argv'), compared per device or in total.

    Raises:
        BenchmarkError: a stored contract names one entry twice.
    """
    reasons = side_reasons("baseline", base) + side_reasons("candidate", cand)
    special = [d for d in declared if d.lower().startswith("env:") or canonical_key(d) in (CODE, ARGV)]
    b_contract, c_contract = record_contract(base[0]), record_contract(cand[0])
    diff = diff_contracts(b_contract, c_contract, [d for d in declared if d not in special])
    found = find_differences(base[0], cand[0], declared, diff)
    reasons += difference_reasons(declared, diff, found.items, found.used)
    sources = {measured_by(r) for r in [*base, *cand]}
    if len(sources) > 1:
        reasons.append(
            f"the windows were measured in different ways ({', '.join(sorted(sources))}): a trainer's own log "
            "timer and perfgate's window are not the same measurement; import both sides or launch both"
        )
    b_obs, c_obs = observed(base[0]), observed(cand[0])
    actual = list(diff.actual_changes)
    for key in _OBSERVED_EXECUTION:
        declared_in_contract = key in b_contract.execution or key in c_contract.execution
        if b_obs.get(key) != c_obs.get(key) and not declared_in_contract:
            actual.append(key)
            if key not in declared:
                reasons.append(
                    f"measured {key} changed ({b_obs.get(key)} -> {c_obs.get(key)}) but was not declared"
                )
    argv_changed, argv_reasons = argv_topology(
        base[0].inputs.get("command"),
        cand[0].inputs.get("command"),
        b_contract.execution,
        c_contract.execution,
        declared,
    )
    # a declared degree the contracts do not change but the command lines do is explained by argv_reasons
    explained = tuple(f"declared change '{k}' did not happen" for k in argv_changed)
    reasons = [r for r in reasons if not r.startswith(explained)] + argv_reasons
    actual += argv_changed
    topology = sorted({canonical_key(k) for k in actual} & set(TOPOLOGY))
    if topology and not per_device:
        same_world = b_obs.get("world_size") == c_obs.get("world_size") and "world_size" not in topology
        reasons.append(
            f"the topology changed ({', '.join(topology)}; measured world size {b_obs.get('world_size')} -> "
            f"{c_obs.get('world_size')}): "
            + (
                "the same devices split the work differently (parallel degrees), which changes each device's "
                "work, memory and communication"
                if same_world
                else "total throughput grows with devices"
            )
            + ", so this is not an equivalent speedup; compare with per_device=true (work per device-second) "
            "and declare the change"
        )
    return Comparability(
        reasons=reasons,
        differences=found.items,
        unverified=found.unverified,
        actual_changes=sorted(set(actual)),
        busy=busy_neighbours(base, "baseline", busy_share) + busy_neighbours(cand, "candidate", busy_share),
        imported=[r.id for r in [*base, *cand] if r.tool == IMPORT_TOOL],
    )
