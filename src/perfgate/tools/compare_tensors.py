"""compare_tensors: numeric parity of two tensor files or checkpoints under declared tolerances.

The tensor library (numpy, ml_dtypes) is imported where it is used, to keep server start-up fast.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.report.plots import tensor_errors_png
from perfgate.security.digests import ALGORITHM, format_digest
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec
from perfgate.tools.compare_tensors_models import (
    MAX_LISTED,
    CompareTensorsOutput,
    DtypeTolerance,
    FileProducer,
    InputFile,
    TensorResult,
)

if TYPE_CHECKING:
    from perfgate.security.digests import Algorithm
    from perfgate.tensors import CompareOptions, TensorComparison

__all__ = [
    "SPEC",
    "CompareTensorsInput",
    "CompareTensorsOutput",
    "FileProducer",
    "InputFile",
    "KeyMapInput",
    "TensorResult",
    "ToleranceOverrideInput",
    "run",
]


NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ToleranceOverrideInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(
        min_length=1, description="Glob matched against tensor keys, e.g. '*.bias', 'lm_head.*'."
    )
    atol: NonNegative = Field(description="Absolute tolerance for the matching keys.")
    rtol: NonNegative = Field(description="Relative tolerance for the matching keys (scales |reference|).")


class KeyMapInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strip_prefixes: list[str] = Field(
        default=[],
        description="Leading strings removed from every key on both sides while one matches, e.g. "
        "'_orig_mod.' (torch.compile) or 'module.' (DDP).",
    )
    drop_segments: list[str] = Field(
        default=[],
        description="Dotted path segments removed wherever they occur, e.g. '_orig_mod' for a compiled "
        "submodule (layers.0._orig_mod.weight), '_fsdp_wrapped_module', '_checkpoint_wrapped_module'.",
    )
    rename: dict[str, str] = Field(
        default={},
        description="Exact renames applied after stripping, on both sides: {stored name: name compared}, "
        "e.g. for a converted checkpoint whose tensors are named differently.",
    )


class CompareTensorsInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reference: Annotated[
        str,
        Field(
            min_length=1,
            description="The trusted baseline, relative to the workspace: a .safetensors, .npz or .npy file, "
            "a checkpoint index (*.index.json) or a folder of shards.",
        ),
    ]
    candidate: Annotated[
        str,
        Field(min_length=1, description="The tensors produced with the change, in any of the same forms."),
    ]
    atol: Annotated[
        NonNegative | None,
        Field(description="Absolute tolerance for this task's dtype (or from experiment_id)."),
    ] = None
    rtol: Annotated[
        NonNegative | None,
        Field(
            description="Relative tolerance declared for this task; an element passes when "
            "|candidate - reference| <= atol + rtol * |reference|."
        ),
    ] = None
    experiment_id: Annotated[
        str | None,
        Field(
            description="The experiment this check is for: omitted atol/rtol/overrides take what its open fixed.",
        ),
    ] = None
    overrides: Annotated[
        list[ToleranceOverrideInput],
        Field(description="Per-key tolerances by glob; the first matching pattern wins over atol/rtol."),
    ] = []
    allow_nonfinite: Annotated[
        bool,
        Field(
            description="Explicit, recorded opt-in: let matching non-finite values agree (equal infinities; NaN "
            "at the same position with equal_nan). By default any NaN or Inf on either side fails the tensor."
        ),
    ] = False
    equal_nan: Annotated[
        bool,
        Field(description="With allow_nonfinite: treat NaN in both at the same position as equal."),
    ] = False
    keys: Annotated[
        list[str] | None,
        Field(
            description="Compare only keys matching any of these globs (missing/extra are computed on them)."
        ),
    ] = None
    integers_exact: Annotated[
        bool,
        Field(
            description="Compare integer and bool tensors exactly (default). False applies atol/rtol to them."
        ),
    ] = True
    allow_dtype_change: Annotated[
        bool,
        Field(
            description="Accept a candidate dtype that differs from the reference (e.g. bfloat16 vs float32) "
            "and judge values alone; otherwise such tensors are reported as dtype_mismatch."
        ),
    ] = False

    key_map: Annotated[
        KeyMapInput | None,
        Field(
            description="Rename keys before pairing, so a compiled or wrapped model's dump compares with an "
            "eager one without editing files; keys, overrides and the result use the mapped names, and the "
            "evidence records the original key on each side."
        ),
    ] = None

    @field_validator("keys")
    @classmethod
    def _keys_not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("give at least one glob, or omit keys to compare every tensor")
        return value


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _tensor_result(t: TensorComparison) -> TensorResult:
    # Field by field, not dataclasses.asdict: that deep-copies every shape list (most of a many-tensor
    # call's result building).
    fields = {f.name: _finite_or_none(getattr(t, f.name)) for f in dataclasses.fields(t)}
    for side in ("reference_key", "candidate_key"):
        if fields[side] == t.key:
            fields[side] = None
    return TensorResult.model_validate(fields)


def _options(inp: CompareTensorsInput, key_map: KeyMapInput) -> CompareOptions:
    from perfgate.tensors import CompareOptions, KeyMapping, TensorInputError, ToleranceOverride

    try:
        mapping = KeyMapping(
            strip_prefixes=tuple(key_map.strip_prefixes),
            drop_segments=tuple(key_map.drop_segments),
            rename=tuple(key_map.rename.items()),
        )
        assert inp.atol is not None and inp.rtol is not None  # filled by `_declared` where omitted
        return CompareOptions(
            atol=inp.atol,
            rtol=inp.rtol,
            overrides=tuple(ToleranceOverride(o.pattern, o.atol, o.rtol) for o in inp.overrides),
            equal_nan=inp.equal_nan,
            allow_nonfinite=inp.allow_nonfinite,
            keys=None if inp.keys is None else tuple(inp.keys),
            integers_exact=inp.integers_exact,
            allow_dtype_change=inp.allow_dtype_change,
            key_mapping=mapping,
        )
    except TensorInputError as exc:
        raise ToolError(str(exc)) from exc


def _declared(inp: CompareTensorsInput, rt: ToolRuntime) -> CompareTensorsInput:
    """``inp`` with what it left out taken from its experiment's tolerance (recorded as applied).

    Raises:
        ToolError: no tolerance and no experiment, or an experiment that does not exist.
    """
    from perfgate.decisions.experiments import load_experiment

    if inp.experiment_id is None:
        if inp.atol is None or inp.rtol is None:
            raise ToolError(
                "give atol and rtol for this task's dtype, or experiment_id to use the tolerance the "
                "experiment's open fixed"
            )
        return inp
    exp = load_experiment(rt.ledger, inp.experiment_id)
    if exp is None:
        raise ToolError(
            f"no experiment {inp.experiment_id!r}: open one with record_decision(action='open', ...), or give "
            "atol and rtol"
        )
    tol = exp.tolerance
    update: dict[str, Any] = {}
    if inp.atol is None:
        update["atol"] = tol.atol
    if inp.rtol is None:
        update["rtol"] = tol.rtol
    if not inp.overrides and tol.groups:
        update["overrides"] = [ToleranceOverrideInput(pattern=p, atol=a, rtol=r) for p, a, r in tol.groups]
    out = inp.model_copy(update=update)
    rt.inputs.update(out.model_dump(mode="json", include=set(update)))  # the record shows what was applied
    return out


async def run(inp: CompareTensorsInput, rt: ToolRuntime) -> CompareTensorsOutput:
    from perfgate.decisions.equivalence import tolerance_by_dtype
    from perfgate.tensors import TensorInputError
    from perfgate.tensors.producers import FileDigests, digest_algorithms, find_producers
    from perfgate.tensors.session import compare_files
    from perfgate.tensors.verdict import check_notes, problems_first, summary

    if inp.equal_nan and not inp.allow_nonfinite:
        raise ToolError(
            "equal_nan applies only with allow_nonfinite=true: by default any NaN or Inf fails parity. Pass "
            "allow_nonfinite=true (recorded with the evidence) if matching non-finite values are acceptable"
        )
    inp = await anyio.to_thread.run_sync(_declared, inp, rt)
    ref_path = rt.resolve_path(inp.reference)
    cand_path = rt.resolve_path(inp.candidate)
    key_map = inp.key_map or KeyMapInput()
    options = _options(inp, key_map)

    def confine(path: Path) -> Path:
        return rt.resolve_path(str(path), kind="file")

    def algorithms(paths: tuple[Path, ...]) -> list[Algorithm]:
        return digest_algorithms(rt.ledger, {rt.relative(p) for p in paths})

    try:
        parity = await compare_files(
            ref_path, cand_path, options, confine=confine, algorithms=algorithms, progress=rt.progress
        )
    except TensorInputError as exc:
        raise ToolError(str(exc)) from exc
    report = parity.report

    ev = rt.evidence()
    if parity.histograms:
        title = "Absolute error of the most mismatched tensors"
        histograms = parity.histograms
        await rt.plot(ev, "error_histograms.png", lambda: tensor_errors_png(histograms, title), key=True)
    files = [
        InputFile(
            role=f.role,
            path=rt.relative(f.path),
            digest=format_digest(ALGORITHM, f.digests[ALGORITHM]),
            other_digests=[format_digest(a, h) for a, h in f.digests.items() if a != ALGORITHM],
            size_bytes=f.size_bytes,
        )
        for f in parity.files
    ]
    digests = [FileDigests(f.role, f.path, f.digest, tuple(f.other_digests)) for f in files]
    found = await anyio.to_thread.run_sync(find_producers, rt.ledger, digests)
    producers = [FileProducer.model_validate(dataclasses.asdict(p)) for p in found]
    by_dtype = [
        DtypeTolerance.model_validate(dataclasses.asdict(d)) for d in tolerance_by_dtype(report.tensors)
    ]
    notes = check_notes(
        report,
        unbound=[f"{p.role} {p.path}" for p in producers if p.evidence_id is None],
        allow_nonfinite=inp.allow_nonfinite,
        beyond_ceiling=[d.dtype for d in by_dtype if not d.within_ceiling],
    )
    results = [_tensor_result(t) for t in report.tensors]
    full = {
        "status": report.status,
        "summary": report.summary,
        "tensors": [r.model_dump(mode="json") for r in results],
        "missing_keys": report.missing_keys,
        "extra_keys": report.extra_keys,
        "files": [f.model_dump(mode="json") for f in files],
        "producers": [p.model_dump(mode="json") for p in producers],
        "notes": notes,
        "key_mapping": {
            **key_map.model_dump(mode="json"),
            "mapped": [dataclasses.asdict(m) for m in report.mapped_keys],
        },
    }
    await anyio.to_thread.run_sync(ev.write_json, "comparison.json", full)
    listed = [results[i] for i in problems_first(report.tensors)[:MAX_LISTED]]
    out = CompareTensorsOutput(
        evidence_id=ev.id,
        state=EvidenceState.PASSED if report.status == "match" else EvidenceState.FAILED,
        status=report.status,
        summary=summary(report),
        tensors=listed,
        tensors_total=len(report.tensors),
        missing_keys=report.missing_keys[:MAX_LISTED],
        missing_keys_total=len(report.missing_keys),
        extra_keys=report.extra_keys[:MAX_LISTED],
        extra_keys_total=len(report.extra_keys),
        keys_mapped=len(report.mapped_keys),
        elements_compared=report.elements_compared,
        bytes_compared=report.bytes_read,
        files=files,
        producers=producers,
        tolerance_by_dtype=by_dtype,
        notes=notes,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="compare_tensors",
    title="Compare tensors (numeric parity)",
    description=(
        "Numeric parity of candidate and reference tensors (safetensors, NPZ/NPY, sharded folders) within "
        "declared atol/rtol: a keep's correctness evidence (files from perfgate.harness.dump_tensors)."
    ),
    details=(
        "Check that a candidate's tensors (outputs, losses, gradients, activations or weights) agree with a "
        "reference within tolerances you declare for the task: |candidate - reference| <= atol + rtol * "
        "|reference|, as torch.testing.assert_close, computed in float64. Reads safetensors (bfloat16 and "
        "float8 included), NPZ/NPY (never unpickled) and sharded checkpoint folders, streaming in bounded "
        "memory. Use it as correctness evidence before keeping an optimization; dump tensors from training "
        "with perfgate.harness.dump_tensors inside the runs run_benchmark_window launches: each file's producer (the run "
        "that dumped those bytes, matched by BLAKE3 digest taken in the comparison's own reads) is recorded, and a file no launched run produced is unbound and cannot support a "
        "keep. The evidence passes only on status 'match'. Integers compare "
        "exactly; any NaN or Inf fails unless allow_nonfinite (a recorded opt-in). key_map strips wrapper prefixes such as '_orig_mod.' "
        "and renames keys before pairing (recorded in the evidence), so a compiled model compares with an "
        "eager one."
    ),
    input_model=CompareTensorsInput,
    output_model=CompareTensorsOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
