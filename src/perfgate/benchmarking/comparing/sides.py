"""One side of an A/B as its window evidence records it: the contract and protocol declared, the devices
observed, how the steps were timed, and the step samples and training facts read back from its artifacts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from perfgate.benchmarking.errors import BenchmarkError, RecordError
from perfgate.benchmarking.runs.training import ModelShape, SideTraining
from perfgate.benchmarking.workload.contract import Contract
from perfgate.benchmarking.workload.protocol import window_protocol
from perfgate.evidence.access import as_dict
from perfgate.evidence.artifacts import ArtifactChanged, read_artifact

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.compare import WindowSample
    from perfgate.benchmarking.reading.records import RankRecord
    from perfgate.evidence import EvidenceRecord

__all__ = [
    "BENCHMARK_TOOL",
    "IMPORT_TOOL",
    "WINDOW_TOOLS",
    "measured_by",
    "observed",
    "per_device",
    "rank0_records",
    "read_samples",
    "record_contract",
    "record_protocol",
    "record_provenance",
    "side_training",
]

BENCHMARK_TOOL = "run_benchmark_window"
IMPORT_TOOL = "import_benchmark"
WINDOW_TOOLS = (BENCHMARK_TOOL, IMPORT_TOOL)
"""The tools whose evidence is benchmark windows."""
_OBSERVED_INVARIANTS = ("device_kind", "device_name")


def record_contract(record: EvidenceRecord) -> Contract:
    """The declared contract: imported evidence stores the one it was read with (files carry their own).

    Raises:
        BenchmarkError: the stored contract names one entry twice.
    """
    raw = record.result.get("contract") if record.tool == IMPORT_TOOL else record.inputs.get("contract")
    try:
        return Contract.from_mapping(as_dict(raw))
    except BenchmarkError as exc:
        raise BenchmarkError(
            f"evidence {record.id}: {exc}; re-run the window with one name per entry"
        ) from exc


def record_protocol(record: EvidenceRecord) -> dict[str, Any]:
    """The measurement boundary of the record's windows (`protocol.window_protocol`)."""
    return window_protocol(record.inputs, record.result, imported=record.tool == IMPORT_TOOL)


def record_provenance(record: EvidenceRecord) -> dict[str, Any]:
    """The run provenance (code state, files the argv names); empty when not recorded."""
    return as_dict(record.result.get("provenance"))


def observed(record: EvidenceRecord) -> dict[str, object]:
    """The devices and world size the windows were measured on."""
    fp = as_dict(record.result.get("environment_fingerprint"))
    out: dict[str, object] = {k: fp.get(k) for k in _OBSERVED_INVARIANTS}
    out["world_size"] = record.result.get("world_size")
    return out


def measured_by(record: EvidenceRecord) -> str:
    """How the step times were taken: launched by perfgate, or imported in a given format."""
    if record.tool == IMPORT_TOOL:
        return f"imported ({record.result.get('format')})"
    return "launched by perfgate"


def read_samples(workspace: Path, record: EvidenceRecord) -> list[WindowSample]:
    """The record's windows from its step-series artifact, each tagged ``<evidence id>:<launch index>``.

    Raises:
        BenchmarkError: no series artifact, the artifact changed since it was recorded, or it is not a
            step series.
    """
    from perfgate.benchmarking.comparing.series import SERIES_NAME, samples_from_series

    artifact = next((a for a in record.artifacts if a.name == SERIES_NAME), None)
    if artifact is None:
        raise BenchmarkError(
            f"evidence {record.id} has no {SERIES_NAME} artifact: re-run run_benchmark_window"
        )
    # Read once, and the bytes checked are the bytes used: the file is the agent's to write, and read a
    # second time after its hash was checked it could be another file by then.
    try:
        data = read_artifact(workspace, artifact)
    except ArtifactChanged as exc:
        raise BenchmarkError(
            f"evidence {record.id}: {exc} (`perfgate ledger verify` lists every change): re-measure the window"
        ) from exc
    return samples_from_series(data, artifact.path, launch_prefix=f"{record.id}:")


def per_device(windows: list[WindowSample], record: EvidenceRecord) -> list[WindowSample]:
    """Step times x the measured world size (device-seconds per step): work per device-second."""
    world = record.result.get("world_size")
    n = world if isinstance(world, int) and world > 0 else 1
    return [dataclasses.replace(w, step_s=[t * n for t in w.step_s]) for w in windows]


def side_training(workspace: Path, records: Sequence[EvidenceRecord]) -> SideTraining:
    """One side's model facts, sample streams and per-launch losses (rank 0 records, hash-checked)."""
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
        for record in rank0_records(workspace, r):
            steps: dict[int, float] = {}
            for w in record.windows:
                for i, value in enumerate(w.loss or []):
                    if value is not None:
                        steps[w.first_step + i] = value
            losses.append(steps)
    return SideTraining(models=models, streams=streams, losses=losses)


def rank0_records(workspace: Path, record: EvidenceRecord) -> list[RankRecord]:
    """Rank 0's harness record of each launch of a window record, in launch order, read from its
    hash-checked artifacts; a launch whose copy changed or does not decode is left out (what it would show
    is then unchecked, never taken as read)."""
    from perfgate.benchmarking.reading.records import decode_record

    found: list[RankRecord] = []
    for artifact in record.artifacts:
        if not (artifact.name.startswith("launch") and artifact.name.endswith("_rank0.json")):
            continue
        try:
            found.append(decode_record(read_artifact(workspace, artifact), artifact.path))
        except (ArtifactChanged, RecordError):
            continue
    return found
