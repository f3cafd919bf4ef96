"""Every gate a ``keep`` must pass, in the order they are evaluated and reported: its name, what it protects,
and when it applies. The keep is a loop over this table; adding a gate is one row here and one function in
a module beside it. The gate tables of docs/gates.md and the skill are rendered from it (`table`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from perfgate.decisions.experiments import Experiment
from perfgate.decisions.gates import closing, comparison, declared, environment, launches, tensors, training
from perfgate.decisions.gates import windows as win
from perfgate.decisions.gates.base import Gate, Keep, gate_of
from perfgate.decisions.verdict import Check
from perfgate.evidence import Ledger

__all__ = ["GATES", "Applies", "Row", "evaluate_keep"]


@dataclass(frozen=True)
class Applies:
    """When a gate is evaluated at all (elsewhere it is absent from the keep's gates; a gate that applies
    may still say ``not_applicable`` from what it finds)."""

    says: str
    test: Callable[[Keep], bool]


@dataclass(frozen=True)
class Row:
    """One gate: the name every answer gives it, the function that judges it, what it protects (one line of
    the rendered table) and when it is evaluated."""

    name: str
    check: Callable[[Keep], Check]
    protects: str
    applies: Applies


ALWAYS = Applies("every keep", lambda k: True)
SPEEDUP = Applies(
    "a speedup is claimed (all but a correctness repair)", lambda k: _kind(k) != "correctness_repair"
)
STANDS = Applies("a comparison stands (the latest, not overruled, not a screen)", comparison.stands)
SEMANTIC = Applies(
    "the standing comparison declares a semantic change and the experiment is no training change",
    lambda k: comparison.stands(k) and declared.declares_semantic(k),
)
EQUIVALENT = Applies(
    "same numerics are claimed (system optimization, correctness repair)",
    lambda k: _kind(k) != "training_change",
)
SYSTEM = Applies("a system optimization", lambda k: _kind(k) == "system_optimization")
TRAINING = Applies("a training change", lambda k: _kind(k) == "training_change")
REPAIR = Applies("a correctness repair", lambda k: _kind(k) == "correctness_repair")


def _kind(keep: Keep) -> str:
    return keep.exp.classification


def _always(unless: str) -> Applies:
    """Evaluated for every keep, and ``not_applicable`` where ``unless`` says."""
    return Applies(f"every keep; not applicable {unless}", ALWAYS.test)


GATES: tuple[Row, ...] = (
    Row("environment", environment.environment, "the run's hardware and software are on record", ALWAYS),
    Row("comparison", comparison.comparison, "the latest comparison shows a speedup beyond noise", SPEEDUP),
    Row(
        "declared_change",
        declared.declared_change,
        "the comparison is about this experiment's change",
        STANDS,
    ),
    Row(
        "candidate_after_open",
        declared.candidate_after_open,
        "candidates were measured after the hypothesis",
        STANDS,
    ),
    Row(
        "evidence_not_reused",
        declared.evidence_not_reused,
        "one candidate run supports one kept change",
        STANDS,
    ),
    Row(
        "topology", declared.topology, "a topology change is compared per device, never as a speedup", STANDS
    ),
    Row(
        "classification",
        declared.classification,
        "a semantic change is kept only as a training change",
        SEMANTIC,
    ),
    Row("windows_valid", win.windows_valid, "throughput comes from executed, unprofiled windows", STANDS),
    Row("window_count", win.window_count, "launch-to-launch noise is sampled (3 launches a side)", STANDS),
    Row(
        "required_invariants",
        win.required_invariants,
        "the workload is named: `model`, `dataset`, `precision`, `global_batch`",
        STANDS,
    ),
    Row("invariants_match", win.invariants_match, "both sides run the same workload", STANDS),
    Row(
        "same_environment",
        environment.same_environment,
        "only the declared change differs between the machines",
        STANDS,
    ),
    Row("peak_memory", launches.peak_memory, "a speedup does not buy unaccepted memory growth", STANDS),
    Row(
        "trusted_timing",
        launches.trusted_timing,
        "the server's own clock corroborates the harness's times",
        STANDS,
    ),
    Row("replicas", launches.replicas, "data-parallel replicas stay identical", STANDS),
    Row("job_time", launches.job_time, "a faster step does not hide a slower job", STANDS),
    Row(
        "checkpoint_resume",
        launches.checkpoint_resume,
        "a layout or checkpointing change still resumes",
        STANDS,
    ),
    Row("backend", launches.backend, "the backend or graphs a change names actually ran", STANDS),
    Row(
        "correctness",
        tensors.correctness,
        "each side's own tensors match at the tolerance fixed at open",
        _always("to a training change"),
    ),
    Row("equivalence", tensors.equivalence, '"equivalent" stays within the per-dtype ceiling', EQUIVALENT),
    Row("same_training", training.same_training, "the same model, inputs and loss as the baseline", SYSTEM),
    Row(
        "task_quality",
        training.task_quality,
        "a training change meets its declared quality criterion",
        TRAINING,
    ),
    Row("new_baseline", training.new_baseline, "a repair leaves executed windows to measure from", REPAIR),
    Row(
        "sample_audit",
        closing.sample_audit,
        "a data-path change reads each sample as intended",
        _always("unless the change touches data, declared or measured"),
    ),
    Row("failed_checks", closing.failed_checks, "no failed check is hidden in a role no gate reads", ALWAYS),
    Row(
        "validation_run",
        closing.validation_run,
        "the winner trains healthily for the steps open asked",
        _always("unless open gave validation_steps"),
    ),
    Row(
        "rollback",
        closing.rollback,
        "the keep names a rollback that undoes the change",
        _always("to show (checked at decide)"),
    ),
    Row("runs_finished", closing.runs_finished, "every cited detached run's end was observed", ALWAYS),
    Row("ledger_integrity", closing.ledger_integrity, "no record or artifact was edited", ALWAYS),
)


def evaluate_keep(
    exp: Experiment,
    ledger: Ledger,
    fewer_windows_reason: str | None = None,
    *,
    rollback: str | None = None,
    memory_growth_reason: str | None = None,
) -> list[Gate]:
    """Every gate that applies to keeping ``exp``, each with its status; the keep is accepted when none
    failed (``unavailable`` and ``not_applicable`` do not block). ``rollback`` and ``memory_growth_reason``
    are what the decide call gives (None for ``show``)."""
    keep = Keep(exp, ledger, fewer_windows_reason, rollback, memory_growth_reason)
    return [gate_of(row.name, row.check(keep)) for row in GATES if row.applies.test(keep)]
