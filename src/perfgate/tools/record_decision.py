"""record_decision: experiments, evidence links by role, and gated decisions."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.decisions.binding import EVAL_PREFIX, QUALITY_METRICS
from perfgate.decisions.experiments import Classification, Decision, Experiment, Link, Role, load_experiments
from perfgate.decisions.gates.base import Gate
from perfgate.decisions.gates.refusal import next_step, summarize
from perfgate.decisions.gates.registry import evaluate_keep
from perfgate.decisions.render import render_decisions
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState, Ledger
from perfgate.helpers.statefs import write_file
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "EvidenceLink", "RecordDecisionInput", "RecordDecisionOutput", "run"]

Action = Literal["open", "attach", "decide", "show"]


class EvidenceLink(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="An evidence_id returned by an earlier perfgate tool call.")
    role: Role = Field(description="What the evidence is for this experiment.")


NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ToleranceGroupInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(max_length=200, description="Tensor name glob, e.g. 'grad/*'.")
    atol: NonNegative = Field(description="This group's atol.")
    rtol: NonNegative = Field(description="This group's rtol.")


class ToleranceInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    atol: NonNegative = Field(description="Absolute tolerance every tensor comparison must use or beat.")
    rtol: NonNegative = Field(description="Relative tolerance every tensor comparison must use or beat.")
    allow_nonfinite: bool = Field(
        default=False,
        description="Matching NaN/Inf may agree (compare_tensors allow_nonfinite); by default they fail.",
    )
    groups: list[ToleranceGroupInput] = Field(
        default_factory=list[ToleranceGroupInput],
        max_length=32,
        description="Per tensor group, first match wins over atol/rtol (e.g. gradients looser than weights); "
        "compare_tensors with experiment_id applies them.",
    )


class QualityInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        description="The quality metric that decides: "
        + "; ".join(f"{k}: {v}" for k, v in QUALITY_METRICS.items())
    )
    direction: Literal["lower", "higher"] = Field(description="Which way is better for the metric.")
    threshold: float = Field(
        allow_inf_nan=False,
        description="The value the metric must reach: <= threshold when lower is better, >= when higher is.",
    )

    @model_validator(mode="after")
    def _known_metric(self) -> QualityInput:
        name = self.metric.removeprefix(EVAL_PREFIX)
        reported = self.metric.startswith(EVAL_PREFIX) and 0 < len(name) <= 100 and "<" not in name
        if not reported and (self.metric not in QUALITY_METRICS or self.metric.startswith(EVAL_PREFIX)):
            raise ValueError(
                f"quality.metric {self.metric!r} is not reported by any task-quality tool; use one of "
                + ", ".join(QUALITY_METRICS)
            )
        return self


class RecordDecisionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Annotated[
        Action,
        Field(
            description="'open' a new experiment, 'attach' evidence to it, 'decide' (keep/revert/inconclusive/"
            "blocked), or 'show' its state and what a keep still needs."
        ),
    ]
    experiment_id: Annotated[str | None, Field(description="The experiment (required except for open).")] = (
        None
    )
    hypothesis: Annotated[str | None, Field(description="open: what should get faster, and why.")] = None
    classification: Annotated[
        Classification | None,
        Field(
            description="open: 'system_optimization' (same math, faster), 'training_change' (changes "
            "numerics or the recipe; needs a task-quality result), 'correctness_repair' (fixes a bug; its "
            "runs become the new baseline)."
        ),
    ] = None
    changed_variable: Annotated[
        str | None,
        Field(
            description="open: the one thing changed, as compare_benchmarks' declared_changes will name it: an "
            "execution setting of the vocabulary (e.g. 'workers', 'microbatch'), or 'code' for an edit of the "
            "code alone (a vectorized loop, a fused op)."
        ),
    ] = None
    touches_data: Annotated[
        bool,
        Field(
            description="open: the change touches data loading or sharding (a sample audit is then required)."
        ),
    ] = False
    memory_budget_bytes: Annotated[
        int | None,
        Field(
            ge=0,
            description="open: allowed growth of peak memory, candidate over baseline, in bytes. Without it a "
            "keep refuses growth beyond noise unless decide gives memory_growth_reason.",
        ),
    ] = None
    validation_steps: Annotated[
        int | None,
        Field(
            ge=1,
            le=1_000_000,
            description="open: the winner's validation: a keep needs a candidate run that trained at least this "
            "many healthy steps (e.g. 50); a comparison's candidate window counts, or one run of the candidate "
            "attached in role candidate.",
        ),
    ] = None
    tolerance: Annotated[
        ToleranceInput | None,
        Field(
            description="open: the correctness tolerances fixed before any candidate evidence exists; every "
            "attached compare_tensors must use these or stricter. Omitted: bit-exact (atol=0, rtol=0, "
            "non-finite values fail)."
        ),
    ] = None
    quality: Annotated[
        QualityInput | None,
        Field(
            description="open, required for a training_change: the task-quality acceptance (metric, direction, "
            "threshold) its quality evidence must meet, e.g. {'metric': 'loss_last_ratio', 'direction': "
            "'lower', 'threshold': 1.02}."
        ),
    ] = None
    evidence: Annotated[
        list[EvidenceLink],
        Field(description="open/attach/decide: evidence ids with their roles to link to the experiment."),
    ] = []
    decision: Annotated[
        Decision | None, Field(description="decide: keep, revert, inconclusive or blocked.")
    ] = None
    rationale: Annotated[str | None, Field(description="decide: why, in a sentence or two.")] = None
    rollback: Annotated[
        str | None,
        Field(
            max_length=2000,
            description="decide: the commands that undo the change, checked against what the candidate's runs "
            "changed: its commits ('git revert HEAD', a sha, a branch), the files its diff touched ('git checkout "
            "HEAD~1 -- train.py', 'git restore train.py', 'git apply -R change.patch'), and each changed setting at "
            "the baseline's value ('--num-workers 0', 'OMP_NUM_THREADS=1', 'unset NAME' for an added variable). "
            "Required for keep; shown in decisions.md and the report.",
        ),
    ] = None
    fewer_windows_reason: Annotated[
        str | None,
        Field(description="decide: why fewer than 3 windows per side are enough (e.g. 30-minute steps)."),
    ] = None
    memory_growth_reason: Annotated[
        str | None,
        Field(
            max_length=500,
            description="decide: why the candidate's peak memory growth beyond noise is acceptable (recorded "
            "with the keep); without it, or a memory_budget_bytes at open, such growth refuses the keep.",
        ),
    ] = None

    @model_validator(mode="after")
    def _fields_for_action(self) -> RecordDecisionInput:
        need: dict[str, list[str]] = {
            "open": ["hypothesis", "classification", "changed_variable"],
            "attach": ["experiment_id"],
            "decide": ["experiment_id", "decision", "rationale"],
            "show": ["experiment_id"],
        }
        missing = [name for name in need[self.action] if getattr(self, name) in (None, "")]
        if missing:
            raise ValueError(f"action '{self.action}' needs {', '.join(missing)}")
        if self.action == "decide" and self.decision == "keep" and not (self.rollback or "").strip():
            raise ValueError(
                "a keep needs rollback: the command or revert commit that undoes the change "
                "(e.g. rollback='git revert 1a2b3c4'), so the kept change can be taken back"
            )
        fixed = [
            name for name in ("tolerance", "quality", "validation_steps") if getattr(self, name) is not None
        ]
        if fixed and self.action != "open":
            raise ValueError(
                f"{', '.join(fixed)} is fixed when the experiment is opened and cannot change later; open a new "
                "experiment to declare other criteria"
            )
        if self.action == "open" and self.classification == "training_change" and self.quality is None:
            raise ValueError(
                "a training_change needs its task-quality acceptance declared at open: quality={'metric': "
                "'loss_last_ratio', 'direction': 'lower', 'threshold': 1.02} (metrics: "
                + ", ".join(QUALITY_METRICS)
                + ")"
            )
        if self.memory_growth_reason is not None and not (
            self.action == "decide" and self.decision == "keep"
        ):
            raise ValueError(
                "memory_growth_reason accepts a keep's memory growth: give it with decision='keep'"
            )
        if self.action == "attach" and not self.evidence:
            raise ValueError("action 'attach' needs at least one evidence link")
        return self


class RecordDecisionOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    experiment_id: str
    action: Action
    accepted: bool = Field(description="decide: the decision was recorded; other actions: true.")
    decision: Decision | None
    label: str | None = Field(description="How a kept result may be described, e.g. 'equivalent speedup'.")
    declared_criteria: str = Field(
        description="What open fixed before any candidate evidence: the correctness tolerance (bit-exact when "
        "none was declared), or a training change's task-quality criterion."
    )
    gates: list[Gate] = Field(description="The keep gates as they stand now, with what would satisfy each.")
    evidence: list[EvidenceLink]
    decisions_md: str = Field(description="Path of the rendered decision log, relative to the workspace.")


_LABELS = {
    "system_optimization": "equivalent speedup (same numerics: within the declared tolerances and the per-dtype "
    "equivalence ceiling)",
    "training_change": "training change: faster, with a recorded task-quality result; not an equivalent speedup",
    "correctness_repair": "correctness repair: its windows are the new baseline, not a speedup",
}


def _check_links(ledger: Ledger, links: list[EvidenceLink]) -> None:
    for link in links:
        record = ledger.get(link.id)
        if record is None:
            raise ToolError(
                f"evidence {link.id!r} is not in the ledger; attach ids returned by perfgate tools"
            )
        if record.tool == "record_decision":
            raise ToolError(f"{link.id} is a decision record; attach the evidence itself")


def _criteria(inp: RecordDecisionInput) -> str:
    """What an open call fixes, as the experiment will report it."""
    from perfgate.decisions.experiments import BIT_EXACT, QualityCriteria, Tolerance

    exp = Experiment(
        id="",
        hypothesis="",
        classification=inp.classification or "system_optimization",
        changed_variable="",
        touches_data=False,
        memory_budget_bytes=None,
        opened_at="",
        tolerance=Tolerance.from_input(inp.tolerance.model_dump()) if inp.tolerance else BIT_EXACT,
        quality=QualityCriteria(**inp.quality.model_dump()) if inp.quality else None,
    )
    return exp.criteria()


def _new_experiment_id() -> str:
    return f"exp-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


def _render(ledger: Ledger) -> str:
    experiments = list(load_experiments(ledger).values())
    path = ledger.state_dir / "decisions.md"
    write_file(path, render_decisions(experiments).encode())
    return str(path.relative_to(ledger.workspace))


def _evaluate(
    inp: RecordDecisionInput, ledger: Ledger
) -> tuple[str, list[Gate], list[EvidenceLink], Experiment | None]:
    """Validate the action against the ledger and evaluate the gates (runs in a worker thread)."""
    _check_links(ledger, inp.evidence)
    if inp.action == "open":
        return _new_experiment_id(), [], inp.evidence, None
    assert inp.experiment_id is not None
    experiments = load_experiments(ledger)
    exp = experiments.get(inp.experiment_id)
    if exp is None:
        known = ", ".join(list(experiments)[-5:]) or "none yet"
        raise ToolError(f"no experiment {inp.experiment_id!r} (recent: {known}); open one with action='open'")
    for item in inp.evidence:
        exp.links.append(Link(evidence_id=item.id, role=item.role, attached_by="(this call)"))
    links = [EvidenceLink(id=link.evidence_id, role=link.role) for link in exp.links]
    keep = inp.action == "decide" and inp.decision == "keep"
    gates = evaluate_keep(
        exp,
        ledger,
        inp.fewer_windows_reason,
        rollback=inp.rollback if keep else None,
        memory_growth_reason=(inp.memory_growth_reason or "").strip() or None,
    )
    return exp.id, gates, links, exp


async def run(inp: RecordDecisionInput, rt: ToolRuntime) -> RecordDecisionOutput:
    from perfgate.helpers.filelock import held_async

    # Held from reading an experiment to recording what was decided on it, by every record_decision call
    # on the workspace (across servers): a keep is weighed against every decision recorded before it (a
    # keep sent at the same time as another on the same experiment, or on the same candidate windows, is
    # weighed after that one is recorded, never beside it).
    async with held_async(rt.ledger.state_dir / "decisions.lock", confined=True):
        return await _run(inp, rt)


async def _run(inp: RecordDecisionInput, rt: ToolRuntime) -> RecordDecisionOutput:
    exp_id, gates, links, exp = await anyio.to_thread.run_sync(_evaluate, inp, rt.ledger)
    accepted = True
    label: str | None = None
    state = EvidenceState.EXECUTED
    if inp.action == "decide":
        assert exp is not None
        kept_before = any(d.decision == "keep" for d in exp.decisions)
        if exp.decision is not None and exp.decision.decision == "keep" and inp.decision != "revert":
            raise ToolError(
                f"{exp_id} is kept; the only decision left is 'revert' (the keep stays in the history)\n"
                "next: decide 'revert' with the reason, or open a new experiment for a further change"
            )
        if kept_before and inp.decision == "keep":
            raise ToolError(
                f"{exp_id} was kept and then reverted; a change is kept once per experiment\n"
                "next: open a new experiment (with fresh candidate evidence) to keep it again"
            )
        if inp.decision == "keep":
            accepted = all(g.status != "failed" for g in gates)
            label = _LABELS[exp.classification] if accepted else None
            topology = next((g for g in gates if g.name == "topology" and g.status == "passed"), None)
            if label is not None and topology is not None:
                label += "; per device-second: " + topology.reason.split(":", 1)[0]
            state = EvidenceState.PASSED if accepted else EvidenceState.FAILED
    ev = rt.evidence()
    out = RecordDecisionOutput(
        evidence_id=ev.id,
        state=state,
        experiment_id=exp_id,
        action=inp.action,
        accepted=accepted,
        decision=inp.decision if inp.action == "decide" else None,
        label=label,
        declared_criteria=_criteria(inp) if exp is None else exp.criteria(),
        gates=gates,
        evidence=links,
        decisions_md=str(rt.ledger.state_dir.relative_to(rt.workspace) / "decisions.md"),
    )
    await rt.commit(ev, out)
    await anyio.to_thread.run_sync(_render, rt.ledger)
    if not accepted:
        unmet = [g for g in gates if g.status == "failed"]
        raise ToolError(
            f"keep refused for {exp_id}: {len(unmet)} gate(s) unmet ({', '.join(g.name for g in unmet)}); "
            f"refusal recorded as {ev.id}\n{next_step(gates)}\n{summarize(gates)}"
        )
    return out


SPEC = ToolSpec(
    name="record_decision",
    title="Record an experiment and its decision",
    description=(
        "Open an experiment, attach evidence ids by role, decide keep, revert, inconclusive or blocked. A "
        "keep is refused until the ledger holds what it needs; 'show' lists what is missing."
    ),
    details=(
        "Record optimization experiments and gate their decisions on ledger evidence. 'open' one per "
        "change (hypothesis, classification, the one changed variable), 'attach' evidence ids by role "
        "(environment, baseline, candidate, comparison, correctness, profile, audit, quality, note), then "
        "'decide'. A 'keep' is refused unless the ledger holds: an environment record, a passed "
        "compare_benchmarks of non-profiled windows from one environment with an improvement beyond noise, "
        "passed correctness evidence (and a sample audit when data loading changed), and an intact ledger. "
        "A keep also needs a rollback that undoes the candidate's change (git revert of its commit, its files "
        "restored, the baseline's value of a changed setting); any failed check attached in any role blocks it; peak memory may not grow beyond noise unless "
        "accepted. 'revert', 'inconclusive' and 'blocked' are always recorded; "
        "a kept change can later be reverted (the keep stays in the history). Use 'show' to see what is missing."
    ),
    input_model=RecordDecisionInput,
    output_model=RecordDecisionOutput,
    run=run,
    read_only=False,
    destructive=False,
    idempotent=False,
    open_world=False,
    writes=True,
)
