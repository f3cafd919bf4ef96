"""Does a code change touch checkpointing? Read from the files the change touched, never from its name.

The files a change touched are those whose code differs between the compared windows' recorded code
states (`perfgate.benchmarking.provenance.code_differences`: the sections of each side's diff against
its commit) and the workspace files the commands name whose digests differ. A touched file is read as the
runs held it: each side's section of its ``code.diff`` artifact (hash-checked) and the file at each side's
commit (from the workspace's git repository, read only), or, for a file the commands name, as the workspace
holds it now, if its bytes are still those the candidate ran (the digest its record took; otherwise it
counts as touching checkpointing, since what it held then cannot be read). A file touches checkpointing
when a line of it (comments left out) calls a checkpoint saver or loader: ``torch.save``/``torch.load``,
``torch.distributed.checkpoint`` (``dcp.save``/``dcp.load``), safetensors ``save_file``/``load_file``, or
a ``save_checkpoint``/``load_checkpoint`` of the project's own.

When the sides ran different commits, the files changed between the two are listed and read at each
commit from the workspace's git repository (`perfgate.execution.changes.commit_changes`); when they cannot
be (a commit the repository no longer holds, a side run outside git, too many files), the change counts as
touching checkpointing, as a file that cannot be read does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, str_list

__all__ = ["CHECKPOINT_CALL", "checkpoint_calls", "touched_checkpointing"]

CHECKPOINT_CALL = re.compile(
    r"\btorch\.(?:save|load)\s*\(|\btorch\.distributed\.checkpoint\b|\bdistributed\s+import\s+checkpoint\b"
    r"|\bdcp\.(?:async_)?(?:save|load)\s*\(|\b(?:save|load)_(?:file|checkpoint)\s*\("
)
"""A call of a checkpoint saver or loader (or the import of torch.distributed.checkpoint) in a line of code."""
_MAX_BYTES = 4 << 20
_SECTION = re.compile(rb"^diff --git a/(.*?) b/(.*?)$", re.MULTILINE)

Lookup = Callable[[str], EvidenceRecord | None]


def checkpoint_calls(text: str, *, diff: bool = False) -> list[str]:
    """The checkpoint calls ``text`` makes, each once, in order (``diff``: lines of a diff section, whose
    first character is its marker)."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        if diff:
            if line.startswith(("+++", "---", "diff --git", "@@")):
                continue
            line = line[1:]
        code = line.split("#", 1)[0]
        for m in CHECKPOINT_CALL.finditer(code):
            found[re.sub(r"\s+", " ", m.group(0)).rstrip("( ")] = None
    return list(found)


def _sections(workspace: Path, record: EvidenceRecord) -> dict[str, bytes]:
    """Path -> its section of the record's hash-checked ``code.diff`` (empty when there is none)."""
    from perfgate.evidence.artifacts import ArtifactChanged, read_artifact

    artifact = next((a for a in record.artifacts if a.name == "code.diff"), None)
    if artifact is None:
        return {}
    try:
        diff = read_artifact(workspace, artifact)
    except (ArtifactChanged, OSError):
        return {}
    starts = [(m.start(), m.group(2).decode("utf-8", "replace")) for m in _SECTION.finditer(diff)]
    return {
        path: diff[start : starts[i + 1][0] if i + 1 < len(starts) else len(diff)]
        for i, (start, path) in enumerate(starts)
    }


def _text(workspace: Path, name: str) -> bytes | None:
    try:
        path = (workspace / name).resolve()
        if (
            not path.is_relative_to(workspace.resolve())
            or not path.is_file()
            or path.stat().st_size > _MAX_BYTES
        ):
            return None
        return path.read_bytes()
    except OSError:
        return None


def _provenance(record: EvidenceRecord | None) -> dict[str, Any]:
    return as_dict(record.result.get("provenance")) if record is not None else {}


def _committed_calls(workspace: Path, old: Any, new: Any) -> list[str]:
    """What the files changed between the sides' commits call (``'<path> (changed between commits ...;
    calls torch.save)'``), or why they could not be read (one entry: it counts as touching checkpointing)."""
    from perfgate.execution.changes import commit_changes

    if not (isinstance(old, str) and old and isinstance(new, str) and new):
        return ["the code between the sides' commits (one side ran outside git: it cannot be read)"]
    span = f"commits {old[:12]} and {new[:12]}"
    files, problem = commit_changes(workspace, old, new)
    if problem is not None:
        return [f"the code changed between {span} ({problem}: it cannot be read)"]
    found: list[str] = []
    for path, sides in files.items():
        calls = [
            c for text in sides if text is not None for c in checkpoint_calls(text.decode("utf-8", "replace"))
        ]
        if calls:
            found.append(f"{path} (changed between {span}; calls {', '.join(dict.fromkeys(calls))})")
    return found


def touched_checkpointing(comparison: EvidenceRecord, lookup: Lookup, workspace: Path) -> list[str]:
    """``'<path> (calls torch.save)'`` for each touched file that saves or loads checkpoints, or what could not
    be read. Empty when the change touched none, or no side recorded its code."""
    from perfgate.benchmarking.provenance import code_differences
    from perfgate.execution.changes import commit_file

    sides = [
        next(
            (
                r
                for i in str_list(comparison.inputs.get(side))
                if (r := lookup(i)) is not None and _provenance(r)
            ),
            None,
        )
        for side in ("baseline", "candidate")
    ]
    base, cand = sides
    if base is None or cand is None:
        return []
    b_prov, c_prov = _provenance(base), _provenance(cand)
    b_code, c_code = as_dict(b_prov.get("code")), as_dict(c_prov.get("code"))
    changed = [p for p in code_differences(b_code, c_code) if p != "commit"]
    found: list[str] = []
    b_commit, c_commit = b_code.get("commit"), c_code.get("commit")
    if b_commit != c_commit:
        found += _committed_calls(workspace, b_commit, c_commit)
    b_files, c_files = as_dict(b_prov.get("files")), as_dict(c_prov.get("files"))
    named = sorted(p for p in set(b_files) & set(c_files) if b_files[p] != c_files[p])
    sections = (_sections(workspace, base), _sections(workspace, cand))
    for path in dict.fromkeys([*changed, *named]):
        calls: list[str] = []
        for own in sections:
            if path in own:
                calls += checkpoint_calls(own[path].decode("utf-8", "replace"), diff=True)
        if path in c_files:  # named by the commands: the workspace's file, if it is still what ran
            now = _text(workspace, path)
            if now is None or hashlib.sha256(now).hexdigest() != c_files[path]:
                found.append(f"{path} (changed since the candidate ran: what it held then cannot be read)")
                continue
            calls += checkpoint_calls(now.decode("utf-8", "replace"))
        else:  # as the runs held it: each side's commit's version, changed by its diff section (above)
            for commit in dict.fromkeys(c for c in (b_commit, c_commit) if isinstance(c, str) and c):
                held = commit_file(workspace, commit, path)
                if held is not None:
                    calls += checkpoint_calls(held.decode("utf-8", "replace"))
        if calls:
            found.append(f"{path} (calls {', '.join(dict.fromkeys(calls))})")
    return found
