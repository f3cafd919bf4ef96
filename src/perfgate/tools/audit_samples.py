"""audit_samples: did every rank and worker see the sample ids it should, each epoch?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.audit import (
    EXPECTED_SUFFIXES,
    OBSERVED_SUFFIXES,
    AuditInputError,
    AuditPolicy,
    AuditReport,
    EpochReport,
    Finding,
    IdTypes,
    audit_path,
)
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState, file_digest
from perfgate.helpers.deadline import DeadlineExceeded, deadline
from perfgate.report.plots import coverage_png
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "AuditSamplesInput", "AuditSamplesOutput", "InputFile", "run"]

MAX_EPOCHS_LISTED = 1000
"""Most epochs listed in the result; the audit.json artifact holds every one."""


class AuditSamplesInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observed: Annotated[
        str,
        Field(
            min_length=1,
            description="Observed records, relative to the workspace: a file or a folder of files ("
            + ", ".join(OBSERVED_SUFFIXES)
            + ") with sample_id, epoch, rank, worker (-1 = main process) and optional step, session (launch "
            "id), restart, pass (JSONL). perfgate.harness.RecordingSampler / RecordingDataset / SampleLog "
            "write such a folder; repeated launches into it are audited as their latest run.",
        ),
    ]
    expected: Annotated[
        str | None,
        Field(
            description="File of the ids every epoch should cover ("
            + ", ".join(EXPECTED_SUFFIXES)
            + "). Without expected or expected_range, coverage stays unknown and the audit cannot pass."
        ),
    ] = None
    expected_range: Annotated[
        tuple[int, int] | None,
        Field(description="[start, stop): every epoch should cover the int ids start <= id < stop."),
    ] = None
    world_size: Annotated[
        int | None,
        Field(ge=1, description="Ranks sharing each epoch; omitted: inferred from the highest rank seen."),
    ] = None
    drop_last: Annotated[
        bool, Field(description="The sampler drops N mod world_size ids per epoch instead of padding.")
    ] = False
    allow_padding_repeats: Annotated[
        bool,
        Field(
            description="The sampler pads each epoch to ceil(N/world_size)*world_size records by repeating ids "
            "on other ranks (DistributedSampler, drop_last=False); the repeats must number exactly that."
        ),
    ] = False
    allow_repeats: Annotated[
        bool,
        Field(
            description="Sampling with replacement: repeats are not errors. Never excuses missing or extra ids, "
            "nor one shard read by two owners (the same ids at the same positions); a keep accepts it only "
            "when the candidate windows' contract declares replacement=true."
        ),
    ] = False
    shuffle: Annotated[
        bool,
        Field(description="The order should change every epoch (set false for a fixed sequential order)."),
    ] = True
    epochs: Annotated[
        list[int] | None,
        Field(description="Audit only these epochs (e.g. leave out an unfinished last epoch)."),
    ] = None
    example_limit: Annotated[
        int, Field(ge=0, le=100, description="Example ids listed per epoch and kind; counts are complete.")
    ] = 10

    @model_validator(mode="after")
    def _one_expected_form(self) -> AuditSamplesInput:
        if self.expected is not None and self.expected_range is not None:
            raise ValueError("give expected (a file) or expected_range, not both")
        if self.expected_range is not None and self.expected_range[1] < self.expected_range[0]:
            raise ValueError("expected_range is [start, stop) with stop >= start")
        return self


class InputFile(BaseModel):
    path: str = Field(description="Relative to the workspace (absolute when under a read root).")
    sha256: str
    size_bytes: int


class AuditSamplesOutput(BaseModel):
    evidence_id: str
    state: EvidenceState = Field(
        description="passed: status passed with coverage checked; executed: passed but coverage unknown "
        "(never certified); failed: an error finding."
    )
    status: Literal["passed", "failed"]
    coverage: Literal["checked", "unknown"]
    summary: str
    records: int = Field(description="Readable observed records.")
    malformed_records: int
    expected_ids: int | None = Field(
        description="Distinct expected ids per epoch; null without an expected set."
    )
    world_size: int
    world_size_inferred: bool
    id_types: IdTypes
    epochs: list[EpochReport] = Field(
        description=f"Per epoch, in order; at most {MAX_EPOCHS_LISTED} (all are in the audit.json artifact)."
    )
    epochs_total: int
    findings: list[Finding] = Field(description="Errors first; each message says what to fix.")
    files: list[InputFile] = Field(description="Every file read, with its sha256.")
    launches: list[int] = Field(
        default_factory=list[int],
        description="Launch ids (the records' session) the counted records came from: a keep accepts the "
        "audit only when these are launches of its candidate windows (run_benchmark_window launch_ids). "
        "Empty: the records name no launch.",
    )
    partial_epochs: list[int] = Field(
        default_factory=list[int],
        description="Epochs the run ended part-way through: audited for the ids read, not for ids never reached.",
    )


def _state(report: AuditReport) -> EvidenceState:
    if report.status == "failed":
        return EvidenceState.FAILED
    return EvidenceState.PASSED if report.coverage == "checked" else EvidenceState.EXECUTED


def _summary(report: AuditReport) -> str:
    errors = [f for f in report.findings if f.severity == "error"]
    head = (
        f"{report.records} records over {len(report.epochs)} epochs and {report.world_size} ranks; "
        f"coverage {report.coverage}"
    )
    if errors:
        return f"{head}; failed: " + ", ".join(f"{f.kind} ({f.count})" for f in errors)
    if report.coverage == "unknown":
        return f"{head}; no error found, but without expected ids missing samples cannot be seen"
    partial = [e for e in report.epochs if e.partial]
    if partial:
        covered = ", ".join(f"epoch {e.epoch}: {e.unique} of {report.expected_ids} ids" for e in partial[:4])
        return (
            f"{head}; no error in what was read; partial: the run ended part-way ({covered}), so the audit "
            "speaks for the ids it read"
        )
    return f"{head}; every epoch covered the expected ids as the policy allows"


async def run(inp: AuditSamplesInput, rt: ToolRuntime) -> AuditSamplesOutput:
    from anyio import from_thread  # not at start-up: only progress callbacks (worker threads) use it

    observed = rt.resolve_path(inp.observed)
    expected = None if inp.expected is None else rt.resolve_path(inp.expected, kind="file")
    policy = AuditPolicy(
        world_size=inp.world_size,
        drop_last=inp.drop_last,
        allow_padding_repeats=inp.allow_padding_repeats,
        allow_repeats=inp.allow_repeats,
        shuffle=inp.shuffle,
        epochs=None if inp.epochs is None else tuple(inp.epochs),
        example_limit=inp.example_limit,
    )

    def confine(path: Path) -> Path:
        return rt.resolve_path(str(path), kind="file")

    def progress(done: int, total: int, path: Path) -> None:
        from_thread.run(rt.progress, float(done), float(total + 1), f"reading {rt.relative(path)}")

    def audit() -> tuple[AuditReport, list[tuple[Path, str, int]]]:
        # Readers and the audit call `checkpoint()` per block: the call stops at the deadline or when
        # it is cancelled, instead of running on in its worker thread.
        with deadline(rt.config.limits.deadline_s, f"auditing {rt.relative(observed)}"):
            report = audit_path(
                observed, policy, expected, inp.expected_range, confine=confine, progress=progress
            )
        read = [Path(s) for s in report.sources] + ([expected] if expected is not None else [])
        return report, [(p, *file_digest(p)) for p in read]

    try:
        report, hashed = await anyio.to_thread.run_sync(audit, abandon_on_cancel=True)
    except (AuditInputError, DeadlineExceeded) as exc:
        raise ToolError(str(exc)) from exc
    except OSError as exc:
        raise ToolError(f"could not read the records: {exc}") from exc

    ev = rt.evidence()
    await anyio.to_thread.run_sync(ev.write_json, "audit.json", report.model_dump(mode="json"))
    out = AuditSamplesOutput(
        evidence_id=ev.id,
        state=_state(report),
        status=report.status,
        coverage=report.coverage,
        summary=_summary(report),
        records=report.records,
        malformed_records=report.malformed_records,
        expected_ids=report.expected_ids,
        world_size=report.world_size,
        world_size_inferred=report.world_size_inferred,
        id_types=report.id_types,
        epochs=report.epochs[:MAX_EPOCHS_LISTED],
        epochs_total=len(report.epochs),
        findings=report.findings,
        files=[InputFile(path=rt.relative(p), sha256=sha, size_bytes=size) for p, sha, size in hashed],
        launches=report.launches,
        partial_epochs=report.partial_epochs,
    )
    if report.epochs:
        await rt.plot(ev, "coverage.png", lambda: _coverage_plot(report), key=True)
    return await rt.commit(ev, out)


def _coverage_plot(report: AuditReport) -> bytes:
    """Records per (epoch, rank) over the rank's expected share (1.0 = its share of the expected ids)."""
    epochs = [e.epoch for e in report.epochs]
    ranks = sorted({c.rank for e in report.epochs for c in e.records_per_rank})
    world = report.world_size or len(ranks) or 1
    share = (report.expected_ids / world) if report.expected_ids else None
    matrix: list[list[float]] = []
    for e in report.epochs:
        counts = {c.rank: c.records for c in e.records_per_rank}
        base = share if share else (max(counts.values()) if counts else 1)
        matrix.append([counts.get(r, 0) / base for r in ranks])
    title = (
        "Records per rank / expected share" if share else "Records per rank / busiest rank (coverage unknown)"
    )
    return coverage_png(matrix, epochs, ranks, title=title)


SPEC = ToolSpec(
    name="audit_samples",
    title="Audit sample ids (data coverage)",
    description=(
        "Check recorded sample ids cover each epoch as the sampler should: missing, extra, duplicated across "
        "ranks or workers, padding, set_epoch, resume replays. Needed when data loading changes."
    ),
    details=(
        "Check from recorded sample ids that every epoch covered the dataset as the sampler should: per "
        "epoch, missing and extra ids, duplicates within the epoch and across ranks/workers (who saw "
        "them), DistributedSampler padding (checked to be exactly ceil(N/R)*R - N), drop_last, ranks that "
        "recorded nothing, the same order every epoch (a forgotten sampler.set_epoch) and replayed or "
        "skipped samples at a resume. Use it as correctness evidence whenever a change touches data "
        "loading, sharding, workers or resumption: record ids with perfgate.harness.RecordingSampler, "
        "RecordingDataset or SampleLog, then pass the folder as observed and the dataset's ids as "
        'expected or expected_range. 1 and "1" are different ids. Without expected ids the coverage '
        "is unknown and the evidence is never passed."
    ),
    input_model=AuditSamplesInput,
    output_model=AuditSamplesOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
