"""The paths a run wrote that its command line names: outputs of the run, not settings of it.

``--dump captures/a.safetensors``, nanoGPT's ``--out_dir``, a script's ``--save`` or ``--log`` name where a
run writes; two runs that differ only there ran the same thing. What counts is observation, never the
option's name: a value is an output of a run when the server saw that path (or an entry under it, for a
folder) created or changed between its stamp before the first launch and its stamp after the last; the
harness's tensor dumps and checkpoint saves there say how it was written. A value the run
did not write (a config it read, a checkpoint it loaded, a data folder) stays a setting, whatever the option
is called, and so does code: a value naming a code file (`perfgate.envprobe.provenance.CODE_SUFFIXES`) or a
folder that held one before the run is what the run reads, even where the run writes beside it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from perfgate.benchmarking.workload.argv import argv_options, is_number
from perfgate.envprobe.provenance import CODE_SUFFIXES
from perfgate.evidence.access import as_dict, as_list

__all__ = [
    "MAX_STAMPED_OPTIONS",
    "MAX_WALK_ENTRIES",
    "ArgvPath",
    "RunOutput",
    "argv_paths",
    "mask_outputs",
    "output_options",
    "output_paths",
    "under",
    "written_outputs",
]

MAX_STAMPED_OPTIONS = 64
"""Option values stamped per run; options past it are never outputs (they stay settings)."""
MAX_WALK_ENTRIES = 2000
"""Entries of a folder value stamped (three levels deep at most); a larger folder is stamped by the
entries listed first and its own modification time."""
_MAX_DEPTH = 3
_STATE_DIR = ".perfgate"
_CACHES = frozenset({"__pycache__", _STATE_DIR})
"""Entries never stamped: the interpreter's byte-code caches (importing code writes them) and the server's
own state (it changes while any run goes on)."""
_CODE = "code:"
OUTPUT = "<output>"
"""What an output option's value reads as in a run's identity."""


class ArgvPath(BaseModel):
    """An option value of the command line as a path, stamped before the first launch."""

    option: str = Field(description="The option, e.g. '--dump'.")
    value: str = Field(description="Its value as given.")
    path: str = Field(description="The value resolved against the run's working directory.")
    before: str | None = Field(description="Its stamp before the first launch; null: nothing was there.")


class RunOutput(BaseModel):
    option: str = Field(description="The option whose value the run wrote, e.g. '--dump'.")
    value: str = Field(description="Its value as given.")
    path: str = Field(description="Relative to the workspace when inside it.")
    seen: str = Field(
        description="How the write was observed: 'tensor dump' or 'checkpoint save' (the harness saw the "
        "file written), or 'changed on disk' (the server's stamps before and after the launches differ)."
    )


def _stamp(path: Path) -> str | None:
    """Size and modification time of a file, or of a folder and the entries under it (bounded); prefixed
    `_CODE` when it is or holds a code file."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not path.is_dir():
        code = _CODE if path.suffix in CODE_SUFFIXES else ""
        return f"{code}file:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    digest = hashlib.sha256(f"dir:{st.st_mtime_ns}".encode())
    code = ""
    seen = 0
    stack: list[tuple[Path, int]] = [(path, 0)]
    while stack and seen < MAX_WALK_ENTRIES:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if seen >= MAX_WALK_ENTRIES:
                break
            if entry.name in _CACHES:
                continue
            seen += 1
            if os.path.splitext(entry.name)[1] in CODE_SUFFIXES:
                code = _CODE
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            digest.update(f"{entry.path}:{est.st_size}:{est.st_mtime_ns}\n".encode())
            if entry.is_dir(follow_symlinks=False) and depth + 1 < _MAX_DEPTH:
                stack.append((Path(entry.path), depth + 1))
    return f"{code}dir:{digest.hexdigest()}"


def argv_paths(argv: Sequence[str], cwd: Path, workspace: Path) -> list[ArgvPath]:
    """Each option value of ``argv`` read as a path and stamped now (before the run): numbers and
    switches are no paths, and the workspace or a folder above it is never an output (the server writes
    there during every run)."""
    root = workspace.resolve()
    out: list[ArgvPath] = []
    for name, value in argv_options(list(argv)).items():
        if len(out) >= MAX_STAMPED_OPTIONS:
            break
        if not value or value == "true" or is_number(value) or len(value) > 4096:
            continue
        try:
            path = (cwd / value).resolve()
        except (OSError, RuntimeError, ValueError):
            continue
        if path == root or path in root.parents or _STATE_DIR in path.parts:
            continue
        out.append(ArgvPath(option=f"--{name}", value=value, path=str(path), before=_stamp(path)))
    return out


def under(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies inside it (both absolute, or both relative to one root)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def written_outputs(
    stamped: Iterable[ArgvPath],
    dumped: Iterable[str],
    saved: Iterable[str],
    workspace: Path,
    launch_ids: Sequence[int] = (),
) -> list[RunOutput]:
    """The stamped option values the launches wrote: the path's stamp changed since it was taken (the
    server's own observation; the harness shares the process with the code under test, so its word alone
    makes nothing an output), named by how: a tensor dump (``dumped``) or a checkpoint save (``saved``)
    the harness saw at or under it, else a change on disk. A value that was code before the run is never
    one. A dump that found an earlier launch's file at its path and was kept apart beside it
    (``<stem>-launch<id><suffix>``, `perfgate.harness.dump`) wrote there too: that file exists now, is
    named for one of ``launch_ids`` (the server numbers launches), and the harness saw it dumped. Call after
    the last launch."""
    dumps = [os.path.realpath(d) for d in dumped]
    saves = [os.path.realpath(s) for s in saved]
    root = workspace.resolve()
    out: list[RunOutput] = []
    for p in stamped:
        if p.before is not None and p.before.startswith(_CODE):
            continue
        after = _stamp(Path(p.path))
        apart = (
            _kept_apart(Path(p.path), launch_ids, dumps) if after is not None and after == p.before else None
        )
        if after is None or (after == p.before and apart is None):
            continue
        if apart is not None:
            seen = f"tensor dump (kept apart from an earlier launch's file as {apart.name})"
        elif any(under(d, p.path) for d in dumps):
            seen = "tensor dump"
        elif any(under(s, p.path) for s in saves):
            seen = "checkpoint save"
        else:
            seen = "changed on disk"
        try:
            shown = Path(p.path).relative_to(root).as_posix()
        except ValueError:
            shown = p.path
        out.append(RunOutput(option=p.option, value=p.value, path=shown, seen=seen))
    return out


def _kept_apart(path: Path, launch_ids: Sequence[int], dumps: Sequence[str]) -> Path | None:
    """The file a launch of this run dumped beside ``path`` because ``path`` held an earlier launch's."""
    for launch in launch_ids:
        own = path.with_name(f"{path.stem}-launch{launch}{path.suffix}")
        if os.path.realpath(own) in dumps and own.is_file():
            return own
    return None


def _recorded(result: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(option, value, path) of each output a window record's ``result`` names."""
    out: list[tuple[str, str, str]] = []
    for entry in (as_dict(x) for x in as_list(result.get("outputs"))):
        option, value, path = entry.get("option"), entry.get("value"), entry.get("path")
        if isinstance(option, str) and isinstance(value, str) and isinstance(path, str):
            out.append((option, value, path))
    return out


def output_options(result: Mapping[str, Any]) -> dict[str, str]:
    """A window record's outputs (its ``result``): option -> the value the run wrote."""
    return {option: value for option, value, _ in _recorded(result)}


def output_paths(result: Mapping[str, Any]) -> list[str]:
    """The paths (workspace-relative where inside it) a window record's run wrote at its option values."""
    return [path for _, _, path in _recorded(result)]


def mask_outputs(tokens: Sequence[str], outputs: Mapping[str, str]) -> list[str]:
    """``tokens`` with the value of each option the run wrote (``outputs``: option -> value) read as
    `OUTPUT`: ``--dump a.pt`` and ``--dump=a.pt`` both. Only the value the run wrote is masked."""
    out = [*tokens]
    for i, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        flag, eq, value = token.partition("=")
        name = "--" + flag.lstrip("-").replace("-", "_").lower().rsplit(".", 1)[-1]
        if name not in outputs:
            continue
        if eq and value == outputs[name]:
            out[i] = f"{flag}={OUTPUT}"
        elif not eq and i + 1 < len(tokens) and tokens[i + 1] == outputs[name]:
            out[i + 1] = OUTPUT
    return out
