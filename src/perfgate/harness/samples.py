"""Record which sample ids each rank and DataLoader worker loads, for the audit_samples tool.

Four ways in, from least to most code change:

- ``RecordingSampler(sampler, directory)`` wraps any sampler (e.g. DistributedSampler) and records
  each index as the sampler hands it out, in the main process (worker -1).
- ``RecordingDataset(dataset, directory, sampler=recording_sampler)`` wraps a map-style dataset and
  records each index in the process that loads it, with its DataLoader worker id; epochs come from
  the sampler, also with persistent workers.
- ``record_iterable(dataset, directory, sample_id=...)`` wraps an IterableDataset: each loader
  worker records the id of every item it yields (a dataset that does not split its stream by
  worker shows up as ids repeated across workers).
- ``SampleLog(directory)`` is the writer they all use; call ``log.record(ids, epoch=..., step=...)`` from
  the training loop to record what was consumed, with the training step (the step lets the audit tell
  work lost in a crash from replayed samples).

Each (rank, worker) appends JSON lines to its own file, ``samples-r<rank>-w<worker>.jsonl`` in the
directory, one write per batch (per 1024 ids for the sampler, 64 for an iterable: what a killed
process had not written yet is lost). In the process a harness window times, records written while a
window is measured are held and written at the window's end edge, so recording is never timed.

Every record carries its launch and its pass. ``session`` is the launch id: one per training process
(``PERFGATE_LAUNCH_ID``: 1, 2, 3 ... per workspace in runs the server launches, else drawn once from the
clock and handed to loader workers through the environment), so a repeated launch appending to the same folder is told apart from a resume. A
launch that starts again at the run's first epoch and step is a new run to the audit; a resumed launch
says so with ``resumed=True`` (its first record per file carries ``restart``) or by recording steps.
``pass`` numbers the passes over the loader within an epoch: a pass abandoned part-way (a one-batch
peek with ``next(iter(loader))``) keeps the epoch, and the next pass counts up, so the audit can name
the peek instead of reporting duplicate records. Every record carries a ``session`` token fixed when the
wrapper is built, so a resumed run is told apart from the run it resumes. Point audit_samples at
the directory. Nothing here imports mcp, and only ``record_iterable`` imports torch.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence, Sized
from pathlib import Path
from typing import Any, Protocol, cast

import msgspec

from perfgate.harness._rank import rank_from_env
from perfgate.harness._state import active_window

__all__ = [
    "RecordingDataset",
    "RecordingSampler",
    "SampleLog",
    "launch_id",
    "record_iterable",
    "sample_log_path",
]

LAUNCH_ENV = "PERFGATE_LAUNCH_ID"
GIVEN_ENV = "PERFGATE_LAUNCH_GIVEN"
"""Set (to ``1``) with ``PERFGATE_LAUNCH_ID`` by the server that numbered this launch
(`perfgate.execution.launches`)."""
_SAMPLER_FLUSH_IDS = 1024
_ITERABLE_FLUSH_IDS = 64
_MAIN_PROCESS = -1


def launch_id() -> int:
    """This process's launch id: ``PERFGATE_LAUNCH_ID`` if set (an integer), else a new one (the
    wall clock in ns), exported so that loader workers started later share it."""
    value = os.environ.get(LAUNCH_ENV, "")
    try:
        return int(value)
    except ValueError:
        launch = time.time_ns()
        os.environ[LAUNCH_ENV] = str(launch)
        return launch


def start_launch() -> int:
    """A harness launch's id: the one the server gave it (``PERFGATE_LAUNCH_ID``, a positive integer,
    with ``PERFGATE_LAUNCH_GIVEN=1``), else a new one whatever the environment inherited. The marker is
    dropped, so a harnessed process this one starts draws an id of its own."""
    given = os.environ.pop(GIVEN_ENV, None) == "1"
    value = os.environ.get(LAUNCH_ENV, "")
    if given and value.isdigit() and int(value) > 0:
        return int(value)
    launch = time.time_ns()
    os.environ[LAUNCH_ENV] = str(launch)
    return launch


def sample_log_path(directory: str | os.PathLike[str], rank: int, worker: int = _MAIN_PROCESS) -> Path:
    """The file that (rank, worker) appends to; worker -1 is the main process."""
    tag = "main" if worker == _MAIN_PROCESS else f"{worker:03d}"
    return Path(directory) / f"samples-r{rank:05d}-w{tag}.jsonl"


def _id_text(value: Any) -> str:
    """One id as JSON: ints (numpy and 0-d tensors included) stay ints, strings stay strings."""
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"sample ids must be ints or strings, got {type(value).__name__}: {value!r}")
    return str(value.__index__())


class SampleLog:
    """Appends sample-id records of one (rank, worker) to its own JSON Lines file.

    Records are written in one ``os.write`` per ``record`` call onto an O_APPEND descriptor, so
    nothing waits in a buffer when the process dies. The descriptor is reopened after a fork.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rank: int | None = None,
        worker: int = _MAIN_PROCESS,
        session: int | None = None,
        resumed: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.resumed = resumed
        self._mark_restart = resumed
        self.rank = rank_from_env().rank if rank is None else int(rank)
        self.worker = int(worker)
        self.session = launch_id() if session is None else int(session)
        self.path = sample_log_path(self.directory, self.rank, self.worker)
        self._fd: int | None = None
        self._pid = -1

    def record(
        self, sample_ids: Iterable[Any], *, epoch: int, step: int | None = None, pass_index: int | None = None
    ) -> None:
        """Append one record per id (a list, a 1-D tensor or array, any iterable of ints or strings).

        ``pass_index`` numbers the passes over the loader within ``epoch`` (0 the first): give it when
        the loop may start a pass more than once per epoch (a peek at one batch, a restarted loop).

        Raises:
            TypeError: an id is neither an int nor a string.
        """
        tolist = getattr(sample_ids, "tolist", None)  # tensors and arrays: one call instead of n items
        values = list(cast("Iterable[Any]", tolist()) if callable(tolist) else sample_ids)
        if not values:
            return
        head = '{"sample_id":'
        tail = f',"epoch":{int(epoch)},"rank":{self.rank},"worker":{self.worker},"session":{self.session}'
        if step is not None:
            tail += f',"step":{int(step)}'
        if pass_index is not None:
            tail += f',"pass":{int(pass_index)}'
        tail += "}\n"
        # plain ints, the common case, are joined at C speed
        texts = list(map(str, values) if set(map(type, values)) == {int} else map(_id_text, values))
        first = ""
        if self._mark_restart:  # the first record this resumed launch writes to the file
            self._mark_restart = False
            first = head + texts.pop(0) + tail[:-2] + ',"restart":true}\n'
        body = head + (tail + head).join(texts) + tail if texts else ""
        self._write((first + body).encode())

    def _write(self, data: bytes) -> None:
        window = active_window()
        if window is not None and window.measuring:
            # Recording is perfgate's own work: held while a window is measured, written at its end.
            window.defer(lambda: self._write_now(data))
            return
        self._write_now(data)

    def _write_now(self, data: bytes) -> None:
        if self._fd is None or self._pid != os.getpid():
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._pid = os.getpid()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        """Close the file (records are already written; a later record reopens it)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> SampleLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # a descriptor means nothing in another process: it reopens on first write there
        return {**self.__dict__, "_fd": None, "_pid": -1}


class _Sampler(Protocol):
    def __iter__(self) -> Iterator[Any]: ...


class RecordingSampler:
    """Wraps a sampler and records, per pass, the ids it yields.

    The epoch of a pass is the value last given to ``set_epoch`` (forwarded to the wrapped sampler).
    A pass that ``set_epoch`` did not announce stays in the current epoch as its next pass (``pass``
    1, 2, ...): after a pass abandoned part-way (``next(iter(loader))``), and in any loop that has
    called ``set_epoch`` before (the audit then names the missed call). A loop that never calls
    ``set_epoch`` gets a new epoch per completed pass (starting at ``start_epoch``), and the audit then
    sees the repeated order.
    """

    def __init__(
        self,
        sampler: _Sampler,
        directory: str | os.PathLike[str],
        *,
        rank: int | None = None,
        start_epoch: int = 0,
        resumed: bool = False,
    ) -> None:
        if rank is None:
            inner_rank = getattr(sampler, "rank", None)
            rank = inner_rank if isinstance(inner_rank, int) else rank_from_env().rank
        self.sampler = sampler
        self.log = SampleLog(directory, rank=rank, resumed=resumed)
        self.recording = True
        self._pending: int | None = None
        self._next_epoch = start_epoch
        self._epoch: int | None = None
        self._pass = 0
        self._finished = True
        self._epochs_announced = False
        # shared with loader workers so a following RecordingDataset sees the epoch and pass
        self.epoch_value: Any = multiprocessing.Value("q", start_epoch, lock=False)
        self.pass_value: Any = multiprocessing.Value("q", 0, lock=False)

    @property
    def rank(self) -> int:
        return self.log.rank

    def set_epoch(self, epoch: int) -> None:
        """Number the next pass `epoch`, and forward it to the wrapped sampler."""
        self._pending = int(epoch)
        self._epochs_announced = True
        inner = getattr(self.sampler, "set_epoch", None)
        if callable(inner):
            inner(epoch)

    def __len__(self) -> int:
        # DataLoader asks for a length only of samplers that have one
        return len(cast("Sized", self.sampler))

    def __iter__(self) -> Iterator[Any]:
        if self._pending is not None:
            epoch = self._pending
        elif self._epoch is not None and (self._epochs_announced or not self._finished):
            epoch = self._epoch  # an unannounced pass, or one after an abandoned pass: same epoch
        else:
            epoch = self._next_epoch
        self._pending = None
        self._pass = self._pass + 1 if epoch == self._epoch else 0
        self._epoch = epoch
        self._next_epoch = epoch + 1
        self._finished = False
        self.epoch_value.value = epoch
        self.pass_value.value = self._pass
        return self._recorded(iter(self.sampler), epoch, self._pass)

    def _recorded(self, inner: Iterator[Any], epoch: int, pass_index: int) -> Iterator[Any]:
        batch: list[Any] = []
        recording = self.recording
        try:
            for index in inner:
                if recording:
                    batch.append(index)
                    if len(batch) >= _SAMPLER_FLUSH_IDS:
                        self.log.record(batch, epoch=epoch, pass_index=pass_index)
                        batch = []
                yield index
            if self._epoch == epoch and self._pass == pass_index:
                self._finished = True
        finally:
            # runs when the pass ends, and when an abandoned pass's iterator is closed
            self.log.record(batch, epoch=epoch, pass_index=pass_index)


class _MapDataset(Protocol):
    def __getitem__(self, index: Any) -> Any: ...


class RecordingDataset:
    """Wraps a map-style dataset; each loading process records the indices it fetches.

    Records carry the DataLoader worker id (-1 when loading in the main process). Give ``sampler``
    (a RecordingSampler) to take epochs from it: that sampler then stops recording itself, so each
    index is recorded once, by the process that loaded it. Without a sampler, call ``set_epoch``
    before each epoch (non-persistent workers only: persistent workers keep the epoch they were
    started with). ``sample_id`` maps (index, item) to the id to record; default: the index.
    """

    def __init__(
        self,
        dataset: _MapDataset,
        directory: str | os.PathLike[str],
        *,
        rank: int | None = None,
        sampler: RecordingSampler | None = None,
        sample_id: Any = None,
        resumed: bool | None = None,
    ) -> None:
        self.dataset = dataset
        self.resumed = (sampler is not None and sampler.log.resumed) if resumed is None else resumed
        self.directory = Path(directory)
        if rank is None:
            rank = sampler.rank if sampler is not None else rank_from_env().rank
        self.rank = int(rank)
        self.sample_id = sample_id
        self.session = launch_id() if sampler is None else sampler.log.session
        self._pass: Any = None
        if sampler is not None:
            sampler.recording = False
            self._epoch: Any = sampler.epoch_value
            self._pass = sampler.pass_value
        else:
            self._epoch = multiprocessing.Value("q", 0, lock=False)
        self._logs: dict[tuple[int, int], SampleLog] = {}

    def set_epoch(self, epoch: int) -> None:
        """Number the records of the coming epoch; forwarded to the wrapped dataset if it has set_epoch."""
        self._epoch.value = int(epoch)
        inner = getattr(self.dataset, "set_epoch", None)
        if callable(inner):
            inner(epoch)

    def __len__(self) -> int:
        return len(cast("Sized", self.dataset))

    def __getitem__(self, index: Any) -> Any:
        item = self.dataset[index]
        self._record([index], [item])
        return item

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        inner = getattr(self.dataset, "__getitems__", None)
        items = cast("list[Any]", inner(indices)) if callable(inner) else [self.dataset[i] for i in indices]
        self._record(indices, items)
        return items

    def _record(self, indices: Sequence[Any], items: Sequence[Any]) -> None:
        worker = _worker_id()
        key = (os.getpid(), worker)
        log = self._logs.get(key)
        if log is None:
            log = SampleLog(
                self.directory, rank=self.rank, worker=worker, session=self.session, resumed=self.resumed
            )
            self._logs[key] = log
        ids = (
            indices
            if self.sample_id is None
            else [self.sample_id(i, x) for i, x in zip(indices, items, strict=True)]
        )
        log.record(
            ids,
            epoch=int(self._epoch.value),
            pass_index=None if self._pass is None else int(self._pass.value),
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_logs": {}}


def _worker_id() -> int:
    """The DataLoader worker id of this process, -1 in the main process.

    A loader worker runs torch's data code, so a process that has not imported it is no worker:
    torch is then not imported just to ask.
    """
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return _MAIN_PROCESS
    info: Any = data.get_worker_info()
    return _MAIN_PROCESS if info is None else int(info.id)


class _IterableRecorder:
    """The body of the IterableDataset subclass that `record_iterable` builds."""

    def __init__(
        self, dataset: Iterable[Any], directory: str | os.PathLike[str], sample_id: Any, rank: int | None
    ) -> None:
        self.dataset = dataset
        self.directory = Path(directory)
        self.sample_id = sample_id
        self.rank = rank_from_env().rank if rank is None else int(rank)
        self.session = launch_id()
        self._epoch: Any = multiprocessing.Value("q", 0, lock=False)

    def set_epoch(self, epoch: int) -> None:
        """Number the records of the coming epoch (seen by workers, persistent ones included)."""
        self._epoch.value = int(epoch)
        inner = getattr(self.dataset, "set_epoch", None)
        if callable(inner):
            inner(epoch)

    def __iter__(self) -> Iterator[Any]:
        log = SampleLog(self.directory, rank=self.rank, worker=_worker_id(), session=self.session)
        epoch = int(self._epoch.value)
        batch: list[Any] = []
        try:
            for item in self.dataset:
                batch.append(self.sample_id(item))
                if len(batch) >= _ITERABLE_FLUSH_IDS:
                    log.record(batch, epoch=epoch)
                    batch = []
                yield item
        finally:
            log.record(batch, epoch=epoch)
            log.close()


def _iterable_class() -> type[Any]:
    """The torch IterableDataset subclass, built on first use and kept as a module attribute so
    that spawned loader workers can unpickle it by name."""
    cls = globals().get("RecordingIterableDataset")
    if cls is None:
        from torch.utils.data import IterableDataset

        cls = type(
            "RecordingIterableDataset",
            (_IterableRecorder, IterableDataset),
            {"__module__": __name__, "__doc__": "An IterableDataset that records the ids it yields."},
        )
        globals()["RecordingIterableDataset"] = cls
    return cls


def __getattr__(name: str) -> Any:
    if name == "RecordingIterableDataset":
        return _iterable_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def record_iterable(
    dataset: Iterable[Any],
    directory: str | os.PathLike[str],
    *,
    sample_id: Any,
    rank: int | None = None,
) -> Any:
    """Wrap an IterableDataset so each loading process records the id of every item it yields.

    ``sample_id(item)`` returns the id to record. The result is a torch IterableDataset (torch is
    imported here); call its ``set_epoch`` before each epoch. Records are written every 64 items
    and when a pass ends: a worker killed mid-pass loses at most 63 of its records.
    """
    return _iterable_class()(dataset, directory, sample_id, rank)
