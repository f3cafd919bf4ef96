"""Name the line of the training loop that each op runs under, in a profiled run with stacks.

torch's Python tracer names each frame ``file(N): func``, where N is the function's first line, or,
for a frame already running when tracing began, the line it stood at then. A training loop is such a
frame (module-level code, a ``main()``): every op it runs would carry the line where the profiler
started (often the optimizer step, where the harness starts it), so forward, backward and the update
could not be told apart. While the profiler records, `LineRanges` opens a record_function range
``perfgate.line: <file>(<line>): <function>`` for each line the loop's code executes and closes it at
the next line: the analysis (`perfgate.traces.analyses.code`) reads the loop's line for every op inside.

The loop is the innermost user frame (outside torch, perfgate, the standard library and installed
packages) around the first profiler step, which the harness takes in the optimizer step: the code
that calls ``optimizer.step()``. Only that code object gets line events (``sys.settrace`` with a
global function that declines every other frame), so the cost is one range per executed line of the
loop. Nothing is installed when another tracer is active (a debugger, coverage): it is left alone.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from types import CodeType, FrameType
from typing import Any

__all__ = ["LINE_PREFIX", "LineRanges", "loop_frame"]

LINE_PREFIX = "perfgate.line: "
_LIBRARY_DIRS = frozenset(
    {"torch", "perfgate", "functorch", "triton", "torchgen", "site-packages", "dist-packages"}
)


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(roots))


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    parts = filename.replace("\\", "/").split("/")
    if not _LIBRARY_DIRS.isdisjoint(parts[:-1]):
        return False
    path = os.path.realpath(filename)
    return not any(path == root or path.startswith(root + os.sep) for root in _library_roots())


def loop_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame at or above ``frame`` that runs the user's own code."""
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


class LineRanges:
    """A profiler range per executed line of one code object (the training loop's)."""

    def __init__(self) -> None:
        self._code: CodeType | None = None
        self._frame: FrameType | None = None
        self._open: Any = None
        self._installed = False

    @property
    def installed(self) -> bool:
        return self._installed

    def install(self, frame: FrameType | None = None) -> bool:
        """Trace the lines of the user's loop around ``frame`` (the caller's by default); False when
        there is none or another tracer is active."""
        if self._installed or sys.gettrace() is not None:
            return False
        loop = loop_frame(frame if frame is not None else sys._getframe(1))  # pyright: ignore[reportPrivateUsage] -- the only way to reach the running loop frame
        if loop is None:
            return False
        self._code, self._frame = loop.f_code, loop
        loop.f_trace = self._local
        loop.f_trace_lines = True
        sys.settrace(self._global)
        self._installed = True
        return True

    def remove(self) -> None:
        """Stop tracing and close the open range (idempotent)."""
        if not self._installed:
            return
        self._installed = False
        if sys.gettrace() == self._global:  # a bound method: equal, never the same object
            sys.settrace(None)
        if self._frame is not None:
            self._frame.f_trace = None
        self._frame = None
        self._close()

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is self._code:
            frame.f_trace_lines = True
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._installed:
            return None
        try:
            if event == "line":
                self._close()
                import torch

                code = frame.f_code
                self._open = torch.ops.profiler._record_function_enter_new(
                    f"{LINE_PREFIX}{code.co_filename}({frame.f_lineno}): {code.co_name}", None
                )
            elif event == "return":
                self._close()
        except Exception:  # noqa: BLE001 -- the job must never fail for a name in its profile
            self.remove()
            return None
        return self._local

    def _close(self) -> None:
        handle, self._open = self._open, None
        if handle is not None:
            import torch

            torch.ops.profiler._record_function_exit._RecordFunction(handle)
