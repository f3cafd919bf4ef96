"""compare_benchmarks: A/B over benchmark evidence, refusing apples-to-oranges and calling noise noise.

The bootstrap (numpy) and the series reader (msgspec) are imported where they are used, to keep server
start-up fast.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.benchmarking import BenchmarkError, Contract, ContractDiff, diff_contracts
from perfgate.benchmarking.contract import same_contract
from perfgate.benchmarking.observed import Place, entries_showing, explains, option_name
from perfgate.benchmarking.protocol import (
    IMPORTED_FIELDS,
    LAUNCHED_FIELDS,
    MEASURED_FIELDS,
    changed_fields,
    same_protocol,
    window_protocol,
)
from perfgate.benchmarking.training import ModelShape, SideTraining, training_differences
from perfgate.benchmarking.verdict import DEFAULT_MIN_EFFECT
from perfgate.benchmarking.vocabulary import VOCABULARY, canonical_key, vocabulary_name, vocabulary_problems
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceRecord, EvidenceState
from perfgate.evidence.access import as_dict
from perfgate.evidence.artifacts import ArtifactChanged, read_artifact
from perfgate.report.plots import ab_distribution_png
from perfgate.tools._runtime import ToolRuntime
from perfgate.tools._spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.benchmarking.compare import WindowSample
    from perfgate.benchmarking.drift import LaunchInfo

__all__ = ["SPEC", "CompareBenchmarksInput", "CompareBenchmarksOutput", "run"]

BENCHMARK_TOOL = "run_benchmark_window"
IMPORT_TOOL = "import_benchmark"
_WINDOW_TOOLS = (BENCHMARK_TOOL, IMPORT_TOOL)
_USABLE = {EvidenceState.EXECUTED, EvidenceState.PASSED}
_OBSERVED_EXECUTION = ("world_size",)
_TOPOLOGY = (
    "world_size",
    "data_parallel",
    "tensor_parallel",
    "pipeline_parallel",
    "context_parallel",
    "expert_parallel",
)
_OBSERVED_INVARIANTS = ("device_kind", "device_name")
_DEGREES = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "data_parallel")
_FLAG_ONLY_DEGREES = {
    "data_parallel_shard_degree": "data_parallel",
    "data_parallel_replicate_degree": "data_parallel",
}
"""torchtitan's two data-parallel options (FSDP shard and replicate degrees): no contract key, but each
sets a data-parallel degree. Every other option is read through the vocabulary (``--tp``,
``--tensor-model-parallel-size``, ``--parallelism.pipeline_parallel_degree`` name their entries), normalized:
leading dashes dropped, '-' as '_', the last dotted segment."""
Verdict = Literal["improved", "regressed", "within_noise", "insufficient_launches", "incomparable"]


class CompareBenchmarksInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: Annotated[
        list[str], Field(min_length=1, description="run_benchmark_window evidence ids of the baseline.")
    ]
    candidate: Annotated[
        list[str], Field(min_length=1, description="run_benchmark_window evidence ids of the candidate.")
    ]
    declared_changes: Annotated[
        list[str],
        Field(
            description="Names of the contract execution settings the candidate changed on purpose (e.g. "
            "['microbatch', 'accumulation']), and the measurement-protocol fields it changed as "
            "'protocol.<field>' (e.g. 'protocol.warmup_steps'). Every actual change must be declared and every "
            "declared one must have happened."
        ),
    ] = Field(default_factory=list[str])
    per_device: Annotated[
        bool,
        Field(
            description="Normalize throughput per device (work per device-second: step time x world size). "
            "Required when the world size or a parallel degree changed: a topology change is never an "
            "equivalent speedup of total throughput."
        ),
    ] = False
    min_effect: Annotated[
        float,
        Field(
            ge=0, le=0.5, description="Smallest relative change reported as improved/regressed (fraction)."
        ),
    ] = DEFAULT_MIN_EFFECT

    @field_validator("declared_changes")
    @classmethod
    def _canonical(cls, declared: list[str]) -> list[str]:
        """Each name under its vocabulary entry ('micro_batch_size' is 'microbatch'), as recorded and gated;
        an environment variable ('env:NAME') keeps its own spelling."""
        return [f"env:{d[4:]}" if d.lower().startswith("env:") else vocabulary_name(d) for d in declared]


class Difference(BaseModel):
    field: str = Field(
        description="What differs, e.g. 'contract.execution.workers', 'env.OMP_NUM_THREADS', "
        "'argv', 'code', 'file:train.py', 'measured.torch_version', 'protocol.warmup_steps'."
    )
    kind: Literal["contract", "env", "argv", "code", "file", "measured", "protocol"]
    baseline: Any
    candidate: Any
    classification: Literal[
        "declared_execution", "declared_semantic", "declared_protocol", "undeclared", "semantic"
    ] = Field(
        description="declared_execution: covered by declared_changes and allowed; declared_semantic: a "
        "declared change of what is learned (comparable, but only a training_change can be kept on it); "
        "declared_protocol: a measurement-boundary field (warm-up, measured steps, timing, ...) declared as "
        "'protocol.<field>'; undeclared or semantic: the comparison is incomparable."
    )
    note: str


class DriftReport(BaseModel):
    design: Literal["interleaved", "blocks", "unknown"] = Field(
        description="interleaved: the sides' launches alternate in time, so the host's drift hits both; blocks: "
        "each side ran in its own block (separate calls), so the drift between them is measured and folded into "
        "the interval; unknown: launch times not recorded."
    )
    order: str = Field(description="Launches by start time, A baseline and B candidate (e.g. 'AABBBBAA').")
    drift_factor: float = Field(
        description="The measured drift folded into the interval (x/÷ this); 1.0: none. An effect no larger is "
        "within_noise."
    )
    sources: list[str] = Field(
        description="What was measured (trend, A/A across calls, host load), each sized."
    )
    unmeasured: list[str] = Field(description="What could not be measured.")
    summary: str


class CompareBenchmarksOutput(BaseModel):
    caution: str | None = Field(
        default=None,
        description="Leads the answer when the candidate may train differently (model size, data, loss): the "
        "speedup is then not an equivalent one until correctness evidence shows it.",
    )
    evidence_id: str
    state: EvidenceState = Field(
        description="passed: comparable and decisive (improved/regressed); executed: comparable, within "
        "noise or fewer than 2 launches on a side (insufficient_launches); failed: incomparable."
    )
    status: Literal["comparable", "incomparable"]
    verdict: Verdict
    reasons: list[str] = Field(description="Why the sides are incomparable (empty when comparable).")
    speedup: float | None = Field(description="Candidate / baseline pooled throughput (>1 is faster).")
    ci_low: float | None = Field(
        description="Lower end of the 95% interval of the speedup (launch-to-launch and step variation); "
        "the interval always contains the speedup."
    )
    ci_high: float | None
    confidence: float
    unit: Literal["samples", "tokens", "steps"] | None = Field(description="Work unit of the throughput.")
    baseline_throughput: float | None = Field(description="Units per second, total work / total time.")
    candidate_throughput: float | None
    baseline_windows: int
    candidate_windows: int
    baseline_launches: int = Field(description="Separate launches (processes) behind the baseline windows.")
    candidate_launches: int
    median_step_speedup: float | None = Field(
        description="Speedup from each side's median step (stalls ignored); compare with speedup."
    )
    differences: list[Difference] = Field(
        description="Every difference between the first baseline and candidate windows (argv, env, code, "
        "files the argv names, measured environment, contract, measurement protocol), each classified; any "
        "undeclared or semantic one makes the comparison incomparable."
    )
    unverified: list[str] = Field(
        description="What could not be compared because a side does not know it (never counted as 'same')."
    )
    actual_changes: list[str] = Field(description="Execution settings whose values differ between the sides.")
    declared_changes: list[str]
    warnings: list[str]
    method: str
    drift: DriftReport | None = Field(
        default=None,
        description="How the sides' launches lay in time and the host drift measured between them (comparable "
        "sides only).",
    )
    training_may_differ: list[str] = Field(
        default_factory=list[str],
        description="Ways the candidate's training may differ from the baseline's, from what the harness "
        "recorded: model size or structure, first training inputs, loss of the same steps.",
    )
    training_unchecked: list[str] = Field(
        default_factory=list[str],
        description="Which of model, data and loss could not be compared (never counted as the same).",
    )


_CODE = "code"
_ARGV = "argv"


def _launched_argv(inputs: dict[str, Any]) -> Any:
    """The command as launched: a Slurm launch adds its launcher and resources (nodes, tasks, CPUs,
    GRES, partition) as trailing tokens, so a change of any of them is an argv difference."""
    command: Any = inputs.get("command")
    launcher = inputs.get("launcher", "local")
    if launcher in (None, "local"):
        return command
    if not isinstance(command, list):
        return None
    slurm = json.dumps(inputs.get("slurm"), sort_keys=True, separators=(",", ":"))
    tokens: list[Any] = [*cast("list[Any]", command), f"launcher={launcher}", f"slurm={slurm}"]
    return tokens


def _declared_names(declared: list[str]) -> set[str]:
    """Declared names as compared: canonical, with 'env:' stripped."""
    from perfgate.benchmarking.vocabulary import canonical_key

    return {canonical_key(d[4:] if d.lower().startswith("env:") else d) for d in declared}


def _class_of(place: Place, name: str, classes: dict[str, str]) -> tuple[str | None, str]:
    """(class, source) of a setting seen at ``name``: the vocabulary's or the caller's for the name itself,
    else the class of the entry that shows there (benchmarking.observed)."""
    from perfgate.benchmarking.vocabulary import classify

    cls, source = classify(option_name(name) if place == "option" else name, classes)
    if cls is None and (entries := entries_showing(place, name)):
        return VOCABULARY[entries[0]].cls, f"shows {entries[0]}"
    return cls, source


def _short(value: Any) -> Any:
    return value[:200] + "..." if isinstance(value, str) and len(value) > 200 else value


def _provenance(record: EvidenceRecord) -> dict[str, Any]:
    return as_dict(record.result.get("provenance"))


def _differences(
    base: EvidenceRecord, cand: EvidenceRecord, declared: list[str], diff: ContractDiff
) -> tuple[list[Difference], list[str], set[str]]:
    """Every difference between the first baseline and candidate windows, classified; what could not be
    compared (unknown on a side); and the declared names that explain some non-contract difference."""
    from perfgate.benchmarking.provenance import code_differences
    from perfgate.benchmarking.vocabulary import classify

    names = _declared_names(declared)
    used: set[str] = set()
    out: list[Difference] = []
    unverified: list[str] = []
    b_contract, c_contract = _contract(base), _contract(cand)
    classes = {**b_contract.classes, **c_contract.classes}
    for key in diff.changed_invariants:
        declared_here = key in declared
        out.append(
            Difference(
                field=f"contract.invariants.{key}",
                kind="contract",
                baseline=b_contract.invariants.get(key),
                candidate=c_contract.invariants.get(key),
                classification="declared_semantic" if declared_here else "semantic",
                note="a declared training change: only a training_change with task-quality evidence can be "
                "kept on it"
                if declared_here
                else "an invariant changed: a different workload; declare it to compare as a training change",
            )
        )
    for key in diff.actual_changes:
        cls, source = classify(key, classes)
        ok = key in declared
        out.append(
            Difference(
                field=f"contract.execution.{key}",
                kind="contract",
                baseline=b_contract.execution.get(key),
                candidate=c_contract.execution.get(key),
                classification="semantic"
                if cls == "semantic"
                else ("declared_execution" if ok else "undeclared"),
                note=f"{cls or 'unclassified'} key ({source})",
            )
        )
    out += _protocol_differences(base, cand, names)
    # env changes: declared where the declared setting shows (benchmarking.observed)
    b_env = {str(k): str(v) for k, v in as_dict(base.inputs.get("env")).items()}
    c_env = {str(k): str(v) for k, v in as_dict(cand.inputs.get("env")).items()}
    for name in sorted(set(b_env) | set(c_env)):
        if b_env.get(name) == c_env.get(name):
            continue
        cls, source = _class_of("env", name, classes)
        if (by := explains(declared, "env", name)) is not None:
            verdict: Literal["declared_execution", "declared_semantic", "undeclared", "semantic"] = (
                "declared_semantic" if cls == "semantic" else "declared_execution"
            )
            used.add(by)
        else:
            verdict = "semantic" if cls == "semantic" else "undeclared"
        out.append(
            Difference(
                field=f"env.{name}",
                kind="env",
                baseline=_short(b_env.get(name)),
                candidate=_short(c_env.get(name)),
                classification=verdict,
                note=f"environment variable set for the run ({source}); declare it as 'env:{name}' or by its "
                "vocabulary name",
            )
        )
    # argv (imported evidence has none), with how it was launched (a Slurm launch's resources)
    b_argv, c_argv = _launched_argv(base.inputs), _launched_argv(cand.inputs)
    if isinstance(b_argv, list) and isinstance(c_argv, list) and b_argv != c_argv:
        b_list = [str(x) for x in cast("list[Any]", b_argv)]
        c_list = [str(x) for x in cast("list[Any]", c_argv)]
        changed = [
            i
            for i in range(max(len(b_list), len(c_list)))
            if i >= len(b_list) or i >= len(c_list) or b_list[i] != c_list[i]
        ]
        semantic_flags = _semantic_flag_differences(b_list, c_list, declared)
        out.extend(semantic_flags)
        # a changed semantic flag explains its own tokens, declared or not (its difference says which);
        # any other changed option must be one a declared change sets, and the rest of argv the same
        flagged = {"--" + d.field.removeprefix("argv.") for d in semantic_flags}
        unexplained: list[str] = []
        for o in _argv_changes(b_list, c_list):
            by = explains(declared, "option", o) if o.startswith("--") else None
            if by is not None:
                used.add(by)  # the command line is what ran: a declared option that changed happened
            elif o not in flagged:
                unexplained.append(o)
        ok = _ARGV in names or not unexplained
        if _ARGV in names:
            used.add(_ARGV)
        settable = {o: e[0] for o in unexplained if (e := entries_showing("option", o))}
        out.append(
            Difference(
                field="argv",
                kind="argv",
                baseline=[b_list[i] if i < len(b_list) else None for i in changed][:20],
                candidate=[c_list[i] if i < len(c_list) else None for i in changed][:20],
                classification="declared_execution" if ok else "undeclared",
                note=f"argv differs at positions {changed[:20]}"
                + (
                    "; attributed to the declared change"
                    if ok
                    else f"; {', '.join(unexplained[:10])} changed and no declared change sets "
                    + ("them" if len(unexplained) > 1 else "it")
                    + (
                        " (" + ", ".join(f"{o} sets {e!r}" for o, e in settable.items()) + ")"
                        if settable
                        else ""
                    )
                    + ": declare the setting it changes, or 'argv' for a command-line change of its own"
                ),
            )
        )
    # code state and the files argv names
    b_prov, c_prov = _provenance(base), _provenance(cand)
    b_code, c_code = as_dict(b_prov.get("code")), as_dict(c_prov.get("code"))
    if not b_prov or not c_prov:
        unverified.append("code state and argv files (a side has no recorded provenance)")
    else:
        if b_code.get("commit") is None or c_code.get("commit") is None:
            unverified.append(
                "git code state ("
                + str(b_code.get("unknown_reason") or c_code.get("unknown_reason") or "unknown")
                + ")"
            )
        else:
            paths = code_differences(b_code, c_code)
            if paths:
                if _CODE in names:
                    used.add(_CODE)
                out.append(
                    Difference(
                        field="code",
                        kind="code",
                        baseline={"commit": b_code.get("commit"), "diff": b_code.get("diff_artifact")},
                        candidate={"commit": c_code.get("commit"), "diff": c_code.get("diff_artifact")},
                        classification="declared_execution" if _CODE in names else "undeclared",
                        note="code differs in "
                        + ", ".join(paths[:20])
                        + " (diffs are the evidence's code.diff "
                        "artifacts); declare 'code'",
                    )
                )
        b_files, c_files = as_dict(b_prov.get("files")), as_dict(c_prov.get("files"))
        for path in sorted(set(b_files) | set(c_files)):
            if b_files.get(path) == c_files.get(path) or path not in b_files or path not in c_files:
                continue  # a file only one side names is an argv difference
            if _CODE in names:
                used.add(_CODE)
            out.append(
                Difference(
                    field=f"file:{path}",
                    kind="file",
                    baseline=b_files[path],
                    candidate=c_files[path],
                    classification="declared_execution" if _CODE in names else "undeclared",
                    note="a workspace file the command names changed (sha256 shown); declare 'code'",
                )
            )
    # measured environment
    b_fp = as_dict(base.result.get("environment_fingerprint"))
    c_fp = as_dict(cand.result.get("environment_fingerprint"))
    if not any(v is not None for v in b_fp.values()) or not any(v is not None for v in c_fp.values()):
        unverified.append("measured environment (a side has no fingerprint)")
    else:
        for key in sorted(set(b_fp) | set(c_fp)):
            if key not in b_fp or key not in c_fp:
                unverified.append(f"measured.{key} (recorded on one side only)")
                continue
            if b_fp.get(key) == c_fp.get(key):
                continue
            cls, source = _class_of("fingerprint", key, classes)
            by = explains(declared, "fingerprint", key)
            declared_here = by is not None
            if by is not None:
                used.add(by)
            if cls == "semantic":
                verdict = "declared_semantic" if declared_here else "semantic"
            else:
                verdict = "declared_execution" if declared_here else "undeclared"
            out.append(
                Difference(
                    field=f"measured.{key}",
                    kind="measured",
                    baseline=b_fp.get(key),
                    candidate=c_fp.get(key),
                    classification=verdict,
                    note=f"measured inside the training process ({source}): "
                    + (
                        f"declare {entries[0]!r} if it changed on purpose, else re-run the candidate with the "
                        f"baseline's {key}"
                        if (entries := entries_showing("fingerprint", key))
                        else "no declared change may differ here: re-run both sides on one machine and software "
                        "stack"
                    ),
                )
            )
    batch = _batch_difference(base, cand, declared)
    if isinstance(batch, str):
        unverified.append(batch)
    elif batch is not None:
        out.append(batch)
    return out, unverified, used


def _protocol(record: EvidenceRecord) -> dict[str, Any]:
    return window_protocol(record.inputs, record.result, imported=record.tool == IMPORT_TOOL)


def _protocol_differences(base: EvidenceRecord, cand: EvidenceRecord, names: set[str]) -> list[Difference]:
    """The measurement-boundary fields that differ between the windows, each declared (as
    ``protocol.<field>``: ``warmup_steps`` alone is the learning-rate warm-up of the vocabulary) or not.

    Windows measured by different tools differ in how they were measured as a whole (`_measured_by`),
    not field by field.
    """
    if base.tool != cand.tool:
        return []
    b_proto, c_proto = _protocol(base), _protocol(cand)
    meaning = {**(IMPORTED_FIELDS if base.tool == IMPORT_TOOL else LAUNCHED_FIELDS), **MEASURED_FIELDS}
    out: list[Difference] = []
    for key in changed_fields(b_proto, c_proto):
        declared = f"protocol.{key}" in names
        out.append(
            Difference(
                field=f"protocol.{key}",
                kind="protocol",
                baseline=_short(b_proto.get(key)),
                candidate=_short(c_proto.get(key)),
                classification="declared_protocol" if declared else "undeclared",
                note=f"the measurement boundary moved ({meaning.get(key, key)})"
                + (
                    ": declared"
                    if declared
                    else f"; re-measure with the baseline's {key}, or declare 'protocol.{key}' if it changed on "
                    "purpose"
                ),
            )
        )
    return out


def _batch_difference(
    base: EvidenceRecord, cand: EvidenceRecord, declared: list[str]
) -> Difference | str | None:
    """The global batch the harness measured on each side: a Difference when it changed (semantic, whatever
    the contracts say), what could not be compared when a side has no measurement, None when equal."""
    b_batch, c_batch = base.result.get("measured_batch"), cand.result.get("measured_batch")
    if not isinstance(b_batch, int) or not isinstance(c_batch, int):
        missing = [
            side for side, v in (("baseline", b_batch), ("candidate", c_batch)) if not isinstance(v, int)
        ]
        return (
            f"measured global batch ({' and '.join(missing)}: batch_source unverified, imported, or measured before "
            "perfgate counted the samples reaching the model)"
        )
    if b_batch == c_batch:
        return None
    declared_here = "global_batch" in {vocabulary_name(d) for d in declared}
    return Difference(
        field="measured.global_batch",
        kind="measured",
        baseline=b_batch,
        candidate=c_batch,
        classification="declared_semantic" if declared_here else "semantic",
        note="samples per optimizer step the harness counted reaching the model (or from the DataLoader), "
        f"{base.result.get('batch_source')} vs {cand.result.get('batch_source')}",
    )


def _contract(record: EvidenceRecord) -> Contract:
    """The declared contract: imported evidence stores the one it was read with (files carry their own)."""
    raw = record.result.get("contract") if record.tool == IMPORT_TOOL else record.inputs.get("contract")
    try:
        return Contract.from_mapping(as_dict(raw))
    except BenchmarkError as exc:
        raise ToolError(f"evidence {record.id}: {exc}; re-run the window with one name per entry") from exc


def _measured_by(record: EvidenceRecord) -> str:
    """How the step times were taken: launched by perfgate, or imported in a given format."""
    if record.tool == IMPORT_TOOL:
        return f"imported ({record.result.get('format')})"
    return "launched by perfgate"


def _observed(record: EvidenceRecord) -> dict[str, object]:
    fp = as_dict(record.result.get("environment_fingerprint"))
    out: dict[str, object] = {k: fp.get(k) for k in _OBSERVED_INVARIANTS}
    out["world_size"] = record.result.get("world_size")
    return out


def _busy_neighbours(records: list[EvidenceRecord], side: str) -> list[str]:
    """A warning per window whose launches ran beside a busy neighbour (other processes' CPU use)."""
    from perfgate.traces.hostload import BUSY_NEIGHBOUR_SHARE

    out: list[str] = []
    for r in records:
        loads = [as_dict(x) for x in cast("list[Any]", r.result.get("host_load") or [])]
        shares = [float(x.get("other_share") or 0.0) for x in loads if x.get("measured")]
        worst = max(shares, default=0.0)
        if worst >= BUSY_NEIGHBOUR_SHARE:
            out.append(
                f"{side} evidence {r.id} ran beside a busy neighbour (other processes took up to {worst:.0%} of "
                "its CPUs): its windows may be slowed; re-measure both sides on a quiet host before trusting "
                "the speedup"
            )
    return out


def _side_reasons(side: str, records: list[EvidenceRecord]) -> list[str]:
    reasons: list[str] = []
    for r in records:
        if r.profiled:
            reasons.append(
                f"{side} evidence {r.id} is profiled: profiler overhead makes it useless for throughput"
            )
        elif r.state not in _USABLE:
            why = r.result.get("failure_reason")
            reasons.append(f"{side} evidence {r.id} is {r.state.value}" + (f" ({why})" if why else ""))
    contracts = [_contract(r) for r in records]
    reasons += [f"{side}: {p}" for p in same_contract(contracts)]
    reasons += [f"{side}: {p}" for p in same_protocol([_protocol(r) for r in records])]
    for problem in sorted(
        {p for c in contracts for p in vocabulary_problems(c.invariants, c.execution, c.classes)}
    ):
        reasons.append(f"{side} contract: {problem}")
    if not any(c.invariants for c in contracts):
        reasons.append(
            f"{side} declares no contract invariants: re-run with contract.invariants (model, data, precision, "
            "shapes, global_batch, ...) so the comparison can show the workload stayed the same"
        )
    observed = {str(sorted(_observed(r).items())) for r in records}
    if len(observed) > 1:
        reasons.append(f"{side} windows ran on different devices or world sizes")
    batches = {b for r in records if isinstance(b := r.result.get("measured_batch"), int)}
    if len(batches) > 1:
        reasons.append(
            f"{side} windows measured different global batches ({', '.join(map(str, sorted(batches)))} samples per "
            "optimizer step): they are not one workload"
        )
    return reasons


def argv_options(tokens: list[str]) -> dict[str, str]:
    """Command-line options as name -> value: ``--lr 0.1``, ``--lr=0.1``, ``--train.batch-size 8`` (the last
    dotted segment, ``-`` as ``_``, lower case); an option followed by another option is a switch ('true')."""
    out: dict[str, str] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("-") or token.lstrip("-") == "" or _is_number(token):
            continue
        flag, eq, value = token.partition("=")
        name = flag.lstrip("-").replace("-", "_").lower().rsplit(".", 1)[-1]
        if not eq:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            value = (
                following
                if following is not None and (not following.startswith("-") or _is_number(following))
                else "true"
            )
        out[name] = value
    return out


def _argv_changes(b_argv: list[str], c_argv: list[str]) -> list[str]:
    """What differs between two command lines: each changed option (as `argv_options` names it), and
    'positional arguments' when the tokens outside options differ (another script, another order)."""
    b_opts, c_opts = argv_options(b_argv), argv_options(c_argv)
    changed = [f"--{o}" for o in sorted(set(b_opts) | set(c_opts)) if b_opts.get(o) != c_opts.get(o)]
    if _positionals(b_argv) != _positionals(c_argv):
        changed.append("positional arguments")
    return changed


def _positionals(tokens: list[str]) -> list[str]:
    """The tokens that are neither an option nor an option's value (read as `argv_options` reads them)."""
    out: list[str] = []
    value_next = False
    for token in tokens:
        is_option = token.startswith("-") and token.lstrip("-") != "" and not _is_number(token)
        if is_option:
            value_next = "=" not in token
        elif value_next:
            value_next = False
        else:
            out.append(token)
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _semantic_flag_differences(b_argv: list[str], c_argv: list[str], declared: list[str]) -> list[Difference]:
    """Options named by a semantic vocabulary key (``--batch``, ``--lr``, ``--seq-len``, ``--epochs``, ...)
    whose value differs: a semantic change whatever else was declared (declared by its vocabulary name it
    is a training change, comparable but never an equivalent speedup)."""
    b_opts, c_opts = argv_options(b_argv), argv_options(c_argv)
    names = {vocabulary_name(d) for d in declared} | {
        term.name for d in declared if (term := VOCABULARY.get(canonical_key(d))) is not None
    }
    out: list[Difference] = []
    for flag in sorted(set(b_opts) | set(c_opts)):
        term = VOCABULARY.get(canonical_key(flag))
        if term is None or term.cls != "semantic" or b_opts.get(flag) == c_opts.get(flag):
            continue
        declared_here = vocabulary_name(flag) in names or term.name in names
        out.append(
            Difference(
                field=f"argv.{flag}",
                kind="argv",
                baseline=b_opts.get(flag),
                candidate=c_opts.get(flag),
                classification="declared_semantic" if declared_here else "semantic",
                note=f"a command-line option naming the semantic key {term.name!r} ({term.meaning}) changed",
            )
        )
    return out


def argv_degrees(argv: Any) -> dict[str, str]:
    """Parallel degrees a command line sets (``--tensor-model-parallel-size 2``, ``--tp=2``,
    ``--parallelism.pipeline_parallel_degree 4``): vocabulary key -> the value given."""
    tokens = [str(x) for x in cast("list[Any]", argv)] if isinstance(argv, list) else []
    out: dict[str, str] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        flag, eq, value = token.partition("=")
        name = flag.lstrip("-").replace("-", "_").lower().rsplit(".", 1)[-1]
        if not eq:
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
        key = _FLAG_ONLY_DEGREES.get(name) or vocabulary_name(name)
        if key in _DEGREES and value.lstrip("-").isdigit():
            out[key] = value
    return out


def _argv_topology(
    base: EvidenceRecord, cand: EvidenceRecord, declared: list[str]
) -> tuple[list[str], list[str]]:
    """(parallel degrees the two command lines set differently, reasons): a degree changed on the command
    line is a topology change whatever else was declared, and a command line that contradicts its own
    contract's degree is named (what ran beats what was declared)."""
    b_deg, c_deg = argv_degrees(base.inputs.get("command")), argv_degrees(cand.inputs.get("command"))
    changed: list[str] = []
    reasons: list[str] = []
    names = {canonical_key(d) for d in declared}
    for key in sorted(set(b_deg) | set(c_deg)):
        if b_deg.get(key) != c_deg.get(key):
            changed.append(key)
            if key not in names:
                reasons.append(
                    f"the command line changes {key} ({b_deg.get(key, 'unset')} -> {c_deg.get(key, 'unset')}) but it "
                    f"was not declared: a parallel degree is a topology change; declare '{key}' and compare with "
                    "per_device=true"
                )
    for key in changed:
        missing = [
            side
            for side, record in (("baseline", base), ("candidate", cand))
            if key not in _contract(record).execution
        ]
        if missing:
            reasons.append(
                f"the command line changes {key} but the {' and '.join(missing)} "
                + ("contracts do" if len(missing) > 1 else "contract does")
                + " not declare it: "
                f"add execution.{key} (baseline {b_deg.get(key, 'unset')}, candidate {c_deg.get(key, 'unset')}) so the "
                "comparison is of what ran"
            )
    for side, record, degrees in (("baseline", base, b_deg), ("candidate", cand, c_deg)):
        execution = _contract(record).execution
        for key, value in degrees.items():
            if key in execution and str(execution[key]) != value:
                reasons.append(
                    f"the {side} command line sets {key}={value} but its contract declares {execution[key]}: fix "
                    "the contract to what ran"
                )
    return changed, reasons


def _difference_reasons(
    declared: list[str], diff: ContractDiff, differences: list[Difference], used: set[str]
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
    happened |= {d.kind for d in differences if d.kind in (_CODE, _ARGV)}
    happened |= {_CODE for d in differences if d.kind == "file"}
    for d in differences:
        if d.kind in ("env", "measured") or d.field.startswith("argv."):  # argv.<option>: a semantic option
            name = d.field.split(".", 1)[1]
            term = VOCABULARY.get(canonical_key(name))
            if term is not None:
                happened.add(term.name)
            if d.kind != "argv":  # where an entry shows (benchmarking.observed): the entry changed
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


def _caution(differs: list[str], verdict: str) -> str | None:
    """The answer's first line when the candidate may train differently."""
    if not differs:
        return None
    return (
        "training may differ: "
        + "; ".join(differs)
        + f". The '{verdict}' verdict is not an equivalent speedup until correctness evidence (compare_tensors, "
        "audit_samples, check_training_health) shows the candidate trains the same; a keep needs it, or "
        "classification 'training_change'"
    )


def _launch_infos(record: EvidenceRecord) -> dict[str, LaunchInfo]:
    """Launch tag (as the series samples carry it) -> when the server started it and its host load."""
    from perfgate.benchmarking.drift import LaunchInfo

    def column(name: str) -> list[Any]:
        value = record.result.get(name)
        return list(cast("list[Any]", value)) if isinstance(value, list) else []

    def number(values: list[Any], k: int) -> float | None:
        v = values[k] if k < len(values) else None
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    starts, speeds = column("launch_started_unix_s"), column("launch_host_speed")
    loads = [as_dict(x) for x in column("host_load")]
    out: dict[str, LaunchInfo] = {}
    for k in range(max(len(starts), len(speeds), len(loads), 1)):
        load = loads[k] if k < len(loads) and loads[k].get("measured") else {}
        share, job, other, cpus = (
            number([load.get(f)], 0) for f in ("other_share", "job_cpus", "other_cpus", "cpus")
        )
        free = (cpus - other) if cpus is not None and other is not None else None
        out[f"{record.id}:{k}"] = LaunchInfo(
            call=record.id,
            started_s=number(starts, k),
            other_share=share,
            host_speed=number(speeds, k),
            exposure=min(1.0, job / free) if job is not None and free is not None and free > 0 else None,
        )
    return out


def _training(rt: ToolRuntime, records: list[EvidenceRecord]) -> SideTraining:
    """One side's model facts, sample streams and per-launch losses (rank 0 records, hash-checked)."""
    from perfgate.benchmarking.errors import RecordError
    from perfgate.benchmarking.records import decode_record

    models: list[ModelShape | None] = []
    streams: list[str | None] = []
    losses: list[dict[int, float]] = []
    for r in records:
        m = as_dict(r.result.get("model"))
        models.append(
            ModelShape(str(m["name"]), int(m["parameters"]), str(m["structure"]))
            if isinstance(m.get("parameters"), int) and m.get("name") and m.get("structure")
            else None
        )
        streams.extend(
            s if isinstance(s, str) else None
            for s in cast("list[Any]", r.result.get("sample_streams") or [None])
        )
        for artifact in r.artifacts:
            if not (artifact.name.startswith("launch") and artifact.name.endswith("_rank0.json")):
                continue
            try:
                record = decode_record(read_artifact(rt.workspace, artifact), artifact.path)
            except (ArtifactChanged, RecordError):
                continue  # the loss is then unchecked for this launch, never taken as the same
            steps: dict[int, float] = {}
            for w in record.windows:
                for i, value in enumerate(w.loss or []):
                    if value is not None:
                        steps[w.first_step + i] = value
            losses.append(steps)
    return SideTraining(models=models, streams=streams, losses=losses)


async def _load(rt: ToolRuntime, ids: list[str]) -> list[EvidenceRecord]:
    records: list[EvidenceRecord] = []
    for evidence_id in ids:
        record = await rt.load(evidence_id)
        if record.tool not in _WINDOW_TOOLS and not record.profiled:
            raise ToolError(
                f"evidence {evidence_id} comes from {record.tool}, not {BENCHMARK_TOOL} or {IMPORT_TOOL}: pass "
                "benchmark window ids"
            )
        records.append(record)
    return records


def _samples(rt: ToolRuntime, record: EvidenceRecord) -> list[WindowSample]:
    from perfgate.benchmarking.series import SERIES_NAME, samples_from_series

    artifact = next((a for a in record.artifacts if a.name == SERIES_NAME), None)
    if artifact is None:
        raise ToolError(f"evidence {record.id} has no {SERIES_NAME} artifact: re-run run_benchmark_window")
    # Read once, and the bytes checked are the bytes used: the file is the agent's to write, and read a
    # second time after its hash was checked it could be another file by then.
    try:
        data = read_artifact(rt.workspace, artifact)
    except ArtifactChanged as exc:
        raise ToolError(
            f"evidence {record.id}: {exc} (`perfgate ledger verify` lists every change): re-measure the window"
        ) from exc
    try:
        return samples_from_series(data, artifact.path, launch_prefix=f"{record.id}:")
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc


def _per_device(windows: list[WindowSample], record: EvidenceRecord, per_device: bool) -> list[WindowSample]:
    """Step times x the measured world size (device-seconds per step) when comparing per device."""
    import dataclasses

    if not per_device:
        return windows
    world = record.result.get("world_size")
    n = world if isinstance(world, int) and world > 0 else 1
    return [dataclasses.replace(w, step_s=[t * n for t in w.step_s]) for w in windows]


async def run(inp: CompareBenchmarksInput, rt: ToolRuntime) -> CompareBenchmarksOutput:
    from perfgate.benchmarking.compare import compare_windows
    from perfgate.benchmarking.drift import interleaved_plan

    overlap = sorted(set(inp.baseline) & set(inp.candidate))
    if overlap:
        raise ToolError(f"evidence {overlap} is on both sides: a window cannot be its own baseline")
    base = await _load(rt, inp.baseline)
    cand = await _load(rt, inp.candidate)
    reasons = _side_reasons("baseline", base) + _side_reasons("candidate", cand)
    special = [
        d for d in inp.declared_changes if d.lower().startswith("env:") or canonical_key(d) in (_CODE, _ARGV)
    ]
    diff = diff_contracts(
        _contract(base[0]), _contract(cand[0]), [d for d in inp.declared_changes if d not in special]
    )
    differences, unverified, used = _differences(base[0], cand[0], inp.declared_changes, diff)
    reasons += _difference_reasons(inp.declared_changes, diff, differences, used)
    sources = {_measured_by(r) for r in base + cand}
    if len(sources) > 1:
        reasons.append(
            f"the windows were measured in different ways ({', '.join(sorted(sources))}): a trainer's own log "
            "timer and perfgate's window are not the same measurement; import both sides or launch both"
        )
    imported = [r.id for r in base + cand if r.tool == IMPORT_TOOL]
    busy = _busy_neighbours(base, "baseline") + _busy_neighbours(cand, "candidate")
    b_obs, c_obs = _observed(base[0]), _observed(cand[0])
    actual = list(diff.actual_changes)
    for key in _OBSERVED_EXECUTION:
        declared_in_contract = key in _contract(base[0]).execution or key in _contract(cand[0]).execution
        if b_obs.get(key) != c_obs.get(key) and not declared_in_contract:
            actual.append(key)
            if key not in inp.declared_changes:
                reasons.append(
                    f"measured {key} changed ({b_obs.get(key)} -> {c_obs.get(key)}) but was not declared"
                )
    argv_changed, argv_reasons = _argv_topology(base[0], cand[0], inp.declared_changes)
    # a declared degree the contracts do not change but the command lines do is explained by argv_reasons
    explained = tuple(f"declared change '{k}' did not happen" for k in argv_changed)
    reasons = [r for r in reasons if not r.startswith(explained)] + argv_reasons
    actual += argv_changed
    topology = sorted({canonical_key(k) for k in actual} & set(_TOPOLOGY))
    if topology and not inp.per_device:
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
    ev = rt.evidence()
    common: dict[str, Any] = {
        "evidence_id": ev.id,
        "differences": differences,
        "unverified": unverified,
        "confidence": 0.95,
        "actual_changes": sorted(set(actual)),
        "declared_changes": sorted(set(inp.declared_changes)),
        "method": "speedup = candidate / baseline throughput, each pooled as total work / total time over its "
        + ("windows, per device (step time x measured world size);" if inp.per_device else "windows;")
        + " 95% interval = the union of a Welch t interval on per-launch log throughputs and a two-level "
        "bootstrap (launches, then steps; 2000 resamples, seed 0), widened to contain the speedup; "
        f"improved/regressed when the interval excludes 1 and the effect is at least {inp.min_effect:g}, and "
        "only with at least 2 launches per side",
    }
    if reasons:
        out = CompareBenchmarksOutput(
            **common,
            state=EvidenceState.FAILED,
            status="incomparable",
            verdict="incomparable",
            reasons=reasons,
            speedup=None,
            ci_low=None,
            ci_high=None,
            unit=None,
            baseline_throughput=None,
            candidate_throughput=None,
            baseline_windows=0,
            candidate_windows=0,
            baseline_launches=0,
            candidate_launches=0,
            median_step_speedup=None,
            warnings=busy,
        )
        return await rt.commit(ev, out)
    base_windows = [w for r in base for w in _per_device(_samples(rt, r), r, inp.per_device)]
    cand_windows = [w for r in cand for w in _per_device(_samples(rt, r), r, inp.per_device)]
    launches = {tag: info for r in base + cand for tag, info in _launch_infos(r).items()}
    settle = interleaved_plan(f"the inputs of {base[0].id}", f"the inputs of {cand[0].id}")
    try:
        result = await anyio.to_thread.run_sync(
            lambda: compare_windows(
                base_windows, cand_windows, min_effect=inp.min_effect, launches=launches, settle=settle
            )
        )
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc
    training = await anyio.to_thread.run_sync(
        lambda: training_differences(_training(rt, base), _training(rt, cand))
    )
    decisive = result.verdict in ("improved", "regressed")
    drift = result.drift
    common["method"] += "; " + (
        "the sides' launches are interleaved in time, so host drift hits both"
        if drift is not None and drift.design == "interleaved"
        else "the sides were not interleaved: the drift measured between them (time trend, A/A across calls, "
        "host load) widens the interval, and an effect no larger than it is within_noise"
    )
    out = CompareBenchmarksOutput(
        **common,
        caution=_caution(training.differs, result.verdict),
        drift=None
        if drift is None
        else DriftReport(
            design=drift.design,
            order=drift.order,
            drift_factor=drift.factor,
            sources=drift.sources,
            unmeasured=drift.unmeasured,
            summary=drift.describe(),
        ),
        training_may_differ=training.differs,
        training_unchecked=training.unchecked,
        state=EvidenceState.PASSED if decisive else EvidenceState.EXECUTED,
        status="comparable",
        verdict=result.verdict,
        reasons=[],
        speedup=result.speedup,
        ci_low=result.ci_low,
        ci_high=result.ci_high,
        unit=result.unit,
        baseline_throughput=result.baseline_throughput,
        candidate_throughput=result.candidate_throughput,
        baseline_windows=result.baseline_windows,
        candidate_windows=result.candidate_windows,
        baseline_launches=result.baseline_launches,
        candidate_launches=result.candidate_launches,
        median_step_speedup=result.median_step_speedup,
        warnings=result.warnings
        + (
            [
                f"evidence {', '.join(imported)} is imported, not launched by perfgate: the step times are what "
                "the trainer logged, bound to no environment unless one was attached"
            ]
            if imported
            else []
        )
        + busy,
    )
    base_ms = [t * 1e3 for w in base_windows for t in w.step_s]
    cand_ms = [t * 1e3 for w in cand_windows for t in w.step_s]
    interval = (result.ci_low, result.ci_high)
    await rt.plot(
        ev,
        "ab_step_times.png",
        lambda: ab_distribution_png(base_ms, cand_ms, result.speedup, interval),
        key=True,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="compare_benchmarks",
    title="Compare benchmark windows (A/B)",
    description=(
        "A/B of baseline and candidate windows: speedup with a 95% interval and a verdict; refuses undeclared "
        "differences. A keep needs it. Setting names: skill://perfgate/references/vocabulary.md"
    ),
    details=(
        "Compare baseline and candidate run_benchmark_window (or import_benchmark) evidence: speedup of "
        "pooled throughput with a 95% interval over launches and steps, and a verdict (improved / regressed "
        "/ within_noise; insufficient_launches with fewer than 2 separate launches a side). Refuses "
        "(incomparable, "
        "with reasons) when contract invariants differ, when the changed execution settings or measurement "
        "protocol (warm-up, measured steps, timing, repeats, samples per step, log pattern) differ from "
        "declared_changes (undeclared or declared-but-absent), or when any window is profiled or failed. "
        "Warns under 3 launches per side. Its evidence is what record_decision needs for a 'keep'. Setting "
        "names: skill://perfgate/references/vocabulary.md."
    ),
    input_model=CompareBenchmarksInput,
    output_model=CompareBenchmarksOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
