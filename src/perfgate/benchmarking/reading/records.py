"""Read and validate the per-rank record files the harness writes (``rank<N>.json``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from perfgate.benchmarking.errors import RecordError
from perfgate.harness.record import RECORD_SCHEMA, RECORD_VERSION
from perfgate.security.digests import DIGEST_PATTERN

if TYPE_CHECKING:
    from perfgate.security.scrubber import Scrubber

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_STEPS",
    "MAX_WORLD_SIZE",
    "BatchLayoutRecord",
    "CheckpointFileRecord",
    "DeviceRecord",
    "HarnessOwnRecord",
    "JobRecord",
    "ModelRecord",
    "OutsideRecord",
    "PhaseRecord",
    "RankRecord",
    "RecordSet",
    "SavedStateRecord",
    "StepColumns",
    "TensorDumpRecord",
    "WindowRecord",
    "decode_record",
    "load_records",
    "read_record",
    "scrubbed_record",
]


MAX_WORLD_SIZE = 1 << 20
"""Most ranks a record may claim; ranks are counted and listed, so a claimed billion is refused up front."""
MAX_STEPS = 10_000_000
"""Most steps or windows a record may claim."""
MAX_RECORD_BYTES = 256 << 20
"""Largest record file read (a record holds a few numbers per step: ~100 bytes each)."""

# Constrained types: a record is data from a file, so every count and duration is range-checked while it is
# decoded, before anything is divided by it or sized from it.
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEPS)]
_Ns = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
_PositiveNs = Annotated[int, msgspec.Meta(ge=1, le=2**62)]
_Ms = Annotated[float, msgspec.Meta(ge=0.0, le=1e15)]
_Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**62)]


class DeviceRecord(msgspec.Struct, frozen=True):
    kind: str
    index: int | None = None
    name: str | None = None
    runtime_version: str | None = None
    synchronized: bool = False
    events: bool = False


class StepColumns(msgspec.Struct, frozen=True):
    """One entry per step, warm-up included; times in integer nanoseconds."""

    count: _Count
    warmup: _Count
    start_ns: list[_Ns]
    end_ns: list[_Ns]
    step_time_ns: list[_Ns]
    data_wait_ns: list[_Ns]
    backward_ns: list[_Ns]
    samples: list[_Bytes | None]
    tokens: list[_Bytes | None]
    model_samples: list[_Bytes | None] = msgspec.field(default_factory=list[_Bytes | None])
    """Samples that reached the top-level module's forward per step (empty from a harness without it)."""
    model_second_dim: list[_Bytes | None] = msgspec.field(default_factory=list[_Bytes | None])
    """The second dimension of those inputs, summed alike: the samples of a sequence-first layout."""


class WindowRecord(msgspec.Struct, frozen=True):
    """One measured window of one rank: steps ``first_step..last_step`` (inclusive)."""

    index: _Count
    first_step: _Count
    last_step: _Count
    steps: Annotated[int, msgspec.Meta(ge=1, le=MAX_STEPS)]
    start_ns: _Ns
    end_ns: _Ns
    elapsed_ns: _PositiveNs
    start_unix_ns: _Ns
    end_unix_ns: _Ns
    device_elapsed_ms: _Ms | None = None
    device_step_ms: list[_Ms] | None = None
    peak_allocated_bytes: _Bytes | None = None
    peak_reserved_bytes: _Bytes | None = None
    host_rss_bytes: _Bytes | None = None
    host_peak_rss_bytes: _Bytes | None = None
    loss: list[float | None] | None = None
    nonfinite_loss_steps: list[int] | None = None
    skipped_steps: list[list[int]] | None = None
    loss_scale_start: float | None = None
    loss_scale_end: float | None = None
    backward_calls: int | None = None
    replica_digest: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")] | None = None
    """The parameters' digest after the window's last update (the last window of a multi-rank run)."""


class OutsideRecord(msgspec.Struct, frozen=True):
    """Losses and skipped updates of the steps no measured window holds (the warm-up, a discarded window, the
    steps after the last window): read for the whole job's health, never for timing."""

    loss: list[tuple[_Count, float]] = msgspec.field(default_factory=list[tuple[int, float]])
    """(step, finite loss)."""
    nonfinite_loss_steps: list[_Count] = msgspec.field(default_factory=list[int])
    skipped_steps: list[tuple[_Count, _Count]] = msgspec.field(default_factory=list[tuple[int, int]])
    """(step, updates GradScaler skipped)."""


class PhaseRecord(msgspec.Struct, frozen=True):
    """An evaluation pass, a checkpoint or a marked phase of the job (times from the record's origin)."""

    kind: Annotated[str, msgspec.Meta(max_length=40)]
    step: _Count
    """The step in progress when it began (it ran inside that step's time, between two boundaries)."""
    start_ns: _Ns
    end_ns: _Ns
    calls: Annotated[int, msgspec.Meta(ge=1, le=2**62)] = 1


class CheckpointFileRecord(msgspec.Struct, frozen=True):
    """A file a checkpoint writer saved or a reader loaded (`perfgate.harness.hooks`)."""

    op: Literal["save", "load"]
    step: _Count
    """The step in progress (optimizer steps completed before the call)."""
    path: Annotated[str, msgspec.Meta(max_length=4096)]
    """Absolute, as the launched process resolved it."""
    state: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")] | None = None
    """A save: the digest of what the writer was handed (a key of `JobRecord.saved_states`)."""


class SavedStateRecord(msgspec.Struct, frozen=True):
    """What a checkpoint writer was handed (`perfgate.harness.saved_state`): its keys, shapes and dtypes."""

    keys: Annotated[int, msgspec.Meta(ge=0)]
    """Every key walked (the digest covers them all)."""
    entries: Annotated[
        list[
            tuple[
                Annotated[str, msgspec.Meta(max_length=300)],
                Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=64)] | None,
                Annotated[str, msgspec.Meta(max_length=40)],
            ]
        ],
        msgspec.Meta(max_length=1_000),
    ]
    """(key, shape or None for a non-tensor value, dtype or ``value``/``values``), sorted by key."""
    complete: bool = True
    """False: the walk stopped before the whole object was read."""


class StartupLineRecord(msgspec.Struct, frozen=True):
    """One line of the user's code that start-up was sampled at (`perfgate.harness.startup`)."""

    file: Annotated[str, msgspec.Meta(max_length=4096)]
    line: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)]
    function: Annotated[str, msgspec.Meta(max_length=1024)]
    ns: _Ns
    samples: _Ns


class StartupRecord(msgspec.Struct, frozen=True):
    """Start-up sampled from the harness's start to the first training forward or step."""

    sampled_ns: _Ns = 0
    samples: _Ns = 0
    outside_user_code_ns: _Ns = 0
    other_ns: _Ns = 0
    lines: Annotated[list[StartupLineRecord], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list[StartupLineRecord]
    )


class HarnessOwnRecord(msgspec.Struct, frozen=True):
    """The time perfgate's own code took in the launch, as the harness timed itself (not a measurement of
    the script: a figure the harness reports about itself)."""

    median_step_ns: _Ns | None = None
    """Median over the steps after warm-up of the time spent inside perfgate's probes during each step."""
    max_step_ns: _Ns | None = None
    steps: _Count = 0
    startup_ns: _Ns | None = None
    """The launcher's start-up: from importing ``perfgate.harness`` to the script's first line, torch's
    import left out (the script does it itself)."""


class JobRecord(msgspec.Struct, frozen=True):
    """What the harness saw of the whole job: where training began and the phases beside the steps."""

    measured: bool = False
    """The run was measured as a whole job (never stopped after its windows; every step recorded)."""
    train_start_ns: _Ns | None = None
    """The first training forward (None: none seen, e.g. a script without a torch module)."""
    phases: Annotated[list[PhaseRecord], msgspec.Meta(max_length=100_000)] = msgspec.field(
        default_factory=list[PhaseRecord]
    )
    phases_dropped: _Count = 0
    checkpoint_files: Annotated[list[CheckpointFileRecord], msgspec.Meta(max_length=10_000)] = msgspec.field(
        default_factory=list[CheckpointFileRecord]
    )
    saved_states: Annotated[
        dict[Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")], SavedStateRecord],
        msgspec.Meta(max_length=16),
    ] = msgspec.field(default_factory=dict[str, SavedStateRecord])
    """Digest -> each distinct state the job's checkpoint writers were handed."""


class TensorDumpRecord(msgspec.Struct, frozen=True):
    """A file ``dump_tensors`` wrote inside the launched process (absolute path, as written)."""

    path: Annotated[str, msgspec.Meta(max_length=4096)]
    size_bytes: Annotated[int, msgspec.Meta(ge=0)]
    step: Annotated[int, msgspec.Meta(ge=0)] = 0
    digest: Annotated[str, msgspec.Meta(pattern=DIGEST_PATTERN)] | None = None
    """``"blake3:<hex>"``; records written before digests were named carry a bare ``sha256`` instead."""
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] | None = None
    computed: dict[Annotated[str, msgspec.Meta(max_length=40)], Annotated[int, msgspec.Meta(ge=0)]] | None = (
        None
    )
    """How many of its tensors are each kind the training computes (perfgate.harness.computed); None: not
    told (no training module seen, or a harness from before)."""

    @property
    def named_digest(self) -> str | None:
        """The file's digest with its algorithm's name (``"sha256:<hex>"`` for an older record)."""
        if self.digest is not None:
            return self.digest
        return None if self.sha256 is None else f"sha256:{self.sha256}"


class ModelRecord(msgspec.Struct, frozen=True):
    """The top-level module the harness saw train: class, parameter counts, structure digest."""

    name: Annotated[str, msgspec.Meta(max_length=200)]
    parameters: Annotated[int, msgspec.Meta(ge=0, le=2**62)]
    trainable_parameters: Annotated[int, msgspec.Meta(ge=0, le=2**62)]
    structure: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]
    param_dtype: Annotated[str, msgspec.Meta(max_length=40)] | None = None
    """The dtype holding most of its parameter elements (``float32``); None: a harness that did not say."""


class BatchLayoutRecord(msgspec.Struct, frozen=True):
    """A sequence-first layer inside the model and the dimension of the model's input its batch was."""

    dim: Annotated[int, msgspec.Meta(ge=0, le=1)]
    layer: Annotated[str, msgspec.Meta(max_length=200)]
    layer_batch: _Count


class RankRecord(msgspec.Struct, frozen=True):
    """A whole record file (schema ``perfgate.harness.record``, version 1); unknown fields are ignored."""

    schema: str
    version: int
    rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_WORLD_SIZE)]
    timing: str
    warmup_steps: _Count
    measure_steps: _Count
    windows_requested: _Count
    complete: bool
    profiled: bool
    steps: StepColumns
    windows: list[WindowRecord]
    origin_unix_ns: int
    local_rank: int = 0
    hostname: str = ""
    node: dict[str, Any] | None = None
    pid: int = 0
    label: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    profile: dict[str, Any] | None = None
    device: DeviceRecord | None = None
    other_optimizer_steps: int = 0
    notes: list[str] = msgspec.field(default_factory=list[str])
    python: str | None = None
    torch_version: str | None = None
    runtime_env: dict[str, str | None] | None = None
    tensor_dumps: list[TensorDumpRecord] = msgspec.field(default_factory=list[TensorDumpRecord])
    metrics: dict[Annotated[str, msgspec.Meta(max_length=100)], float] = msgspec.field(
        default_factory=dict[str, float]
    )
    sample_stream: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    """Digest of the inputs of the first training forwards of the warm-up (the data path), when read."""
    model: ModelRecord | None = None
    """The top-level training module, as the forward hook found it (None: no training forward seen)."""
    outside_windows: OutsideRecord | None = None
    """Health of the steps outside the measured windows (None: a harness that did not record them)."""
    job: JobRecord | None = None
    """The whole job beside the windows (None: a harness that did not record it)."""
    step_source: str | None = None
    """What delimited the steps: gradients, optimizer or explicit (`perfgate.harness.steps`)."""
    batch_layout: BatchLayoutRecord | None = None
    autocast: list[Annotated[str, msgspec.Meta(max_length=40)]] = msgspec.field(default_factory=list[str])
    """Autocast dtypes of the training forwards before the first window ("none": without autocast)."""
    startup: StartupRecord | None = None
    """Where start-up spent its time, by line (None: not sampled)."""
    harness_own: HarnessOwnRecord | None = None
    """What perfgate's own code took of the launch (None: an older harness)."""


@dataclass(frozen=True)
class RecordSet:
    """The records of one launch, sorted by rank, and what is wrong with the set as a whole."""

    records: list[RankRecord]
    problems: list[str]

    @property
    def world_size(self) -> int:
        return max((r.world_size for r in self.records), default=0)


_decoder = msgspec.json.Decoder(RankRecord)


def read_record(path: Path, scrub: Scrubber | None = None) -> RankRecord:
    """Decode one record file, scrubbed (`decode_record`).

    Raises:
        RecordError: unreadable, not JSON, or not a harness record of a known version.
    """
    return decode_record(_read(path), path, scrub)


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise RecordError(f"cannot read harness record {path}: {exc}") from exc


def scrubbed_record(data: bytes, path: Path | str, scrub: Scrubber | None = None) -> bytes:
    """A record file's bytes with every string the run reported in it (metric names, checkpoint paths,
    saved-state keys, notes, labels) passed through the scrubber the run's output passes through
    (``scrub``; the plain `perfgate.security.scrubber.Scrubber` by default): what is decoded and what is kept.

    Raises:
        RecordError: too large, or not JSON.
    """
    from perfgate.security.scrubber import Scrubber, scrub_json

    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(
            f"{path} is over {MAX_RECORD_BYTES} bytes (limit benchmarking.reading.records.MAX_RECORD_BYTES): not a "
            "harness record, or one from a run of more than a few million steps; measure fewer steps"
        )
    try:
        return scrub_json(data, scrub if scrub is not None else Scrubber())
    except ValueError as exc:
        raise RecordError(f"{path} is not a valid harness record: {exc}") from exc


def decode_record(data: bytes, path: Path | str, scrub: Scrubber | None = None) -> RankRecord:
    """Decode one record file's bytes (``path`` names it in errors), scrubbed first (`scrubbed_record`):
    no string a run reports reaches the evidence raw.

    Raises:
        RecordError: too large, not JSON, or not a harness record of a known version.
    """
    data = scrubbed_record(data, path, scrub)
    try:
        record = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RecordError(f"{path} is not a valid harness record: {exc}") from exc
    if record.schema != RECORD_SCHEMA or record.version != RECORD_VERSION:
        raise RecordError(
            f"{path} has schema {record.schema!r} v{record.version}; this perfgate reads "
            f"{RECORD_SCHEMA!r} v{RECORD_VERSION}: run the training with the same perfgate version"
        )
    n = record.steps.count
    columns = (
        record.steps.start_ns,
        record.steps.end_ns,
        record.steps.step_time_ns,
        record.steps.data_wait_ns,
    )
    if (
        any(len(c) != n for c in columns)
        or len(record.steps.samples) != n
        or len(record.steps.tokens) != n
        or len(record.steps.model_samples) not in (0, n)
    ):
        raise RecordError(f"{path}: step columns disagree with steps.count={n} (the file is corrupt)")
    if record.rank >= record.world_size:
        raise RecordError(
            f"{path}: rank {record.rank} is outside world size {record.world_size} (the file is corrupt)"
        )
    for w in record.windows:
        if w.last_step < w.first_step or w.last_step >= n:
            raise RecordError(
                f"{path}: window {w.index} spans steps {w.first_step}..{w.last_step} of {n} (the file is corrupt)"
            )
    return record


def load_records(directory: Path, scrub: Scrubber | None = None) -> RecordSet:
    """All ``rank*.json`` records in ``directory`` (scrubbed, `decode_record`), with problems such as
    missing or duplicate ranks.

    Raises:
        RecordError: a file cannot be decoded.
    """
    records = [read_record(p, scrub) for p in sorted(directory.glob("rank*.json"))]
    records.sort(key=lambda r: r.rank)
    problems: list[str] = []
    if not records:
        problems.append(f"no harness record was written to {directory}")
        return RecordSet(records, problems)
    ranks = [r.rank for r in records]
    if len(set(ranks)) != len(ranks):
        problems.append(f"duplicate ranks among the records: {ranks}")
    sizes = {r.world_size for r in records}
    if len(sizes) > 1:
        problems.append(f"records disagree on the world size: {sorted(sizes)}")
    world = max(sizes)  # at most MAX_WORLD_SIZE: read_record checked it
    seen = set(ranks)
    absent = world - len(seen)
    if absent > 0:
        shown = list(itertools.islice((r for r in range(world) if r not in seen), 20))
        more = f" and {absent - len(shown)} more" if absent > len(shown) else ""
        problems.append(f"no record from rank(s) {shown}{more} of world size {world}")
    return RecordSet(records, problems)
