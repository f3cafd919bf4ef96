"""Every difference between the first baseline and candidate windows, each classified (declared, undeclared
or semantic): contract, measurement protocol, environment variables, command line, code and the files it
names, the measured environment and the measured global batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from perfgate.benchmarking.comparing.identity import ran_argv, written_by
from perfgate.benchmarking.comparing.sides import (
    IMPORT_TOOL,
    record_contract,
    record_protocol,
    record_provenance,
)
from perfgate.benchmarking.workload.argv import argv_changes, argv_options
from perfgate.benchmarking.workload.observed import Place, entries_showing, explains, option_name
from perfgate.benchmarking.workload.outputs import output_paths
from perfgate.benchmarking.workload.protocol import (
    IMPORTED_FIELDS,
    LAUNCHED_FIELDS,
    MEASURED_FIELDS,
    changed_fields,
)
from perfgate.benchmarking.workload.provenance import code_differences
from perfgate.benchmarking.workload.vocabulary import VOCABULARY, canonical_key, classify, vocabulary_name
from perfgate.evidence.access import as_dict

if TYPE_CHECKING:
    from perfgate.benchmarking.workload.contract import ContractDiff
    from perfgate.evidence import EvidenceRecord

__all__ = [
    "ARGV",
    "CODE",
    "Classification",
    "Difference",
    "DifferenceKind",
    "Differences",
    "declared_names",
    "find_differences",
    "semantic_flag_differences",
]

CODE = "code"
"""The declared name that covers a change of the code and of the files the command names."""
ARGV = "argv"
"""The declared name that covers a command-line change of its own."""

DifferenceKind = Literal["contract", "env", "argv", "code", "file", "measured", "protocol"]
Classification = Literal[
    "declared_execution", "declared_semantic", "declared_protocol", "undeclared", "semantic"
]


@dataclass(frozen=True)
class Difference:
    """One difference: where (``field``, e.g. 'env.OMP_NUM_THREADS'), each side's value, how it is
    classified, and a note that says why or what to do."""

    field: str
    kind: DifferenceKind
    baseline: Any
    candidate: Any
    classification: Classification
    note: str


@dataclass
class Differences:
    """``items`` in the order found; ``unverified``: what a side does not know (never counted as the same);
    ``used``: the declared names that explain some difference outside the contract."""

    items: list[Difference] = field(default_factory=list[Difference])
    unverified: list[str] = field(default_factory=list[str])
    used: set[str] = field(default_factory=set[str])


def declared_names(declared: Sequence[str]) -> set[str]:
    """Declared names as compared: canonical, with 'env:' stripped."""
    return {canonical_key(d[4:] if d.lower().startswith("env:") else d) for d in declared}


def _class_of(place: Place, name: str, classes: dict[str, str]) -> tuple[str | None, str]:
    """(class, source) of a setting seen at ``name``: the vocabulary's or the caller's for the name itself,
    else the class of the entry that shows there (benchmarking.workload.observed)."""
    cls, source = classify(option_name(name) if place == "option" else name, classes)
    if cls is None and (entries := entries_showing(place, name)):
        return VOCABULARY[entries[0]].cls, f"shows {entries[0]}"
    return cls, source


def _short(value: Any) -> Any:
    return value[:200] + "..." if isinstance(value, str) and len(value) > 200 else value


def find_differences(
    base: EvidenceRecord, cand: EvidenceRecord, declared: Sequence[str], diff: ContractDiff
) -> Differences:
    """Every difference between the first baseline and candidate windows, classified against ``declared``
    (``diff``: the contracts' own diff under the declared changes).

    Raises:
        BenchmarkError: a side's stored contract names one entry twice.
    """
    out = Differences()
    b_contract, c_contract = record_contract(base), record_contract(cand)
    classes = {**b_contract.classes, **c_contract.classes}
    for key in diff.changed_invariants:
        declared_here = key in declared
        out.items.append(
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
        out.items.append(
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
    out.items += protocol_differences(base, cand, declared_names(declared))
    _env_differences(out, base, cand, declared, classes)
    _argv_differences(out, base, cand, declared)
    _code_differences(out, base, cand, declared)
    _fingerprint_differences(out, base, cand, declared, classes)
    batch = _batch_difference(base, cand, declared)
    if isinstance(batch, str):
        out.unverified.append(batch)
    elif batch is not None:
        out.items.append(batch)
    return out


_MEASURED_STATES = ("executed", "passed")
"""States of a window that measured (`perfgate.benchmarking.comparing.comparability.USABLE`)."""


def protocol_differences(base: EvidenceRecord, cand: EvidenceRecord, names: set[str]) -> list[Difference]:
    """The measurement-boundary fields that differ between the windows, each declared (as
    ``protocol.<field>``: ``warmup_steps`` alone is the learning-rate warm-up of the vocabulary) or not.

    Windows measured by different tools differ in how they were measured as a whole (`sides.measured_by`),
    not field by field.
    """
    if base.tool != cand.tool:
        return []
    b_proto, c_proto = record_protocol(base), record_protocol(cand)
    meaning = {**(IMPORTED_FIELDS if base.tool == IMPORT_TOOL else LAUNCHED_FIELDS), **MEASURED_FIELDS}
    out: list[Difference] = []
    for key in changed_fields(b_proto, c_proto):
        if key in MEASURED_FIELDS and any(
            key not in proto and r.state.value not in _MEASURED_STATES
            for proto, r in ((b_proto, base), (c_proto, cand))
        ):
            continue  # a failed window measured nothing: the comparison names it as failed, with its reason
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


def _env_differences(
    out: Differences,
    base: EvidenceRecord,
    cand: EvidenceRecord,
    declared: Sequence[str],
    classes: dict[str, str],
) -> None:
    """Variables set for the run: declared where the declared setting shows (benchmarking.workload.observed)."""
    b_env = {str(k): str(v) for k, v in as_dict(base.inputs.get("env")).items()}
    c_env = {str(k): str(v) for k, v in as_dict(cand.inputs.get("env")).items()}
    for name in sorted(set(b_env) | set(c_env)):
        if b_env.get(name) == c_env.get(name):
            continue
        cls, source = _class_of("env", name, classes)
        if (by := explains(declared, "env", name)) is not None:
            verdict: Classification = "declared_semantic" if cls == "semantic" else "declared_execution"
            out.used.add(by)
        else:
            verdict = "semantic" if cls == "semantic" else "undeclared"
        out.items.append(
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


_MEASURED_SEMANTIC: dict[str, str] = {"global_batch": "measured_batch"}
"""Semantic entries the harness measures itself (entry -> the window result's field): an option named
after one is judged by the measurement, not by its name."""

_VERIFIED_BATCH = ("model_inputs", "data_loader")


def measured_alike(base: EvidenceRecord, cand: EvidenceRecord) -> frozenset[str]:
    """The measured semantic entries whose measurement both sides hold and agree on (the global batch
    counted at the model's inputs or from the DataLoader, equal on both sides)."""
    same: set[str] = set()
    for entry, key in _MEASURED_SEMANTIC.items():
        b, c = base.result.get(key), cand.result.get(key)
        sources = (base.result.get("batch_source"), cand.result.get("batch_source"))
        if isinstance(b, int) and b == c and all(s in _VERIFIED_BATCH for s in sources):
            same.add(entry)
    return frozenset(same)


def semantic_flag_differences(
    b_argv: list[str], c_argv: list[str], declared: Sequence[str], alike: frozenset[str] = frozenset()
) -> list[Difference]:
    """Options named by a semantic vocabulary key (``--batch``, ``--lr``, ``--seq-len``, ``--epochs``, ...)
    whose value differs: a semantic change whatever else was declared (declared by its vocabulary name it
    is a training change, comparable but never an equivalent speedup).

    A batch-named option is left out when the global batch is in ``alike`` (measured on both sides and
    equal) and a micro-batch or accumulation change is declared: the measurement shows the name misleads
    (nanoGPT's ``--batch_size`` is the micro-batch) and the declared split explains the option."""
    b_opts, c_opts = argv_options(b_argv), argv_options(c_argv)
    names = {vocabulary_name(d) for d in declared} | {
        term.name for d in declared if (term := VOCABULARY.get(canonical_key(d))) is not None
    }
    out: list[Difference] = []
    for flag in sorted(set(b_opts) | set(c_opts)):
        term = VOCABULARY.get(canonical_key(flag))
        if term is None or term.cls != "semantic" or b_opts.get(flag) == c_opts.get(flag):
            continue
        if _batch_split_explains(declared, flag, alike):
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


def _argv_differences(
    out: Differences, base: EvidenceRecord, cand: EvidenceRecord, declared: Sequence[str]
) -> None:
    """The command lines (imported evidence has none), with how they were launched (a Slurm launch's
    resources), each value its run wrote read as an output (`identity.ran_argv`: a dump or log path each
    side wrote is no setting; one a side did not write still is): a changed semantic flag explains its own tokens, declared or not (its difference says
    which); any other changed option must be one a declared change sets, and the rest of argv the same."""
    b_list, c_list = ran_argv(base), ran_argv(cand)
    if b_list is None or c_list is None or b_list == c_list:
        return
    changed = [
        i
        for i in range(max(len(b_list), len(c_list)))
        if i >= len(b_list) or i >= len(c_list) or b_list[i] != c_list[i]
    ]
    alike = measured_alike(base, cand)
    semantic_flags = semantic_flag_differences(b_list, c_list, declared, alike)
    out.items.extend(semantic_flags)
    flagged = {"--" + d.field.removeprefix("argv.") for d in semantic_flags}
    unexplained: list[str] = []
    for o in argv_changes(b_list, c_list):
        by = explains(declared, "option", o) if o.startswith("--") else None
        if by is None and o.startswith("--") and (by := _batch_split_explains(declared, o, alike)):
            out.items.append(
                Difference(
                    field=f"argv.{o.lstrip('-')}",
                    kind="argv",
                    baseline=argv_options(b_list).get(o[2:]),
                    candidate=argv_options(c_list).get(o[2:]),
                    classification="declared_execution",
                    note=f"named like the global batch, but the harness measured the same global batch "
                    f"({base.result.get('measured_batch')}) on both sides: attributed to the declared {by!r}",
                )
            )
        if by is not None:
            out.used.add(by)  # the command line is what ran: a declared option that changed happened
        elif o not in flagged:
            unexplained.append(o)
    names = declared_names(declared)
    ok = ARGV in names or not unexplained
    if ARGV in names:
        out.used.add(ARGV)
    settable = {o: e[0] for o in unexplained if (e := entries_showing("option", o))}
    out.items.append(
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
                + (" (" + ", ".join(f"{o} sets {e!r}" for o, e in settable.items()) + ")" if settable else "")
                + ": declare the setting it changes, or 'argv' for a command-line change of its own"
            ),
        )
    )


_BATCH_SPLIT = ("microbatch", "accumulation")
_BARE_BATCH = ("batch_size", "batch")
"""Batch spellings whose meaning varies by framework (nanoGPT's ``--batch_size`` is the micro-batch, a
bare ``--batch`` elsewhere the global one); ``--global-batch-size`` and the like say what they are."""


def _batch_split_explains(declared: Sequence[str], option: str, alike: frozenset[str]) -> str | None:
    """A bare batch option (`_BARE_BATCH`) whose global batch the harness measured unchanged splits that
    batch another way: a declared micro-batch or accumulation change explains it (the contract check holds the declared
    accumulation to the backward passes counted)."""
    if option_name(option) not in _BARE_BATCH or "global_batch" not in alike:
        return None
    return next((d for d in declared if vocabulary_name(d) in _BATCH_SPLIT), None)


def _code_differences(
    out: Differences, base: EvidenceRecord, cand: EvidenceRecord, declared: Sequence[str]
) -> None:
    """The git code state and the workspace files the command names, each covered by a declared 'code';
    paths either run wrote (its outputs, and what an earlier call left there) are no code."""
    names = declared_names(declared)
    written = output_paths(base.result) + output_paths(cand.result)
    b_prov, c_prov = record_provenance(base), record_provenance(cand)
    b_code, c_code = as_dict(b_prov.get("code")), as_dict(c_prov.get("code"))
    if not b_prov or not c_prov:
        out.unverified.append("code state and argv files (a side has no recorded provenance)")
        return
    if b_code.get("commit") is None or c_code.get("commit") is None:
        out.unverified.append(
            "git code state ("
            + str(b_code.get("unknown_reason") or c_code.get("unknown_reason") or "unknown")
            + ")"
        )
    elif paths := [p for p in code_differences(b_code, c_code) if not written_by(p, written)]:
        if CODE in names:
            out.used.add(CODE)
        out.items.append(
            Difference(
                field="code",
                kind="code",
                baseline={"commit": b_code.get("commit"), "diff": b_code.get("diff_artifact")},
                candidate={"commit": c_code.get("commit"), "diff": c_code.get("diff_artifact")},
                classification="declared_execution" if CODE in names else "undeclared",
                note="code differs in " + ", ".join(paths[:20]) + " (diffs are the evidence's code.diff "
                "artifacts); declare 'code'",
            )
        )
    b_files, c_files = as_dict(b_prov.get("files")), as_dict(c_prov.get("files"))
    for path in sorted(set(b_files) | set(c_files)):
        if b_files.get(path) == c_files.get(path) or path not in b_files or path not in c_files:
            continue  # a file only one side names is an argv difference
        if written_by(path, written):
            continue  # what an earlier run left at an output path: not what this one ran
        if CODE in names:
            out.used.add(CODE)
        out.items.append(
            Difference(
                field=f"file:{path}",
                kind="file",
                baseline=b_files[path],
                candidate=c_files[path],
                classification="declared_execution" if CODE in names else "undeclared",
                note="a workspace file the command names changed (sha256 shown); declare 'code'",
            )
        )


def _fingerprint_differences(
    out: Differences,
    base: EvidenceRecord,
    cand: EvidenceRecord,
    declared: Sequence[str],
    classes: dict[str, str],
) -> None:
    """The environment measured inside the training process: a field differs only where a declared change
    shows there (benchmarking.workload.observed)."""
    b_fp = as_dict(base.result.get("environment_fingerprint"))
    c_fp = as_dict(cand.result.get("environment_fingerprint"))
    if not any(v is not None for v in b_fp.values()) or not any(v is not None for v in c_fp.values()):
        out.unverified.append("measured environment (a side has no fingerprint)")
        return
    for key in sorted(set(b_fp) | set(c_fp)):
        if key not in b_fp or key not in c_fp:
            out.unverified.append(f"measured.{key} (recorded on one side only)")
            continue
        if b_fp.get(key) == c_fp.get(key):
            continue
        cls, source = _class_of("fingerprint", key, classes)
        by = explains(declared, "fingerprint", key)
        if by is not None:
            out.used.add(by)
        if cls == "semantic":
            verdict: Classification = "declared_semantic" if by is not None else "semantic"
        else:
            verdict = "declared_execution" if by is not None else "undeclared"
        out.items.append(
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


def _batch_difference(
    base: EvidenceRecord, cand: EvidenceRecord, declared: Sequence[str]
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
