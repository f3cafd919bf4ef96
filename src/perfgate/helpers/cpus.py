"""How many CPUs this process may run on, for sizing its thread and process pools."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; every CPU where there is none), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # no affinity mask outside Linux
        return max(os.cpu_count() or 1, 1)
