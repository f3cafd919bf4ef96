"""Host memory of this process, in bytes."""

from __future__ import annotations

import os
import sys

try:
    import resource
except ImportError:  # Windows has no getrusage
    resource = None

__all__ = ["host_peak_rss_bytes", "host_rss_bytes"]


def host_rss_bytes() -> int | None:
    """Resident set size now (Linux ``/proc``), or ``None`` where that file does not exist."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            resident_pages = int(fh.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def host_peak_rss_bytes() -> int | None:
    """Peak resident set size of this process since its program started (it cannot be reset per window).

    On Linux this is ``VmHWM`` of ``/proc/self/status``, the high-water mark of the memory the program
    itself mapped. ``ru_maxrss`` is the fallback elsewhere, never the first choice on Linux: there it keeps
    the resident size of the process this one was forked from (the server, at the fork before ``exec``), so
    a server holding a few hundred MB after a trace analysis would raise every launch's peak to its own.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return max(int(line.split()[1]) * 1024, host_rss_bytes() or 0)
    except (OSError, ValueError, IndexError):
        pass
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    peak_bytes = int(peak) if sys.platform == "darwin" else int(peak) * 1024
    # ru_maxrss is sampled by the kernel; never report a peak below the current size.
    return max(peak_bytes, host_rss_bytes() or 0)
