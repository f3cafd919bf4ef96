"""The per-rank record file the harness writes: name, schema tag and atomic write.

A record is one JSON object per rank (``rank<N>.json``). Its layout is documented on
:func:`perfgate.harness.window.Window.to_record`; the server reads it with
``perfgate.benchmarking.reading.records``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "RECORD_SCHEMA",
    "RECORD_STREAM_MARK",
    "RECORD_VERSION",
    "RecordStreamReader",
    "record_path",
    "stream_record",
    "write_record",
]

RECORD_SCHEMA = "perfgate.harness.record"
RECORD_VERSION = 1
RECORD_STREAM_MARK = "[perfgate-record]"
"""Starts each stdout line that carries a piece of a streamed record (``PERFGATE_RECORD_STREAM=1``)."""
_CHUNK = 900
"""Base64 characters per line. A whole line (mark, header, checksum, piece) stays under 1024 bytes: Slurm's
step daemon forwards task output in messages of at most 1024 bytes, and srun writes two tasks' messages
in arrival order, so a longer line can have another rank's fragment spliced into its middle."""


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


def stream_record(record: dict[str, Any], fd: int = 1) -> None:
    """Write ``record`` to ``fd`` as marked lines ``[perfgate-record] <rank> <launch> <i>/<n> <crc32> <base64>``.

    For launchers that forward each rank's stdout to the server (srun does, over its own connection):
    the records reach the server without a filesystem it shares with the nodes. Each line is one short
    ``write``, so ranks sharing a pipe or a forwarder do not cut into each other's lines; should one be cut
    anyway, its checksum no longer matches and the reader drops it rather than decode another rank's bytes.
    The reader puts the pieces together per (rank, launch id) whatever their order between ranks.
    """
    import base64
    import zlib

    data = base64.b64encode(json.dumps(record, separators=(",", ":")).encode()).decode("ascii")
    pieces = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [""]
    rank = int(record.get("rank", 0))
    launch = os.environ.get("PERFGATE_LAUNCH_ID", "0")
    for i, piece in enumerate(pieces):
        crc = zlib.crc32(piece.encode("ascii"))
        line = f"{RECORD_STREAM_MARK} {rank} {launch} {i}/{len(pieces)} {crc:08x} {piece}\n"
        os.write(fd, line.encode("ascii"))


class RecordStreamReader:
    """Collects streamed record pieces from output lines; the last whole record per rank wins."""

    def __init__(self) -> None:
        self._parts: dict[tuple[int, str], dict[int, str]] = {}
        self._sizes: dict[tuple[int, str], int] = {}
        self.records: dict[int, bytes] = {}
        self.bad_lines = 0

    def feed(self, line: str) -> bool:
        """Take ``line`` when it is a record piece (True); False for any other line."""
        import base64
        import binascii
        import zlib

        if not line.startswith(RECORD_STREAM_MARK + " "):
            return False
        try:
            _, rank_s, launch, frac, crc_s, piece = line.rstrip("\r\n").split(" ", 5)
            index_s, count_s = frac.split("/")
            rank, index, count, crc = int(rank_s), int(index_s), int(count_s), int(crc_s, 16)
        except ValueError:
            self.bad_lines += 1
            return True
        if zlib.crc32(piece.encode("ascii", errors="replace")) != crc or not 0 <= index < count:
            self.bad_lines += 1
            return True
        key = (rank, launch)
        if index == 0 or self._sizes.get(key) != count:
            # one process writes a rank's record piece after piece: a first piece starts a new version,
            # and what is left of an earlier one (a piece lost on the way) must not mix into it
            self._parts.pop(key, None)
        parts = self._parts.setdefault(key, {})
        self._sizes[key] = count
        parts[index] = piece
        if len(parts) == count and all(i in parts for i in range(count)):
            try:
                self.records[rank] = base64.b64decode("".join(parts[i] for i in range(count)), validate=True)
            except (binascii.Error, ValueError):
                self.bad_lines += count
            del self._parts[key]
        return True

    @property
    def incomplete(self) -> list[int]:
        """Ranks whose last record arrived only in part (the rank died while writing it)."""
        return sorted({rank for rank, _ in self._parts})
