"""Read a git work tree's code state without running git: nothing the repository configures can run.

`git status` and `git diff` run programs the repository names (clean filters and text conversion from
``.git/config`` plus attributes, external diff drivers, ``core.fsmonitor``, hooks, pagers, helpers), as
whoever reads the repository: the agent writes ``.git/``, the server reads it. Here dulwich's readers
parse the refs, the index and the object store (pure reading; no configured command is consulted), and
every working file is hashed here, byte for byte:

- HEAD's tree is read object by object, each object's id checked against its content, so a rewritten
  object file cannot stand in for the commit;
- the index contributes only its paths (files staged but not committed are tracked); its stored hashes
  and stat data are not trusted, since the agent can rewrite it;
- a tracked file is changed when its bytes (or its link target, or its executable bit where
  ``core.fileMode`` is on) differ from HEAD's blob. No filter runs, so a file git would normalise
  (line endings, a clean filter) counts as changed; a Git LFS pointer is checked by the sha256 and size it
  names, which is what the LFS clean filter would compute;
- the diff (``code.diff``) is written here in git's layout, with full blob ids on each ``index`` line so
  the digest binds every changed file's content even where no text diff is shown.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "MAX_DIFF_FILE_BYTES",
    "MAX_HASHED_BYTES",
    "MAX_SUBMODULE_DEPTH",
    "MAX_TRACKED_FILES",
    "MAX_UNTRACKED_LISTED",
    "STATE_DIR_NAME",
    "WorkTree",
    "added_file_section",
    "read_work_tree",
]

MAX_TRACKED_FILES = 200_000
"""Paths in HEAD plus the index beyond which the work tree is not read (noted: the state is incomplete)."""
MAX_HASHED_BYTES = 8 * 1024**3
"""Bytes of tracked files hashed per read; past it the rest are not compared (noted: incomplete)."""
MAX_DIFF_FILE_BYTES = 1024 * 1024
"""A changed file larger than this (either side) is shown by its blob ids alone, not as a text diff."""
MAX_UNTRACKED_LISTED = 20_000
"""Untracked, not ignored files listed per read; the count stops there (noted)."""
MAX_SUBMODULE_DEPTH = 4
"""Submodules nested deeper than this are compared by their HEAD commit alone."""
STATE_DIR_NAME = ".perfgate"
"""perfgate's own state folder: never the user's code, tracked or not."""

_LFS_POINTER = re.compile(
    rb"\Aversion https://git-lfs\.github\.com/spec/v1\noid sha256:([0-9a-f]{64})\nsize (\d+)\n"
)
_GITLINK = 0o160000
_SYMLINK = 0o120000


class _Unreadable(Exception):
    """The repository's data cannot be read as git data (a corrupt or forged object, a bad path)."""


@dataclass
class WorkTree:
    """What the work tree holds against HEAD. Paths are posix, relative to ``root``."""

    root: Path
    commit: str | None
    branch: str | None
    tracked: set[str] = field(default_factory=lambda: set[str]())
    changed: list[str] = field(default_factory=lambda: list[str]())
    untracked: list[str] = field(default_factory=lambda: list[str]())
    diff: bytes = b""
    notes: list[str] = field(default_factory=lambda: list[str]())
    complete: bool = True


def read_work_tree(
    start: Path, *, max_diff_bytes: int = 64 * 1024 * 1024
) -> tuple[WorkTree | None, str | None]:
    """The repository holding ``start`` read without git: (work tree, None) or (None, why not).

    Fails (returns a reason) when no repository holds ``start`` or its data is not readable git data.
    """
    from dulwich.errors import FileFormatException, NotGitRepository
    from dulwich.repo import Repo

    try:
        repo = Repo.discover(str(start))
    except (NotGitRepository, OSError, ValueError) as exc:
        if isinstance(exc, NotGitRepository):
            return None, f"the workspace {start} is not inside a git repository"
        return None, f"the repository holding {start} could not be opened: {exc}"
    try:
        return _Reader(repo, max_diff_bytes, depth=0).read(), None
    except (_Unreadable, OSError, ValueError, KeyError, FileFormatException) as exc:
        return None, f"the repository's data could not be read as git data ({type(exc).__name__}: {exc})"
    finally:
        repo.close()


class _Reader:
    def __init__(self, repo: Any, max_diff_bytes: int, depth: int) -> None:
        self.repo = repo
        self.root = Path(repo.path)
        self.max_diff_bytes = max_diff_bytes
        self.depth = depth
        self.hashed = 0
        self._link_dirs: dict[str, bool] = {}
        config = repo.get_config()
        self.file_mode = config.get_boolean((b"core",), b"filemode", True)

    def read(self) -> WorkTree:
        names, head = self.repo.refs.follow(b"HEAD")
        branch = (
            names[-1].decode("utf-8", "replace") if names and names[-1].startswith(b"refs/heads/") else None
        )
        out = WorkTree(
            self.root, head.decode("ascii") if head else None, branch and branch[len("refs/heads/") :]
        )
        if head is None:
            out.notes.append("the repository has no commit yet (unborn HEAD)")
        committed: dict[str, tuple[int, str]] = {}
        if head is not None:
            tree = self._commit_tree(head.decode("ascii"))
            self._flatten(tree, "", committed)
        skipped: set[str] = set()
        staged: set[str] = set()
        try:
            index = self.repo.open_index()
        except FileNotFoundError:
            index = None
        if index is not None:
            for raw, entry in index.items():
                path = _checked_path(raw)
                staged.add(path)
                if getattr(entry, "skip_worktree", False) is True:
                    skipped.add(path)  # a sparse checkout leaves it out of the work tree on purpose
        paths = sorted((set(committed) | staged) - _own_state(set(committed) | staged))
        if len(paths) > MAX_TRACKED_FILES:
            out.complete = False
            out.notes.append(f"more than {MAX_TRACKED_FILES} tracked files: the work tree was not compared")
            return out
        out.tracked = set(paths)
        sections: list[bytes] = []
        size = 0
        for path in paths:
            if not out.complete:
                break
            head_entry = committed.get(path)
            section = self._compare(path, head_entry, path in skipped, out)
            if section is None:
                continue
            out.changed.append(path)
            if size + len(section) > self.max_diff_bytes:
                if size < self.max_diff_bytes:
                    out.notes.append(
                        f"the diff passed {self.max_diff_bytes} bytes: later files are not in it"
                    )
                size = self.max_diff_bytes
                continue
            sections.append(section)
            size += len(section)
        out.diff = b"".join(sections)
        self._list_untracked(out)
        return out

    # HEAD -----------------------------------------------------------------------------------------

    def _object(self, oid: str, kind: bytes) -> bytes:
        """The raw content of object ``oid``, checked to hash to its id (a forged object file fails)."""
        type_num, raw = self.repo.object_store.get_raw(oid.encode("ascii"))
        names = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}
        h = self.repo.object_format.new_hash()
        h.update(names.get(type_num, b"?") + b" " + str(len(raw)).encode() + b"\0")
        h.update(raw)
        if h.hexdigest() != oid or names.get(type_num) != kind:
            raise _Unreadable(f"object {oid} does not hold the {kind.decode()} its id names")
        return raw

    def _commit_tree(self, oid: str) -> str:
        raw = self._object(oid, b"commit")
        match = re.match(rb"tree ([0-9a-f]{40,64})\n", raw)
        if match is None:
            raise _Unreadable(f"commit {oid} names no tree")
        return match.group(1).decode("ascii")

    def _flatten(self, tree: str, prefix: str, out: dict[str, tuple[int, str]]) -> None:
        from dulwich.objects import parse_tree

        raw = self._object(tree, b"tree")
        for name, mode, sha in parse_tree(raw, self.repo.object_format.oid_length):
            path = prefix + _checked_path(name)
            oid = sha.decode("ascii")
            if stat.S_ISDIR(mode):
                self._flatten(oid, path + "/", out)
            else:
                out[path] = (mode, oid)
            if len(out) > MAX_TRACKED_FILES:
                return

    # the work tree --------------------------------------------------------------------------------

    def _compare(self, path: str, head: tuple[int, str] | None, skipped: bool, out: WorkTree) -> bytes | None:
        """The diff section of ``path`` when its working copy differs from HEAD's, else None."""
        full = self.root / path
        if self._under_link(path):
            out.notes.append(f"{path}: a folder above it is a symbolic link (counted as changed)")
            work = None
        else:
            try:
                st = os.lstat(full)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            work = self._work_blob(full, st, head, out) if st is not None else None
            if st is None and (skipped or head is None):
                return None  # sparse, or staged and then removed: nothing against HEAD
        if head is not None and work is not None:
            mode_same = head[0] == work[0] or (
                not self.file_mode and stat.S_ISREG(head[0]) and stat.S_ISREG(work[0])
            )
            if head[1] == work[1] and mode_same:
                return None
            if head[0] == work[0] and self._lfs_match(head[1], full):
                return None
        if not out.complete:
            return None
        return self._section(path, head, work, full)

    def _under_link(self, path: str) -> bool:
        parts = PurePosixPath(path).parts[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder not in self._link_dirs:
                self._link_dirs[folder] = os.path.islink(self.root / folder)
            if self._link_dirs[folder]:
                return True
        return False

    def _work_blob(
        self, full: Path, st: os.stat_result, head: tuple[int, str] | None, out: WorkTree
    ) -> tuple[int, str] | None:
        """(git mode, blob id) of a working file as git would store it (filters not run)."""
        if stat.S_ISLNK(st.st_mode):
            target = os.fsencode(os.readlink(full))
            return _SYMLINK, self._blob_id(iter([target]), len(target))
        if stat.S_ISREG(st.st_mode):
            if self.hashed + st.st_size > MAX_HASHED_BYTES:
                out.complete = False
                out.notes.append(f"tracked files pass {MAX_HASHED_BYTES} bytes: the rest were not compared")
                return None
            self.hashed += st.st_size
            mode = 0o100755 if st.st_mode & stat.S_IXUSR else 0o100644
            with full.open("rb") as f:
                return mode, self._blob_id(iter(lambda: f.read(1 << 20), b""), st.st_size)
        if stat.S_ISDIR(st.st_mode) and head is not None and head[0] == _GITLINK:
            return _GITLINK, self._submodule(full, head[1], out)
        return None  # a folder or a special file where a file was: changed

    def _blob_id(self, chunks: Iterator[bytes], size: int) -> str:
        """The id git gives a blob of ``size`` bytes read as ``chunks`` (a file that grows while read
        hashes to an id no commit holds: changed)."""
        h = self.repo.object_format.new_hash()
        h.update(b"blob %d\0" % size)
        for chunk in chunks:
            h.update(chunk)
        return h.hexdigest()

    def _lfs_match(self, oid: str, full: Path) -> bool:
        """Whether HEAD's blob is a Git LFS pointer to exactly the working file's bytes."""
        try:
            raw = self._object(oid, b"blob")
        except (_Unreadable, KeyError):
            return False
        match = _LFS_POINTER.match(raw) if len(raw) < 1024 else None
        if match is None or not full.is_file() or full.stat().st_size != int(match.group(2)):
            return False
        h = hashlib.sha256()
        with full.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest() == match.group(1).decode("ascii")

    def _submodule(self, folder: Path, recorded: str, out: WorkTree) -> str:
        """The submodule's state as a pseudo-id: its HEAD, with ``-dirty`` when its own files changed."""
        from dulwich.errors import NotGitRepository
        from dulwich.refs import HEADREF
        from dulwich.repo import Repo

        try:
            sub = Repo(str(folder))
        except (NotGitRepository, OSError, ValueError):
            return "0" * len(recorded) if any(folder.iterdir()) else recorded  # not checked out: as git
        try:
            if self.depth >= MAX_SUBMODULE_DEPTH:
                _names, head = sub.refs.follow(HEADREF)
                return head.decode("ascii") if head else "0" * len(recorded)
            inner = _Reader(sub, self.max_diff_bytes, self.depth + 1).read()
            rel = folder.relative_to(self.root).as_posix()
            out.tracked.update(f"{rel}/{p}" for p in inner.tracked)
            out.notes.extend(f"{rel}: {note}" for note in inner.notes)
            out.complete = out.complete and inner.complete
            return (inner.commit or "0" * len(recorded)) + ("-dirty" if inner.changed else "")
        finally:
            sub.close()

    # the diff -------------------------------------------------------------------------------------

    def _section(
        self, path: str, head: tuple[int, str] | None, work: tuple[int, str] | None, full: Path
    ) -> bytes:
        p = path.encode("utf-8", "surrogateescape")
        lines = [b"diff --git a/" + p + b" b/" + p]
        none = "0" * len(head[1] if head else (work[1] if work else "0" * 40))
        if head is None and work is not None:
            lines += [b"new file mode %o" % work[0], f"index {none}..{work[1]}".encode()]
        elif work is None and head is not None:
            lines += [b"deleted file mode %o" % head[0], f"index {head[1]}..{none}".encode()]
        elif head is not None and work is not None:
            if head[0] != work[0]:
                lines += [b"old mode %o" % head[0], b"new mode %o" % work[0]]
            same = b" %o" % work[0] if head[0] == work[0] else b""
            lines.append(f"index {head[1]}..{work[1]}".encode() + same)
        old = self._text(head, None) if head else b""
        new = self._text(work, full) if work else b""
        return _render(p, lines, old, new)

    def _text(self, side: tuple[int, str], full: Path | None) -> bytes | None:
        """The side's bytes for a text diff; None when binary, too large, a submodule or unreadable."""
        mode, oid = side
        if mode == _GITLINK:
            return f"Subproject commit {oid}\n".encode()
        try:
            if full is None:
                data = self._object(oid, b"blob")
            elif mode == _SYMLINK:
                data = os.fsencode(os.readlink(full))
            else:
                if full.stat().st_size > MAX_DIFF_FILE_BYTES:
                    return None
                data = full.read_bytes()
        except (_Unreadable, KeyError, OSError):
            return None
        if len(data) > MAX_DIFF_FILE_BYTES or b"\0" in data[:8000]:
            return None
        return data

    # untracked files ------------------------------------------------------------------------------

    def _list_untracked(self, out: WorkTree) -> None:
        """Files neither tracked nor ignored (a nested repository counts once, as ``folder/``)."""
        from dulwich.ignore import IgnoreFilterManager

        ignore = IgnoreFilterManager.from_repo(self.repo)
        tracked_dirs = {str(parent) for path in out.tracked for parent in PurePosixPath(path).parents}
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            rel_dir = here.relative_to(self.root).as_posix()
            prefix = "" if rel_dir == "." else rel_dir + "/"
            keep: list[str] = []
            for name in sorted(dirnames):
                rel = prefix + name
                if name in (".git", STATE_DIR_NAME) or ignore.is_ignored(rel + "/"):
                    continue
                if rel in out.tracked:
                    continue  # a submodule: compared as tracked
                if (here / name / ".git").exists() and rel not in tracked_dirs:
                    self._add_untracked(out, rel + "/")
                    continue
                keep.append(name)
            dirnames[:] = keep
            for name in sorted(filenames):
                rel = prefix + name
                if rel not in out.tracked and not ignore.is_ignored(rel):
                    self._add_untracked(out, rel)
            if len(out.untracked) >= MAX_UNTRACKED_LISTED:
                return

    @staticmethod
    def _add_untracked(out: WorkTree, rel: str) -> None:
        if len(out.untracked) == MAX_UNTRACKED_LISTED - 1:
            out.notes.append(f"more than {MAX_UNTRACKED_LISTED} untracked files: the count stops there")
        if len(out.untracked) < MAX_UNTRACKED_LISTED:
            out.untracked.append(rel)


def added_file_section(path: str, full: Path) -> bytes:
    """A diff section showing ``full`` (at repository path ``path``) as a new file: how a file that can run
    and no commit holds appears in the recorded diff (its sha1 blob id names its content)."""
    p = path.encode("utf-8", "surrogateescape")
    try:
        st = full.stat()
        data = full.read_bytes() if st.st_size <= MAX_DIFF_FILE_BYTES else None
        if data is None:
            h = hashlib.sha1(b"blob %d\0" % st.st_size, usedforsecurity=False)
            with full.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            oid = h.hexdigest()
        else:
            oid = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    except OSError as exc:
        return b"diff --git a/" + p + b" b/" + p + f"\nunreadable: {exc.strerror or exc}\n".encode()
    mode = 0o100755 if st.st_mode & stat.S_IXUSR else 0o100644
    lines = [
        b"diff --git a/" + p + b" b/" + p,
        b"new file mode %o" % mode,
        f"index {'0' * 40}..{oid}".encode(),
    ]
    text = data if data is not None and b"\0" not in data[:8000] else None
    return _render(p, lines, b"", text)


def _render(p: bytes, lines: list[bytes], old: bytes | None, new: bytes | None) -> bytes:
    """A section's header ``lines`` and its text diff (or git's line for files shown by id alone)."""
    if old is None or new is None:
        lines.append(b"Binary files a/" + p + b" and b/" + p + b" differ")
        return b"\n".join(lines) + b"\n"
    deleted = lines[1].startswith(b"deleted") if len(lines) > 1 else False
    added = lines[1].startswith(b"new file") if len(lines) > 1 else False
    body = difflib.diff_bytes(
        difflib.unified_diff,
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        b"/dev/null" if added else b"a/" + p,
        b"/dev/null" if deleted else b"b/" + p,
        lineterm=b"\n",
    )
    text = b"\n".join(lines) + b"\n"
    for line in body:
        text += line if line.endswith(b"\n") else line + b"\n\\ No newline at end of file\n"
    return text


def _checked_path(raw: bytes) -> str:
    """A repository path as posix text; a path that leaves the tree (``..``, absolute, ``.git``) is forged."""
    text = raw.decode("utf-8", "surrogateescape")
    parts = text.split("/")
    if not text or text.startswith("/") or any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
        raise _Unreadable(f"the repository names a path outside its tree: {text!r}")
    return text


def _own_state(paths: set[str]) -> set[str]:
    """Tracked paths in perfgate's state folder (anywhere): perfgate's records, never the user's code."""
    return {p for p in paths if STATE_DIR_NAME in PurePosixPath(p).parts[:-1]}
