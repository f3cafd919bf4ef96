"""Observed records as columns, and the builder every reader fills chunk by chunk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.ids import SampleIds, StringPool
from perfgate.helpers.deadline import checkpoint

__all__ = [
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "MalformedRow",
    "MalformedRows",
    "ObservedRecords",
    "RecordBuilder",
]

REQUIRED_COLUMNS = ("sample_id", "epoch", "rank", "worker")
"""Every observed record names its id, epoch, rank and worker (-1: the main process)."""

OPTIONAL_COLUMNS = ("step", "session", "restart", "pass")
"""step: training step of the record; session: the launch id of the writing process (a new launch,
whether a fresh run or a resume, has a new one); restart: true on records written after a resume;
pass: index of the pass over the loader within the epoch (0 first; a later pass in the same epoch
means the earlier one was abandoned, e.g. a one-batch peek with next(iter(loader)))."""

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class MalformedRow:
    """One record that could not be read: file, 1-based line (or row) number and why."""

    source: str
    line: int
    reason: str


@dataclass
class MalformedRows:
    """Records skipped as unreadable: the count is complete, the examples capped."""

    cap: int = 20
    count: int = 0
    examples: list[MalformedRow] = field(default_factory=lambda: list[MalformedRow]())

    def add(self, source: str, line: int, reason: str) -> None:
        self.count += 1
        if len(self.examples) < self.cap:
            self.examples.append(MalformedRow(source, line, reason))

    def add_many(self, source: str, lines: NDArray[np.int64], reason: str) -> None:
        """Count every line in `lines`, keeping examples up to the cap."""
        room = max(0, self.cap - len(self.examples))
        self.examples.extend(MalformedRow(source, line, reason) for line in lines[:room].tolist())
        self.count += int(lines.shape[0])


@dataclass(frozen=True)
class ObservedRecords:
    """Every readable observed record, in file order (files in name order).

    epoch >= 0, rank >= 0, worker >= -1 hold for every record (others are malformed).
    Optional columns are None when some record lacks them; `notes` then says how many.
    """

    ids: SampleIds
    epoch: NDArray[np.int32]
    rank: NDArray[np.int32]
    worker: NDArray[np.int32]
    step: NDArray[np.int64] | None
    session: NDArray[np.int64] | None
    restart: NDArray[np.bool_] | None
    pool: StringPool
    malformed: MalformedRows
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()
    pass_index: NDArray[np.int64] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, keep: NDArray[np.bool_]) -> ObservedRecords:
        """The records where ``keep`` is true, in the same order."""

        def opt(column: NDArray[Any] | None) -> NDArray[Any] | None:
            return None if column is None else column[keep]

        restart = opt(self.restart)
        return replace(
            self,
            ids=self.ids.take(keep),
            epoch=self.epoch[keep],
            rank=self.rank[keep],
            worker=self.worker[keep],
            step=opt(self.step),
            session=opt(self.session),
            restart=restart if restart is not None and restart.any() else None,
            pass_index=opt(self.pass_index),
        )


class RecordBuilder:
    """Collects validated chunks from one or more files and joins them into ObservedRecords."""

    def __init__(self, pool: StringPool | None = None, example_cap: int = 20) -> None:
        self.pool = pool if pool is not None else StringPool()
        self.malformed = MalformedRows(cap=example_cap)
        self.sources: list[str] = []
        self._ids: list[SampleIds] = []
        self._int32: dict[str, list[NDArray[np.int32]]] = {"epoch": [], "rank": [], "worker": []}
        self._int64: dict[str, list[NDArray[np.int64] | None]] = {"step": [], "session": [], "pass": []}
        self._restart: list[NDArray[np.bool_] | None] = []
        self._step_lacking = 0
        self._after_build: list[Callable[[], None]] = []

    def after_build(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the chunks are joined and released (each distinct callback once)."""
        if callback not in self._after_build:
            self._after_build.append(callback)

    def add(
        self,
        source: str,
        line_numbers: NDArray[np.int64] | int,
        ids: SampleIds,
        epoch: NDArray[np.integer[Any]],
        rank: NDArray[np.integer[Any]],
        worker: NDArray[np.integer[Any]],
        step: NDArray[np.int64] | None = None,
        session: NDArray[np.int64] | None = None,
        restart: NDArray[np.bool_] | None = None,
        step_lacking: int | None = None,
        pass_index: NDArray[np.int64] | None = None,
    ) -> None:
        """Add one chunk; rows with an out-of-range epoch, rank or worker become malformed rows.

        `line_numbers` gives each row's line (or row) number, or the first one when they count up by one.

        `step_lacking` is how many of the chunk's records have no step when `step` is None
        (default: all of them); it only feeds the note that says why step checks are off.

        Each chunk is also a deadline checkpoint (`perfgate.helpers.deadline`).
        """
        checkpoint()
        bad = (epoch < 0) | (epoch > _INT32_MAX) | (rank < 0) | (rank > _INT32_MAX)
        bad |= (worker < -1) | (worker > _INT32_MAX)
        if pass_index is not None:
            bad |= pass_index < 0
        if bad.any():
            where = np.flatnonzero(bad)
            room = max(0, self.malformed.cap - len(self.malformed.examples))
            for i in where[:room].tolist():
                self.malformed.add(
                    source,
                    line_numbers + i if isinstance(line_numbers, int) else int(line_numbers[i]),
                    f"epoch {int(epoch[i])}, rank {int(rank[i])}, worker {int(worker[i])}"
                    + ("" if pass_index is None else f", pass {int(pass_index[i])}")
                    + ": epoch, rank and pass must be >= 0 and worker >= -1 (-1 is the main process)",
                )
            self.malformed.count += max(0, int(where.shape[0]) - room)
            keep = ~bad
            ids, epoch, rank, worker = ids.take(keep), epoch[keep], rank[keep], worker[keep]
            step = None if step is None else step[keep]
            session = None if session is None else session[keep]
            restart = None if restart is None else restart[keep]
            pass_index = None if pass_index is None else pass_index[keep]
        if not len(ids):
            return
        if step is None:
            self._step_lacking += len(ids) if step_lacking is None else min(step_lacking, len(ids))
        self._ids.append(ids)
        self._int32["epoch"].append(epoch.astype(np.int32, copy=False))
        self._int32["rank"].append(rank.astype(np.int32, copy=False))
        self._int32["worker"].append(worker.astype(np.int32, copy=False))
        self._int64["step"].append(step)
        self._int64["session"].append(session)
        self._int64["pass"].append(pass_index)
        self._restart.append(restart)

    def build(self) -> ObservedRecords:
        """Join the chunks, releasing each column's chunks once it is joined."""
        ids_parts, self._ids = self._ids, []
        sizes = [len(p) for p in ids_parts]
        n_total = sum(sizes)
        ids = SampleIds.concat(ids_parts)
        del ids_parts
        epoch, rank, worker = (_join32(self._int32.pop(name)) for name in ("epoch", "rank", "worker"))
        notes: list[str] = []
        step_parts = self._int64.pop("step")
        step = None
        if step_parts and all(p is not None for p in step_parts):
            step = np.concatenate([p for p in step_parts if p is not None])
        elif self._step_lacking < n_total:  # some records have a step, others not
            notes.append(
                f"{self._step_lacking} of {n_total} records have no step: step-based resume checks are off"
            )
        del step_parts
        session_parts = self._int64.pop("session")
        session = None
        if any(p is not None for p in session_parts):
            # a record without a session token belongs to an unnamed session 0
            session = np.concatenate(
                [
                    p if p is not None else np.zeros(n, np.int64)
                    for n, p in zip(sizes, session_parts, strict=True)
                ]
            )
        pass_parts = self._int64.pop("pass")
        pass_index = None
        if any(p is not None for p in pass_parts):
            # records without a pass index (older writers) count as the epoch's first pass
            pass_index = np.concatenate(
                [
                    p if p is not None else np.zeros(n, np.int64)
                    for n, p in zip(sizes, pass_parts, strict=True)
                ]
            )
        del pass_parts
        restart = None
        if any(p is not None for p in self._restart):
            restart = np.concatenate(
                [
                    p if p is not None else np.zeros(n, np.bool_)
                    for n, p in zip(sizes, self._restart, strict=True)
                ]
            )
        self._restart = []
        for callback in self._after_build:
            callback()
        order = {source: i for i, source in enumerate(self.sources)}
        self.malformed.examples.sort(key=lambda m: (order.get(m.source, len(order)), m.line))
        return ObservedRecords(
            ids=ids,
            epoch=epoch,
            rank=rank,
            worker=worker,
            step=step,
            session=session,
            restart=restart,
            pool=self.pool,
            malformed=self.malformed,
            sources=tuple(self.sources),
            notes=tuple(notes),
            pass_index=pass_index,
        )


def _join32(parts: list[NDArray[np.int32]]) -> NDArray[np.int32]:
    if not parts:
        return np.empty(0, dtype=np.int32)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
