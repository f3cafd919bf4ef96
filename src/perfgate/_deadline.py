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
    "DEFAULT_PARSE_DEADLINE_S",
    "DeadlineExceeded",
    "ParseLimits",
    "checkpoint",
    "deadline",
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

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ParseLimits:
        """Defaults overridden by ``PERFGATE_PARSE_DEADLINE_S`` / ``PERFGATE_MAX_TRACE_EVENTS``.

        Raises:
            ValueError: a set variable is not a positive number (the message names it).
        """
        env = os.environ if environ is None else environ
        return cls(
            deadline_s=_positive(env.get(_DEADLINE_ENV), _DEADLINE_ENV, DEFAULT_PARSE_DEADLINE_S),
            max_trace_events=int(_positive(env.get(_EVENTS_ENV), _EVENTS_ENV, DEFAULT_MAX_TRACE_EVENTS)),
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
