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
    """Peak resident set size over the process lifetime (it cannot be reset per window)."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    peak_bytes = int(peak) if sys.platform == "darwin" else int(peak) * 1024
    # ru_maxrss is sampled by the kernel; never report a peak below the current size.
    return max(peak_bytes, host_rss_bytes() or 0)
