"""Do the lines a code change changed save or load checkpoints? Read from the changed lines, never from
the change's name nor from lines it left alone.

The files a change touched are those whose code differs between the compared windows' recorded code
states (`perfgate.benchmarking.workload.provenance.code_differences`: the sections of each side's diff against its
commit) and the workspace files the commands name whose digests differ. Its changed lines are read from
each side's section of its ``code.diff`` artifact (hash-checked; the lines both sides' diffs changed alike
are no difference between them) and, when the sides ran different commits, from the files changed between
the two, read at each commit from the workspace's git repository (`perfgate.execution.changes
.commit_changes`). A changed line touches checkpointing when it (comments left out) calls a checkpoint saver
or loader: ``torch.save``/``torch.load``, ``torch.distributed.checkpoint`` (``dcp.save``/``dcp.load``),
safetensors ``save_file``/``load_file``, or a ``save_checkpoint``/``load_checkpoint`` of the project's own.
A saving line the change left as it was is not counted: whether the state it saves changed is observed
(`perfgate.decisions.saved_state`).

What cannot be read is listed apart: a file the commands name whose only record is its digest (no diff of it:
not tracked by git) and which calls a saver or loader, a file edited since the candidate ran, a commit the
repository no longer holds, a side run outside git. The ``checkpoint_resume`` gate counts these only where
the saved state was not observed on both sides (`perfgate.decisions.resume_gate`).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import Counter
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


def _diff_calls(old: bytes | None, new: bytes | None) -> list[str]:
    """The checkpoint calls of the lines that differ between two versions of a file (either may be absent)."""
    lines = difflib.unified_diff(
        (old or b"").decode("utf-8", "replace").splitlines(),
        (new or b"").decode("utf-8", "replace").splitlines(),
        lineterm="",
        n=0,
    )
    return checkpoint_calls("\n".join(lines), diff=True)


def _committed_calls(workspace: Path, old: Any, new: Any) -> tuple[list[str], list[str], set[str]]:
    """What the lines changed between the sides' commits call (``'<path> (changed between commits ...; its
    changed lines call torch.save)'``), why they could not be read (then they may touch checkpointing), and
    the files listed as changed."""
    from perfgate.execution.changes import commit_changes

    if not (isinstance(old, str) and old and isinstance(new, str) and new):
        return (
            [],
            ["the code between the sides' commits (one side ran outside git: it cannot be read)"],
            set(),
        )
    span = f"commits {old[:12]} and {new[:12]}"
    files, problem = commit_changes(workspace, old, new)
    if problem is not None:
        return [], [f"the code changed between {span} ({problem}: it cannot be read)"], set()
    found: list[str] = []
    for path, (before, after) in files.items():
        calls = _diff_calls(before, after)
        if calls:
            found.append(f"{path} (changed between {span}; its changed lines call {', '.join(calls)})")
    return found, [], set(files)


def _marked_lines(section: bytes) -> Counter[str]:
    """The added and removed lines of a diff section, with their markers."""
    text = section.decode("utf-8", "replace")
    return Counter(
        line for line in text.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def touched_checkpointing(
    comparison: EvidenceRecord, lookup: Lookup, workspace: Path
) -> tuple[list[str], list[str]]:
    """``'<path> (its changed lines call torch.save)'`` for each file whose lines changed between the sides
    save or load checkpoints; and the files whose changed lines cannot be read though the file calls a
    saver or loader (or why the change cannot be read at all). Both empty when the change touched none, or
    no side recorded its code. An unchanged saving line of a changed file is never counted."""
    from perfgate.benchmarking.workload.provenance import code_differences

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
        return [], []
    b_prov, c_prov = _provenance(base), _provenance(cand)
    b_code, c_code = as_dict(b_prov.get("code")), as_dict(c_prov.get("code"))
    changed = [p for p in code_differences(b_code, c_code) if p != "commit"]
    found: list[str] = []
    unread: list[str] = []
    b_commit, c_commit = b_code.get("commit"), c_code.get("commit")
    committed: set[str] = set()
    if b_commit != c_commit:
        touched, why, committed = _committed_calls(workspace, b_commit, c_commit)
        found += touched
        unread += why
    b_files, c_files = as_dict(b_prov.get("files")), as_dict(c_prov.get("files"))
    named = sorted(p for p in set(b_files) & set(c_files) if b_files[p] != c_files[p])
    b_sections, c_sections = _sections(workspace, base), _sections(workspace, cand)
    for path in dict.fromkeys([*changed, *named]):
        if (
            path in b_sections or path in c_sections
        ):  # the lines each side's diff changed, less those both did
            b_lines = _marked_lines(b_sections.get(path, b""))
            c_lines = _marked_lines(c_sections.get(path, b""))
            calls = checkpoint_calls(
                "\n".join([*(b_lines - c_lines).elements(), *(c_lines - b_lines).elements()]), diff=True
            )
            if calls:
                found.append(f"{path} (its changed lines call {', '.join(calls)})")
            continue
        if path in committed or (b_commit != c_commit and unread):
            continue  # read between the commits above, or the change cannot be read at all
        if path not in c_files:
            unread.append(f"{path} (its diff cannot be read)")
            continue
        # named by the commands, with no diff of it: only its digests say it changed
        now = _text(workspace, path)
        if now is None or hashlib.sha256(now).hexdigest() != c_files[path]:
            unread.append(f"{path} (changed since the candidate ran: what it held then cannot be read)")
            continue
        calls = checkpoint_calls(now.decode("utf-8", "replace"))
        if calls:
            unread.append(
                f"{path} (calls {', '.join(calls)}; which of its lines changed cannot be read: no diff of it "
                "was recorded, e.g. it is not tracked by git)"
            )
    return found, unread


def saving_files(record: EvidenceRecord, workspace: Path) -> list[str]:
    """``'<path> (calls torch.save)'`` for each file the window's command names that calls a checkpoint
    saver or loader, read where the workspace still holds the version the window ran (its digest)."""
    out: list[str] = []
    for path, digest in as_dict(_provenance(record).get("files")).items():
        text = _text(workspace, str(path))
        if text is None or hashlib.sha256(text).hexdigest() != digest:
            continue
        if calls := checkpoint_calls(text.decode("utf-8", "replace")):
            out.append(f"{path} (calls {', '.join(calls)})")
    return out
