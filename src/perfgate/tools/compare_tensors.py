"""compare_tensors: numeric parity of two tensor files or checkpoints under declared tolerances.

The tensor library (numpy, ml_dtypes) is imported where it is used, to keep server start-up fast.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.digests import ALGORITHM, DIGEST_PATTERN, format_digest
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.report.plots import tensor_errors_png
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.digests import Algorithm
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

MAX_LISTED = 200
"""Most tensors (and missing/extra keys) listed in the result; the artifact holds all of them."""


Role = Literal["reference", "candidate"]
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
        NonNegative,
        Field(description="Absolute tolerance declared for this task (no default: choose it for the dtype)."),
    ]
    rtol: Annotated[
        NonNegative,
        Field(
            description="Relative tolerance declared for this task; an element passes when "
            "|candidate - reference| <= atol + rtol * |reference|."
        ),
    ]
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


class TensorResult(BaseModel):
    key: str
    status: Literal["match", "value_mismatch", "shape_mismatch", "dtype_mismatch"]
    shape_reference: list[int]
    shape_candidate: list[int]
    dtype_reference: str
    dtype_candidate: str
    compared_as: Literal["exact", "tolerance"] | None = Field(
        description="'exact' for integer/bool pairs, 'tolerance' otherwise, null when values were not compared."
    )
    atol: float
    rtol: float
    elements: int | None = Field(description="Element pairs compared; null when shapes differ.")
    mismatched: int | None = Field(
        description="Elements outside tolerance; every NaN/Inf position counts unless allow_nonfinite."
    )
    mismatched_fraction: float | None
    max_abs_error: float | None = Field(
        description="Largest |candidate - reference| over elements finite on both sides."
    )
    max_abs_error_index: list[int] | None = Field(description="Multi-dimensional index of max_abs_error.")
    max_rel_error: float | None = Field(
        description="Largest |candidate - reference| / |reference| over finite pairs with a non-zero reference."
    )
    max_abs_error_mismatched: float | None = Field(
        description="Largest absolute error among finite mismatched elements (what assert_close reports)."
    )
    max_rel_error_mismatched: float | None
    mean_abs_error: float | None
    cosine: float | None = Field(
        description="Cosine similarity over finite pairs; null if either is all zeros."
    )
    nonfinite_reference: int | None = Field(description="NaN and Inf elements in the reference.")
    nonfinite_candidate: int | None = Field(description="NaN and Inf elements in the candidate.")
    reference_key: str | None = Field(
        default=None, description="The key stored in the reference, when key_map changed it; else null."
    )
    candidate_key: str | None = Field(
        default=None, description="The key stored in the candidate, when key_map changed it; else null."
    )


class InputFile(BaseModel):
    role: Role
    path: str = Field(description="Path relative to the workspace (absolute when under a read root).")
    digest: str = Field(
        description="BLAKE3 of the bytes compared, with the algorithm's name: 'blake3:<hex>'.",
        pattern=DIGEST_PATTERN,
    )
    other_digests: list[str] = Field(
        default_factory=list[str],
        description="The same bytes under an older algorithm ('sha256:<hex>'), taken only when a run record "
        "written before BLAKE3 names a dump at this path.",
    )
    size_bytes: int


class FileProducer(BaseModel):
    role: Role
    path: str
    digest: str = Field(
        description="The digest that binds the file to its producer ('<algorithm>:<hex>', the algorithm the "
        "producer's record used); the file's BLAKE3 when unbound.",
        pattern=DIGEST_PATTERN,
    )
    evidence_id: str | None = Field(
        description="The benchmark window record whose launched run dumped exactly these bytes at this path "
        "(perfgate.harness.dump_tensors); null: unbound (no launched run is known to have produced it, e.g. a "
        "copied or edited file), and an unbound file cannot support a keep."
    )
    launch: int | None = Field(description="Which launch of that record wrote it.")
    code: dict[str, Any] | None = Field(
        description="The producing run's code state (git commit, dirty-diff digest), as its record holds it."
    )


class DtypeTolerance(BaseModel):
    dtype: str = Field(description="Reference dtype of the tensors compared with a tolerance.")
    tensors: int
    atol: float = Field(description="The loosest atol applied to them (overrides included).")
    rtol: float = Field(description="The loosest rtol applied to them.")
    equivalence_atol: float | None = Field(
        description="The shipped ceiling for an equivalent change at this dtype (null: none, only bit-exact)."
    )
    equivalence_rtol: float | None
    within_ceiling: bool = Field(
        description="False: a keep on this check cannot be an equivalent speedup (a training change at most)."
    )


class CompareTensorsOutput(BaseModel):
    evidence_id: str
    state: EvidenceState = Field(description="passed when status is match, failed otherwise.")
    status: Literal["match", "mismatch", "incomparable"] = Field(
        description="mismatch: some values exceed tolerance; incomparable: keys, shapes or dtypes differ; "
        "match: every common key agrees and the key sets are equal."
    )
    summary: str
    tensors: list[TensorResult] = Field(
        description=f"Per-key results, problems first; at most {MAX_LISTED} (all are in the comparison.json "
        "artifact)."
    )
    tensors_total: int
    missing_keys: list[str] = Field(description="Reference keys absent from the candidate (first ones).")
    missing_keys_total: int
    extra_keys: list[str] = Field(description="Candidate keys absent from the reference (first ones).")
    extra_keys_total: int
    keys_mapped: int = Field(
        description="Names key_map changed on either side (each with its originals in comparison.json)."
    )
    elements_compared: int
    bytes_compared: int
    files: list[InputFile] = Field(description="Every file read, with its digest (BLAKE3).")
    producers: list[FileProducer] = Field(
        default_factory=list[FileProducer],
        description="Per file read: the launched run that produced it, or unbound (evidence_id null).",
    )
    tolerance_by_dtype: list[DtypeTolerance] = Field(
        default_factory=list[DtypeTolerance],
        description="Per reference dtype compared with a tolerance: the loosest tolerance applied, and the "
        "shipped equivalence ceiling (torch.testing.assert_close defaults x the reordered-reduction allowance).",
    )
    notes: list[str]


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
        "declared atol/rtol: a keep's correctness evidence. Dump them with perfgate.harness.dump_tensors."
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
