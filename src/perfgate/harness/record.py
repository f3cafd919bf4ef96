"""The per-rank record file the harness writes: name, schema tag and atomic write.

A record is one JSON object per rank (``rank<N>.json``). Its layout is documented on
:func:`perfgate.harness.window.Window.to_record`; the server reads it with
``perfgate.benchmarking.records``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["RECORD_SCHEMA", "RECORD_VERSION", "record_path", "write_record"]

RECORD_SCHEMA = "perfgate.harness.record"
RECORD_VERSION = 1


def record_path(record_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its record inside ``record_dir``."""
    return Path(record_dir) / f"rank{rank}.json"


def write_record(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as JSON so that readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
