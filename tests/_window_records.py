"""Harness rank records built in memory (or written as ``rank<N>.json``), and a folder of artifacts, for
the measurement tests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from perfgate.benchmarking.reading.records import DeviceRecord, RankRecord, StepColumns, WindowRecord
from perfgate.harness.record import RECORD_SCHEMA, RECORD_VERSION
from perfgate.security.scrubber import Scrubber

STEP_NS = 10_000_000


def rank_record(
    rank: int = 0,
    *,
    world: int = 1,
    warmup: int = 2,
    measure: int = 4,
    windows: int = 1,
    samples: Sequence[int | None] | int | None = 8,
    model_samples: Sequence[int | None] | int | None = None,
    backward_calls: int | None = None,
    loss: list[float | None] | None = None,
    timing: str = "optimizer",
    device: DeviceRecord | None = None,
    **over: Any,
) -> RankRecord:
    """Rank ``rank``'s record: ``warmup`` steps, then ``windows`` windows of ``measure`` steps of 10 ms.

    ``samples`` / ``model_samples``: per step, or one count for every step. ``backward_calls`` and
    ``loss`` (one value per step): per window.
    """
    n = warmup + measure * windows

    def column(value: Sequence[int | None] | int | None) -> list[int | None]:
        if value is None or isinstance(value, int):
            return [value] * n
        assert len(value) == n
        return list(value)

    starts = [i * STEP_NS for i in range(n)]
    wins = [
        WindowRecord(
            index=k,
            first_step=warmup + k * measure,
            last_step=warmup + (k + 1) * measure - 1,
            steps=measure,
            start_ns=starts[warmup + k * measure],
            end_ns=starts[warmup + k * measure] + measure * STEP_NS,
            elapsed_ns=measure * STEP_NS,
            start_unix_ns=0,
            end_unix_ns=0,
            backward_calls=backward_calls,
            loss=loss,
        )
        for k in range(windows)
    ]
    steps = StepColumns(
        count=n,
        warmup=warmup,
        start_ns=starts,
        end_ns=[s + STEP_NS for s in starts],
        step_time_ns=[STEP_NS] * n,
        data_wait_ns=[0] * n,
        backward_ns=[1_000_000] * n,
        samples=column(samples),
        tokens=[None] * n,
        model_samples=[] if model_samples is None else column(model_samples),
    )
    fields: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "rank": rank,
        "world_size": world,
        "timing": timing,
        "warmup_steps": warmup,
        "measure_steps": measure,
        "windows_requested": windows,
        "complete": True,
        "profiled": False,
        "steps": steps,
        "windows": wins,
        "origin_unix_ns": 0,
        "device": device,
    }
    fields.update(over)
    return RankRecord(**fields)


def write_records(directory: Path, records: Sequence[RankRecord]) -> Path:
    """Each record as ``rank<N>.json`` in ``directory``, as the harness leaves them."""
    directory.mkdir(parents=True, exist_ok=True)
    for r in records:
        (directory / f"rank{r.rank}.json").write_bytes(msgspec.json.encode(r))
    return directory


class Artifacts:
    """A record's artifacts in a folder (what the tool's evidence builder does, minus the ledger)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names: list[str] = []

    def path(self, name: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.names.append(name)
        return self.root / name

    def write_bytes(self, name: str, data: bytes) -> Path:
        p = self.path(name)
        p.write_bytes(data)
        return p

    def write_json(self, name: str, value: Any) -> Path:
        return self.write_bytes(name, json.dumps(value).encode())

    def scrubber(self) -> Scrubber:
        return Scrubber()

    def copy_in(self, name: str, source: BinaryIO) -> Path:
        p = self.path(name)
        with p.open("wb") as out:
            shutil.copyfileobj(source, out)
        return p
