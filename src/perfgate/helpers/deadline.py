"""A deadline and cancellation point for CPU-bound parsing that runs in a worker thread.

A tool starts the work with `anyio.to_thread.run_sync` and, inside the worker, enters `deadline(...)`;
readers call `checkpoint()` every block of input (cheap: a context-variable read and a clock read).
`checkpoint()` then raises `DeadlineExceeded` once the time is up, and the backend's cancellation
exception when the tool call was cancelled, so the worker stops instead of running on unseen. Outside a
`deadline` block (a library caller, a test) `checkpoint()` does nothing.

The limits themselves are operator settings (`ParseLimits`), read from the server's environment or
its command line, never from the agent's arguments.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MAX_TRACE_EVENTS",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_PARSE_DEADLINE_S",
    "MEMORY_ENV",
    "TRACE_EVENT_BYTES",
    "DeadlineExceeded",
    "ParseLimits",
    "checkpoint",
    "deadline",
    "past_memory_budget",
]

DEFAULT_PARSE_DEADLINE_S = 600.0
"""Longest one tool call may spend parsing and analyzing its input files (traces, sample records).
A 1 GB trace takes well under a minute on one core; a slower call is stuck, or far beyond what an
agent should wait for. Raise it with ``perfgate serve --parse-deadline-s`` or
``PERFGATE_PARSE_DEADLINE_S``."""
DEFAULT_MAX_TRACE_EVENTS = 100_000_000
"""Most events read from one trace file. A long real capture holds a few million (about 100 bytes of
memory each once tabled); raise it with ``perfgate serve --max-trace-events`` or
``PERFGATE_MAX_TRACE_EVENTS``."""

DEFAULT_MEMORY_MB = 2048
"""Memory (MiB) the server may take to read one call's inputs: a laptop's share. Traces are bounded by it
before they are read whole (`ParseLimits.trace_events`); raise it with ``PERFGATE_MEMORY_MB`` where the
machine has the memory."""
MEMORY_ENV = "PERFGATE_MEMORY_MB"
TRACE_EVENT_BYTES = 256
"""Server memory one trace event takes once read and analysed (its table row, its share of the names, the
analysis's working copies): ~190 bytes measured on a million-event trace, rounded up."""

_DEADLINE_ENV = "PERFGATE_PARSE_DEADLINE_S"
_EVENTS_ENV = "PERFGATE_MAX_TRACE_EVENTS"
DEADLINE_HOW = f"raise it with `perfgate serve --parse-deadline-s SECONDS` (or {_DEADLINE_ENV} in the server's environment)"
EVENTS_HOW = (
    f"raise it with `perfgate serve --max-trace-events N` (or {_EVENTS_ENV} in the server's environment)"
)


class DeadlineExceeded(Exception):
    """The parsing deadline passed; the message names the limit and how to raise it."""


@dataclass(frozen=True)
class ParseLimits:
    """Operator limits on one tool call's parsing (server-wide, fixed at start-up)."""

    deadline_s: float = DEFAULT_PARSE_DEADLINE_S
    max_trace_events: int = DEFAULT_MAX_TRACE_EVENTS
    memory_mb: float = DEFAULT_MEMORY_MB

    def trace_events(self, at_once: int = 1) -> tuple[int, str]:
        """The most events one trace file may hold where ``at_once`` files are read together, and what to
        do past it: ``max_trace_events``, or fewer where that many events (`TRACE_EVENT_BYTES` each) would
        take the reading past the memory budget (``memory_mb``), refused while it is read."""
        in_budget = int(self.memory_mb * (1 << 20)) // TRACE_EVENT_BYTES // max(at_once, 1)
        if in_budget >= self.max_trace_events:
            return self.max_trace_events, EVENTS_HOW
        files = f", shared by the {at_once} files read at once" if at_once > 1 else ""
        return in_budget, (
            f"reading more would take the server past its memory budget of {self.memory_mb:g} MiB "
            f"({MEMORY_ENV}, ~{TRACE_EVENT_BYTES} bytes an event{files}); where the machine has the memory, "
            f"raise {MEMORY_ENV} in the server's environment"
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ParseLimits:
        """Defaults overridden by ``PERFGATE_PARSE_DEADLINE_S`` / ``PERFGATE_MAX_TRACE_EVENTS`` /
        ``PERFGATE_MEMORY_MB``.

        Raises:
            ValueError: a set variable is not a positive number (the message names it).
        """
        env = os.environ if environ is None else environ
        return cls(
            deadline_s=_positive(env.get(_DEADLINE_ENV), _DEADLINE_ENV, DEFAULT_PARSE_DEADLINE_S),
            max_trace_events=int(_positive(env.get(_EVENTS_ENV), _EVENTS_ENV, DEFAULT_MAX_TRACE_EVENTS)),
            memory_mb=_positive(env.get(MEMORY_ENV), MEMORY_ENV, DEFAULT_MEMORY_MB),
        )


def past_memory_budget(size: int, held_per_byte: int, what: str) -> str | None:
    """Why a file of ``size`` bytes read whole (``held_per_byte``: server memory per byte of it once parsed)
    cannot be read within ``PERFGATE_MEMORY_MB``, naming the limit; None when it fits.

    Raises:
        ValueError: PERFGATE_MEMORY_MB is set but not a positive number.
    """
    budget = _positive(os.environ.get(MEMORY_ENV), MEMORY_ENV, DEFAULT_MEMORY_MB)
    if size * held_per_byte <= budget * (1 << 20):
        return None
    return (
        f"{what} is {size / (1 << 20):.0f} MiB: read whole, it would take the server past its memory budget "
        f"of {budget:g} MiB ({MEMORY_ENV}); split it, or raise {MEMORY_ENV} in the server's environment where "
        "the machine has the memory"
    )


def _positive(raw: str | None, name: str, default: float) -> float:
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{name}={raw!r}: expected a positive number")
    return value


@dataclass(frozen=True)
class _Deadline:
    ends_at: float
    seconds: float
    what: str
    cancellable: bool
    stopped: Callable[[], bool] | None


_current: ContextVar[_Deadline | None] = ContextVar("perfgate_deadline", default=None)


@contextmanager
def deadline(
    seconds: float,
    what: str,
    *,
    ends_at: float | None = None,
    cancellable: bool = True,
    stopped: Callable[[], bool] | None = None,
) -> Generator[None]:
    """Within the block, `checkpoint()` enforces a deadline of ``seconds`` for ``what`` (e.g. "reading
    trace x.json"), counted from now or ending at ``ends_at`` (`time.monotonic`, for a deadline shared by
    several worker calls); ``cancellable``: also stop when the anyio task that started this worker
    thread is cancelled (only valid inside `anyio.to_thread.run_sync`); ``stopped``: also stop once it
    returns true (a worker process whose caller has given up)."""
    end = time.monotonic() + seconds if ends_at is None else ends_at
    token = _current.set(_Deadline(end, seconds, what, cancellable, stopped))
    try:
        yield
    finally:
        _current.reset(token)


def checkpoint() -> None:
    """Stop here if the current deadline passed or the call was cancelled; a no-op outside `deadline`.

    Raises:
        DeadlineExceeded: the time is up, or ``stopped`` said so.
        (the anyio backend's cancellation exception): the tool call was cancelled.
    """
    current = _current.get()
    if current is None:
        return
    if current.cancellable:
        import anyio.from_thread

        anyio.from_thread.check_cancelled()
    if current.stopped is not None and current.stopped():
        raise DeadlineExceeded(f"{current.what} stopped: the call that asked for it has ended")
    if time.monotonic() > current.ends_at:
        raise DeadlineExceeded(
            f"{current.what} ran past the {current.seconds:g} s parsing deadline: the input is too large or "
            f"pathological for one call. Pass fewer or smaller files, or {DEADLINE_HOW}"
        )
