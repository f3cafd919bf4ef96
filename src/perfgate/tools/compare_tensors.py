"""compare_tensors: numeric parity of two tensor files or checkpoints under declared tolerances.

The tensor library (numpy, ml_dtypes) is imported where it is used, to keep server start-up fast.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.digests import ALGORITHM, DIGEST_PATTERN, entry_digest, format_digest
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceRecord, EvidenceState
from perfgate.report.plots import tensor_errors_png
from perfgate.tools._runtime import ToolRuntime
from perfgate.tools._spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.digests import Algorithm
    from perfgate.tensors import CompareOptions, ComparisonReport, TensorComparison, TensorSource
    from perfgate.tensors.source import DigestJob

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

MAX_PLOTTED = 4
MAX_LISTED = 200
"""Most tensors (and missing/extra keys) listed in the result; the artifact holds all of them."""


Role = Literal["reference", "candidate"]
_Hashed = tuple[Role, Path, "dict[Algorithm, str]", int]
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


_SEVERITY = {"value_mismatch": 0, "shape_mismatch": 1, "dtype_mismatch": 2, "match": 3}


def _problems_first(tensors: list[TensorComparison]) -> list[int]:
    """Indices of ``tensors``, problems first (the worst fraction of mismatches first)."""
    return sorted(
        range(len(tensors)),
        key=lambda i: (_SEVERITY[tensors[i].status], -(tensors[i].mismatched_fraction or 0.0)),
    )


def _hash_jobs(jobs: list[tuple[Role, DigestJob]], stop: threading.Event) -> list[_Hashed]:
    """Run digest jobs, one thread per file up to the usable CPUs (the hashers release the GIL); they stop
    at the next chunk once ``stop`` is set."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from perfgate._cpus import usable_cpus
    from perfgate.tensors import ComparisonCancelled

    def check() -> None:
        if stop.is_set():
            raise ComparisonCancelled

    if len(jobs) <= 1:
        return [(role, job.path, *job.run(check)) for role, job in jobs]
    with ThreadPoolExecutor(min(len(jobs), usable_cpus()), thread_name_prefix="perfgate-hash") as pool:
        futures: list[tuple[Role, Path, Future[tuple[dict[Algorithm, str], int]]]] = [
            (role, job.path, pool.submit(job.run, check)) for role, job in jobs
        ]
        try:
            return [(role, path, *future.result()) for role, path, future in futures]
        except BaseException:
            stop.set()
            raise


def _open(role: Role, path: Path, confine: Callable[[Path], Path]) -> TensorSource:
    from perfgate.tensors import TensorInputError, open_tensor_source

    try:
        return open_tensor_source(path, confine=confine)
    except TensorInputError as exc:
        raise ToolError(f"{role}: {exc}") from exc


async def run(inp: CompareTensorsInput, rt: ToolRuntime) -> CompareTensorsOutput:
    from perfgate.tensors import CompareOptions, KeyMapping, TensorInputError, ToleranceOverride
    from perfgate.tensors.histogram import error_histogram

    if inp.equal_nan and not inp.allow_nonfinite:
        raise ToolError(
            "equal_nan applies only with allow_nonfinite=true: by default any NaN or Inf fails parity. Pass "
            "allow_nonfinite=true (recorded with the evidence) if matching non-finite values are acceptable"
        )
    ref_path = rt.resolve_path(inp.reference)
    cand_path = rt.resolve_path(inp.candidate)
    key_map = inp.key_map or KeyMapInput()
    try:
        mapping = KeyMapping(
            strip_prefixes=tuple(key_map.strip_prefixes),
            drop_segments=tuple(key_map.drop_segments),
            rename=tuple(key_map.rename.items()),
        )
        options = CompareOptions(
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

    def confine(path: Path) -> Path:
        return rt.resolve_path(str(path), kind="file")

    stop = threading.Event()
    reference = await anyio.to_thread.run_sync(_open, "reference", ref_path, confine)
    try:
        candidate = await anyio.to_thread.run_sync(_open, "candidate", cand_path, confine)
        try:
            paths = {rt.relative(p) for source in (reference, candidate) for p in source.files}
            algorithms = await anyio.to_thread.run_sync(digest_algorithms, rt, paths)
            reference.start_digests(algorithms)
            candidate.start_digests(algorithms)
            report, hashed = await _compare_and_hash(rt, reference, candidate, options, stop)
            worst = sorted(
                (t for t in report.tensors if t.status == "value_mismatch" and t.mismatched),
                key=lambda t: -(t.mismatched or 0),
            )[:MAX_PLOTTED]
            try:
                histograms = {
                    t.key: await anyio.to_thread.run_sync(
                        error_histogram,
                        reference,
                        candidate,
                        t.reference_key or t.key,
                        1 << 20,
                        t.candidate_key,
                    )
                    for t in worst
                }
            except TensorInputError as exc:  # a file changed after the comparison read it
                raise ToolError(str(exc)) from exc
        finally:
            candidate.close()
    finally:
        reference.close()

    ev = rt.evidence()
    if histograms:
        title = "Absolute error of the most mismatched tensors"
        await rt.plot(ev, "error_histograms.png", lambda: tensor_errors_png(histograms, title), key=True)
    files = [
        InputFile(
            role=role,
            path=rt.relative(p),
            digest=format_digest(ALGORITHM, digests[ALGORITHM]),
            other_digests=[format_digest(a, h) for a, h in digests.items() if a != ALGORITHM],
            size_bytes=size,
        )
        for role, p, digests, size in hashed
    ]
    producers = await anyio.to_thread.run_sync(find_producers, rt, files)
    notes = list(report.notes)
    unbound = [f"{p.role} {p.path}" for p in producers if p.evidence_id is None]
    if unbound:
        notes.append(
            f"unbound (no perfgate-launched run dumped these bytes): {', '.join(unbound)}; a keep needs each side "
            "dumped by perfgate.harness.dump_tensors inside the run_benchmark_window launch of its own side"
        )
    if inp.allow_nonfinite:
        notes.append(
            "allow_nonfinite: matching non-finite values were accepted as agreement (explicit opt-in)"
        )
    results = [_tensor_result(t) for t in report.tensors]
    by_dtype = _tolerance_by_dtype(results)
    beyond = [d.dtype for d in by_dtype if not d.within_ceiling]
    if beyond:
        notes.append(
            f"{', '.join(beyond)} compared beyond the equivalence ceiling (see tolerance_by_dtype): this check "
            "cannot carry an equivalent speedup, only a training_change with task-quality evidence"
        )
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
    listed = [results[i] for i in _problems_first(report.tensors)[:MAX_LISTED]]
    out = CompareTensorsOutput(
        evidence_id=ev.id,
        state=EvidenceState.PASSED if report.status == "match" else EvidenceState.FAILED,
        status=report.status,
        summary=report.summary
        + (f"; {len(report.mapped_keys)} keys renamed by key_map" if report.mapped_keys else ""),
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


def _tolerance_by_dtype(results: list[TensorResult]) -> list[DtypeTolerance]:
    from perfgate.decisions.equivalence import ceiling

    loosest: dict[str, tuple[int, float, float]] = {}
    for r in results:
        if r.compared_as != "tolerance":
            continue
        n, atol, rtol = loosest.get(r.dtype_reference, (0, 0.0, 0.0))
        loosest[r.dtype_reference] = (n + 1, max(atol, r.atol), max(rtol, r.rtol))
    out: list[DtypeTolerance] = []
    for dtype, (n, atol, rtol) in sorted(loosest.items()):
        top = ceiling(dtype)
        within = (atol == 0 and rtol == 0) or (top is not None and atol <= top.atol and rtol <= top.rtol)
        out.append(
            DtypeTolerance(
                dtype=dtype,
                tensors=n,
                atol=atol,
                rtol=rtol,
                equivalence_atol=top.atol if top else None,
                equivalence_rtol=top.rtol if top else None,
                within_ceiling=within,
            )
        )
    return out


PRODUCER_TOOLS = ("run_benchmark_window",)
"""Tools whose records name the tensor files their launched runs dumped (``result.tensor_dumps``)."""


def _dump_entries(rt: ToolRuntime) -> Iterator[tuple[EvidenceRecord, dict[str, Any]]]:
    """Every tensor dump named by a producer record that ran (record, dump entry)."""
    for tool in PRODUCER_TOOLS:
        for record in rt.ledger.records(tool=tool):
            dumps = record.result.get("tensor_dumps")
            if not isinstance(dumps, list) or record.state.value not in ("executed", "passed"):
                continue
            for dump in cast("list[Any]", dumps):
                if isinstance(dump, dict):
                    yield record, cast("dict[str, Any]", dump)


def digest_algorithms(rt: ToolRuntime, paths: set[str]) -> list[Algorithm]:
    """BLAKE3, plus each other known algorithm a producer record used for a dump at one of ``paths``
    (sha256, in records written before BLAKE3): a file binds only to a digest of its own algorithm."""
    algorithms: list[Algorithm] = [ALGORITHM]
    for _record, entry in _dump_entries(rt):
        if str(entry.get("path")) in paths:
            named = entry_digest(entry)
            if named is not None and named[0] not in algorithms:
                algorithms.append(named[0])
    return algorithms


def find_producers(rt: ToolRuntime, files: list[InputFile]) -> list[FileProducer]:
    """Each file's producer: the newest window record whose run dumped these exact bytes at this path,
    matched digest to digest under the same algorithm (a record's algorithm name is part of the match)."""
    wanted = {(f.path, d) for f in files for d in (f.digest, *f.other_digests)}
    found: dict[tuple[str, str], tuple[str, int, dict[str, Any] | None]] = {}
    for record, entry in _dump_entries(rt):
        named = entry_digest(entry)
        if named is None:
            continue  # an unknown or malformed algorithm binds nothing
        key = (str(entry.get("path")), format_digest(*named))
        if key in wanted:
            provenance = record.result.get("provenance")
            code = cast("dict[str, Any]", provenance).get("code") if isinstance(provenance, dict) else None
            launch = entry.get("launch")
            found[key] = (
                record.id,
                launch if isinstance(launch, int) else 0,
                cast("dict[str, Any]", code) if isinstance(code, dict) else None,
            )
    out: list[FileProducer] = []
    for f in files:
        digest, hit = f.digest, None
        for candidate in (f.digest, *f.other_digests):
            if (f.path, candidate) in found:
                digest, hit = candidate, found[(f.path, candidate)]
                break
        out.append(
            FileProducer(
                role=f.role,
                path=f.path,
                digest=digest,
                evidence_id=hit[0] if hit else None,
                launch=hit[1] if hit else None,
                code=hit[2] if hit else None,
            )
        )
    return out


async def _compare_and_hash(
    rt: ToolRuntime,
    reference: TensorSource,
    candidate: TensorSource,
    options: CompareOptions,
    stop: threading.Event,
) -> tuple[ComparisonReport, list[_Hashed]]:
    """Compare the inputs and digest them, stoppable on cancel. Files the comparison reads in order are
    hashed in the same pass (each chunk as it is read); their digests are finished (headers, bytes no key
    selected) once the comparison is done. The others (a shard index, a compressed NPZ) hash meanwhile on
    their own threads."""
    from anyio import from_thread  # not at start-up: only progress callbacks (worker threads) use it

    from perfgate.tensors import ComparisonCancelled, TensorInputError, compare_sources

    sides: list[tuple[Role, TensorSource]] = [("reference", reference), ("candidate", candidate)]
    jobs: list[tuple[Role, DigestJob]] = [
        (role, job) for role, source in sides for job in source.digest_jobs()
    ]
    report: list[ComparisonReport] = []
    hashed: dict[int, _Hashed] = {}
    failures: list[Exception] = []
    compared = anyio.Event()

    def progress(done: int, total: int, message: str) -> None:
        if not stop.is_set():
            from_thread.run(rt.progress, float(done), float(total), message)

    def compare() -> ComparisonReport:
        return compare_sources(reference, candidate, options, progress=progress, cancelled=stop.is_set)

    def hash_some(after_comparison: bool) -> None:
        chosen = [i for i, (_, job) in enumerate(jobs) if job.after_comparison == after_comparison]
        results = _hash_jobs([jobs[i] for i in chosen], stop)
        hashed.update(zip(chosen, results, strict=True))

    # Each task keeps its own failure: a task group would wrap it in an exception group, which the
    # SDK shows the agent only as a bare "error executing tool".
    async def run_compare() -> None:
        try:
            report.append(await anyio.to_thread.run_sync(compare, abandon_on_cancel=True))
        except (TensorInputError, ComparisonCancelled, OSError) as exc:
            failures.append(exc)
            stop.set()
        finally:
            compared.set()

    async def run_hash() -> None:
        try:
            await anyio.to_thread.run_sync(hash_some, False, abandon_on_cancel=True)
            await compared.wait()
            if not stop.is_set():
                await anyio.to_thread.run_sync(hash_some, True, abandon_on_cancel=True)
        except (TensorInputError, ComparisonCancelled, OSError) as exc:
            failures.append(exc)
            stop.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_compare)
            tg.start_soon(run_hash)
    except BaseException:
        stop.set()  # abandoned worker threads see this at their next chunk and exit
        raise
    for exc in failures:
        if isinstance(exc, TensorInputError):
            raise ToolError(str(exc)) from exc
        if isinstance(exc, OSError):
            raise ToolError(f"could not read the tensor files: {exc}") from exc
    assert report and len(hashed) == len(jobs), f"both workers finished: {failures}"
    return report[0], [hashed[i] for i in range(len(jobs))]


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
