"""The probe as the server handles it: its script file, its argv, its output.

The probe script (``script/perfgate_envprobe.py``) is never imported by the server. It runs as
``[python, <installed script path>]``: a short argv a human can approve, stable across calls (approvals
bind to it), runnable by an interpreter without perfgate, and kept out of the workspace, where an agent
could plant a module next to it (a script's folder is first on its ``sys.path``). Its folder holds only
the script and an empty ``__init__.py``, and the probe removes that folder from ``sys.path`` first thing.
When perfgate is installed as a zip, the script is copied once to a private per-user cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from perfgate.envprobe.models import Unavailable

__all__ = [
    "InterpreterError",
    "ProbeOutput",
    "is_server_interpreter",
    "parse_probe_output",
    "probe_script",
    "probe_sha256",
    "probe_source",
    "resolve_interpreter",
]

_SCRIPT = "perfgate_envprobe.py"


def probe_source() -> str:
    """The probe script's text, read from the installed package."""
    return resources.files("perfgate.envprobe.script").joinpath(_SCRIPT).read_text(encoding="utf-8")


def probe_sha256() -> str:
    return hashlib.sha256(probe_source().encode("utf-8")).hexdigest()


def probe_script() -> Path:
    """The absolute path of the probe script as a file on disk."""
    packaged = Path(str(resources.files("perfgate.envprobe.script").joinpath(_SCRIPT)))
    if packaged.is_file():
        return packaged.resolve()
    # Zip installs: a per-user folder only its owner can write, named by content hash (stable argv).
    folder = Path(tempfile.gettempdir()) / f"perfgate-envprobe-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"{folder} is not a private folder of this user; remove it and retry")
    target = folder / f"envprobe_{probe_sha256()[:12]}.py"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".envprobe-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(probe_source())
    os.replace(tmp, target)
    return target


def is_server_interpreter(python: str | None) -> bool:
    """True for None or the server's own ``sys.executable`` (compared as absolute paths, not resolved).

    Symlinks are deliberately not followed: a virtualenv's ``bin/python`` links to the base interpreter
    but is a different environment (its ``sys.prefix`` comes from the path it was started as).
    """
    if python is None:
        return True
    return os.path.abspath(python) == os.path.abspath(sys.executable)


class InterpreterError(ValueError):
    """The interpreter named cannot run the probe; the message says what to give instead."""


def resolve_interpreter(raw: str, workspace: Path) -> str:
    """The interpreter's absolute path (symlinks kept: a venv's python is a link, and that matters), from a
    path (relative to ``workspace``, or ``~``-prefixed) or a command name on the server's PATH.

    Raises:
        InterpreterError: not found, not a file, not executable, or not a program the kernel can start.
    """
    if "\x00" in raw or not raw.strip():
        raise InterpreterError("python must be a non-empty path or command name")
    if os.sep not in raw and not raw.startswith("~"):
        found = shutil.which(raw)
        if found is None:
            raise InterpreterError(
                f"no {raw!r} on the server's PATH; give the training interpreter's path, e.g. '.venv/bin/python' "
                "or '/opt/conda/bin/python'"
            )
        raw = found
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = workspace / path
    text = os.path.abspath(path)
    if not os.path.exists(text):
        raise InterpreterError(
            f"interpreter {text} does not exist (a missing file or a broken symlink); give the training "
            "interpreter's path, e.g. '.venv/bin/python'"
        )
    if not os.path.isfile(text):
        raise InterpreterError(
            f"interpreter {text} is not a file; give the path of the python executable itself"
        )
    if not os.access(text, os.X_OK):
        raise InterpreterError(f"interpreter {text} is not executable (chmod +x, or give the right python)")
    with open(text, "rb") as handle:
        magic = handle.read(4)
    if magic[:2] != b"#!" and magic != b"\x7fELF":
        raise InterpreterError(
            f"{text} is neither a native executable nor a script with a #! line, so it cannot be an interpreter"
        )
    return text


@dataclass
class ProbeOutput:
    """The probe's JSON Lines, merged by section."""

    sections: dict[str, Any] = field(default_factory=dict[str, Any])
    unavailable: list[Unavailable] = field(default_factory=list[Unavailable])
    stages: list[str] = field(default_factory=list[str])
    began: bool = False
    complete: bool = False
    elapsed_s: float | None = None
    stray_lines: int = 0

    @property
    def last_stage(self) -> str | None:
        return self.stages[-1] if self.stages else None


def parse_probe_output(text: str) -> ProbeOutput:
    """Parse what the probe printed. Lines that are not probe records are counted, not fatal."""
    out = ProbeOutput()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            parsed: Any = json.loads(line)
        except ValueError:
            out.stray_lines += 1
            continue
        if not isinstance(parsed, dict) or "section" not in parsed:
            out.stray_lines += 1
            continue
        record = cast("dict[str, Any]", parsed)
        section = str(record["section"])
        data: Any = record.get("data")
        if section == "_begin":
            out.began = True
        elif section == "_stage":
            out.stages.append(str(data))
        elif section == "_end":
            out.complete = True
            elapsed: Any = cast("dict[str, Any]", data).get("elapsed_s") if isinstance(data, dict) else None
            out.elapsed_s = float(elapsed) if isinstance(elapsed, (int, float)) else None
        else:
            out.sections[section] = data
        missing: Any = record.get("unavailable")
        for item in cast("list[Any]", missing) if isinstance(missing, list) else []:
            entry = cast("dict[str, Any]", item) if isinstance(item, dict) else {}
            if "item" in entry and "reason" in entry:
                out.unavailable.append(Unavailable(item=str(entry["item"]), reason=str(entry["reason"])))
    return out
