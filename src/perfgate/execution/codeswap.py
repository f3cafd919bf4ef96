"""One command at two code states: the files a git ref and the working tree disagree on, swapped in place.

The commonest A/B is "the agent edited the code": the baseline is a commit (``HEAD`` by default), the
candidate the working tree. A paired run measures both without checking anything out: `plan_swap` lists
the files that differ (read with the hardened git reads of `perfgate.execution.changes`: ``ls-tree``,
``ls-files``, ``diff-index --cached`` and ``cat-file``, which run no filter, hook or fsmonitor; the working
tree's bytes are hashed here, never by git), and `CodeSwap` writes the ref's bytes over them before each
baseline launch and the candidate's back after it. Nothing else in the workspace changes.

The candidate's files (bytes and mode) are copied to the server's state folder with a journal *before*
the first swap; the swap back runs in a ``finally``, and a journal a crash left behind is restored by
`recover` on the next server start or the next paired call, which says so. A swap refuses what it cannot
do exactly: a path that is a link or not a regular file on either side (never followed), a file under
``.perfgate`` or outside the workspace, a tree with unmerged files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from perfgate.execution.changes import git_output
from perfgate.execution.request import CodeRef
from perfgate.helpers.statefs import make_dirs, remove_tree, write_file

__all__ = ["SWAP_DIR", "CodeSwap", "SwapRefusedError", "plan_swap", "recover", "recovered", "restore"]

SWAP_DIR = "codeswap"
"""The server's folder (under its per-workspace state) holding a swap's saved files and journal."""
JOURNAL = "journal.json"
RECOVERED = "codeswap-recovered.txt"
"""The line a recovery leaves for the next paired call's answer."""
MAX_SWAPPED = 256
"""Files a swap writes at most: more is a different tree, not an edit (compare two checkouts instead)."""


class SwapRefusedError(Exception):
    """The working tree cannot be swapped to the ref exactly; the message says why and what to do."""


def _git(workspace: Path, args: list[str], max_bytes: int = 16 << 20) -> bytes | None:
    return git_output(workspace, args, max_bytes)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _split(raw: bytes) -> list[str]:
    return [p for p in raw.decode("utf-8", "surrogateescape").split("\0") if p]


def plan_swap(workspace: Path, ref: str) -> CodeRef:
    """The files ``ref`` and the working tree of ``workspace`` disagree on (content or executable bit).

    Raises:
        SwapRefusedError: not a git repository, ``ref`` does not name a commit, unmerged files, a
            difference under ``.perfgate`` or outside the workspace, a link or non-regular file in the way.
    """
    if _git(workspace, ["rev-parse", "--git-dir"]) is None:
        raise SwapRefusedError(
            "the workspace is not a git repository (or git is missing): commit the baseline code, or give "
            "the candidate as another command (candidate.command/env) instead of baseline_ref"
        )
    resolved = (
        None if ref.startswith("-") else _git(workspace, ["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"])
    )
    if not resolved:
        raise SwapRefusedError(
            f"baseline_ref {ref!r} does not name a commit of the workspace's repository: give HEAD, a branch "
            "or a commit id that `git log` lists"
        )
    commit = resolved.decode().strip()
    if unmerged := _split(_git(workspace, ["ls-files", "-u", "-z"]) or b""):
        raise SwapRefusedError(
            f"the working tree has unmerged files ({len(unmerged)} entries): finish or abort the merge first"
        )
    prefix = (_git(workspace, ["rev-parse", "--show-prefix"]) or b"").decode().strip()
    staged = _split(
        _git(workspace, ["diff-index", "--cached", "-z", "--name-only", "--no-renames", commit]) or b""
    )
    if outside := [p for p in staged if not p.startswith(prefix)]:
        raise SwapRefusedError(
            f"the change against {ref} touches files outside the workspace ({', '.join(outside[:5])}): run "
            "the server on the repository's root, or commit those files"
        )
    at_ref: dict[str, tuple[str, str]] = {}
    for entry in _split(_git(workspace, ["ls-tree", "-r", "-z", commit]) or b""):
        meta, _, rel = entry.partition("\t")
        mode, _kind, oid = meta.split()
        at_ref[rel] = (oid, mode)
    here = set(_split(_git(workspace, ["ls-files", "-z"]) or b""))
    here |= set(_split(_git(workspace, ["ls-files", "-z", "--others", "--exclude-standard"]) or b""))
    files: dict[str, str] = {}
    for rel in sorted(here | set(at_ref)):
        oid, mode = at_ref.get(rel, ("", ""))
        current = _current(workspace / rel)
        if current == ((oid, mode) if oid else None):
            continue
        _check_swappable(workspace, rel, mode)
        files[rel] = f"{oid} {mode}" if oid else ""
    if len(files) > MAX_SWAPPED:
        raise SwapRefusedError(
            f"{len(files)} files differ from {ref}, more than the {MAX_SWAPPED} a swap writes: compare two "
            "checkouts with two commands instead"
        )
    return CodeRef(ref=ref, commit=commit, files=files)


def _current(path: Path) -> tuple[str, str] | None:
    """(blob id, git mode) of a regular file; None where nothing is; ('', 'other') for anything else."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return ("", "other")
    return (_blob_id(path.read_bytes()), "100755" if st.st_mode & 0o111 else "100644")


def _check_swappable(workspace: Path, rel: str, mode: str) -> None:
    parts = PurePosixPath(rel).parts
    if ".perfgate" in parts or ".." in parts:
        raise SwapRefusedError(
            f"{rel} differs from the ref and lies under .perfgate: perfgate's own files never swap; commit or "
            "restore it first"
        )
    if mode and not mode.startswith("100"):
        raise SwapRefusedError(
            f"{rel} is a link or a submodule at the ref: a swap writes regular files only; measure with two "
            "commands (candidate.command) instead"
        )
    path = workspace / rel
    for folder in [path, *path.parents]:
        if folder == workspace:
            break
        if folder.is_symlink() or (folder != path and folder.exists() and not folder.is_dir()):
            raise SwapRefusedError(
                f"{rel}: {folder.relative_to(workspace)} is a link or not a folder in the working tree; a swap "
                "follows no link: replace it with the file itself, or measure with two commands"
            )
    if path.exists() and not path.is_file():
        raise SwapRefusedError(
            f"{rel} is not a regular file in the working tree; a swap writes regular files only"
        )


@dataclass
class CodeSwap:
    """Moves ``workspace`` between the candidate (its working tree) and ``code``'s baseline, journaled in
    ``folder`` (the server's state, never the workspace). Use as a context manager: entering saves the
    candidate, leaving restores it and drops the journal."""

    workspace: Path
    code: CodeRef
    folder: Path
    side: str = "candidate"

    def __enter__(self) -> CodeSwap:
        if (self.folder / JOURNAL).exists():
            raise SwapRefusedError("a paired run's journal is already open for this workspace")
        remove_tree(self.folder)
        make_dirs(self.folder / "files")
        saved: dict[str, int | None] = {}
        for index, rel in enumerate(sorted(self.code.files)):
            path = self.workspace / rel
            if path.is_file() and not path.is_symlink():
                write_file(self.folder / "files" / str(index), path.read_bytes(), mode=0o600)
                saved[rel] = path.lstat().st_mode & 0o777
            else:
                saved[rel] = None
        journal = {
            "workspace": str(self.workspace),
            "files": {r: [i, m] for i, (r, m) in enumerate(saved.items())},
        }
        write_file(self.folder / JOURNAL, json.dumps(journal).encode(), mode=0o600)
        return self

    def __exit__(self, *exc: object) -> None:
        self.to_candidate()
        remove_tree(self.folder)

    def to_ref(self) -> None:
        """Write the ref's bytes over each differing file (remove those the ref lacks)."""
        for rel, entry in self.code.files.items():
            if not entry:
                remove_tree(self.workspace / rel)
                continue
            oid, mode = entry.split()
            data = _git(self.workspace, ["cat-file", "blob", oid], 256 << 20)
            if data is None:
                raise SwapRefusedError(f"git could not read {rel} at {self.code.ref} (blob {oid[:12]})")
            _write(self.workspace / rel, data, 0o755 if mode == "100755" else 0o644)
        self.side = "baseline"

    def to_candidate(self) -> None:
        """Put the candidate's saved bytes and modes back (remove what the candidate lacked)."""
        restore(self.workspace, self.folder)
        self.side = "candidate"

    @contextlib.contextmanager
    def baseline(self) -> Generator[None]:
        """The ref's code for the duration, the candidate's after it whatever happens."""
        try:
            self.to_ref()
            yield
        finally:
            self.to_candidate()


def _write(path: Path, data: bytes, mode: int) -> None:
    write_file(path, data, mode=mode)
    os.chmod(path, mode)  # write_file's mode passes through the umask


def restore(workspace: Path, folder: Path) -> list[str]:
    """Put back the files a journal in ``folder`` saved; the paths restored."""
    journal = json.loads((folder / JOURNAL).read_text())
    files: dict[str, list[int | None]] = journal["files"]
    for rel, (index, mode) in files.items():
        if mode is None:
            remove_tree(workspace / rel)
        else:
            _write(workspace / rel, (folder / "files" / str(index)).read_bytes(), mode)
    return sorted(files)


def recover(workspace: Path, private: Path) -> None:
    """Restore the candidate a crashed paired run left swapped (a journal in ``private``/codeswap, the
    server's folder for ``workspace``), leaving a line for the next paired call's answer (`recovered`).
    Run on server start and before each paired call."""
    note = _restore_left(workspace, private / SWAP_DIR)
    if note is not None:
        write_file(private / RECOVERED, note.encode(), mode=0o600)


def recovered(private: Path) -> list[str]:
    """The line a recovery left for this answer, once (the file is removed)."""
    path = private / RECOVERED
    try:
        note = path.read_text()
    except FileNotFoundError:
        return []
    path.unlink()
    return [note]


def _restore_left(workspace: Path, state: Path) -> str | None:
    if not (state / JOURNAL).exists():
        return None
    restored = restore(workspace, state)
    remove_tree(state)
    shown = ", ".join(restored[:8]) + (f" and {len(restored) - 8} more" if len(restored) > 8 else "")
    return (
        f"restored the working tree a paired run left at its baseline (it stopped before swapping back): "
        f"{len(restored)} file(s), {shown}"
    )
