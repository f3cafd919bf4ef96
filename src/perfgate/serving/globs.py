"""Glob patterns expanded inside the workspace only, with a bound on what they may look at.

``glob.glob("/**/*")`` walks the whole file system before anything checks where its matches lie: minutes
of work and gigabytes of names, and every name it returns is a fact about files outside the workspace
(a refusal that names one is an existence oracle). Here a pattern is confined *before* it is expanded: a
relative pattern is walked from the workspace, an absolute one only when its fixed prefix is the
workspace or a read root, and ``..`` is refused outright. The walk itself never enters a linked folder
through a wildcard (a link is followed only where the pattern names it literally and it resolves inside
a root), and it stops with a refusal once it has looked at `MAX_ENTRIES` names or run `DEADLINE_S`.
Like `glob`, a wildcard does not match a name starting with a dot unless the pattern's part does.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePath

__all__ = ["DEADLINE_S", "MAX_ENTRIES", "GlobRefused", "expand", "has_magic", "shown"]

MAX_ENTRIES = 200_000
"""Most directory entries one pattern may look at."""
DEADLINE_S = 10.0
"""Longest one pattern may walk."""

_MAGIC = frozenset("*?[")


class GlobRefused(ValueError):
    """The pattern leaves the roots, or its walk is over a bound; the message says what to do."""


def has_magic(pattern: str) -> bool:
    return any(c in _MAGIC for c in pattern)


def shown(pattern: str, limit: int = 120) -> str:
    """The pattern as a refusal quotes it: a bounded prefix."""
    return repr(pattern if len(pattern) <= limit else pattern[: limit - 3] + "...")


def _anchor(pattern: str, workspace: Path, roots: Sequence[Path]) -> tuple[Path, tuple[str, ...]]:
    """The root the pattern is walked from and its parts below it."""
    path = PurePath(pattern)
    if ".." in path.parts:
        raise GlobRefused(
            f"the pattern {shown(pattern)} contains '..'; patterns stay inside the workspace\n"
            "next: write it relative to the workspace, without '..'"
        )
    if not path.is_absolute():
        return workspace, tuple(p for p in path.parts if p != ".")
    for root in roots:
        if path.parts[: len(root.parts)] == root.parts:
            return root, path.parts[len(root.parts) :]
    raise GlobRefused(
        f"the pattern {shown(pattern)} starts outside the workspace; it is not expanded there\n"
        "next: write it relative to the workspace (or ask the operator for a --read-root)"
    )


class _Walk:
    def __init__(self, pattern: str, roots: Sequence[Path]) -> None:
        self.pattern = pattern
        self.roots = roots
        self.looked = 0
        self.deadline = time.monotonic() + DEADLINE_S

    def _count(self) -> None:
        self.looked += 1
        if self.looked > MAX_ENTRIES or (self.looked % 512 == 0 and time.monotonic() > self.deadline):
            raise GlobRefused(
                f"the pattern {shown(self.pattern)} looks at more than {MAX_ENTRIES} names or runs past "
                f"{DEADLINE_S:g} s before matching all it could\nnext: narrow it (a folder instead of '**', "
                "a file name instead of '*')"
            )

    def _entries(self, folder: Path) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(folder) as it:
                out: list[os.DirEntry[str]] = []
                for entry in it:
                    self._count()
                    out.append(entry)
                return out
        except OSError:  # gone, not a folder, or not readable: nothing matches there
            return []

    def _inside(self, path: Path) -> bool:
        resolved = path.resolve()
        return any(resolved == root or root in resolved.parents for root in self.roots)

    def _below(self, folder: Path) -> Iterator[tuple[Path, list[os.DirEntry[str]]]]:
        """``folder`` and every folder below it (what ``**`` matches) with its entries, entering no link
        and no hidden folder (iteratively: a deep tree is no deep recursion)."""
        stack = [folder]
        while stack:
            current = stack.pop()
            entries = self._entries(current)
            yield current, entries
            stack.extend(
                Path(e.path)
                for e in entries
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
            )

    def matches(self, folder: Path, parts: tuple[str, ...]) -> Iterator[Path]:
        if not parts:
            yield folder
            return
        part, rest = parts[0], parts[1:]
        if part == "**":
            for sub, entries in self._below(folder):
                if rest:
                    yield from self.matches(sub, rest)
                else:  # a last '**' matches the folders and the files below
                    yield sub
                    yield from (Path(e.path) for e in entries if not e.name.startswith("."))
        elif has_magic(part):
            hidden_ok = part.startswith(".")
            for entry in self._entries(folder):
                if (hidden_ok or not entry.name.startswith(".")) and fnmatch.fnmatchcase(entry.name, part):
                    if not rest:
                        yield Path(entry.path)
                    elif entry.is_dir(follow_symlinks=False):
                        yield from self.matches(Path(entry.path), rest)
        else:
            self._count()
            path = folder / part
            if not rest:
                if os.path.lexists(path):
                    yield path
            elif path.is_dir() and (not path.is_symlink() or self._inside(path)):
                yield from self.matches(path, rest)


def expand(pattern: str, workspace: Path, roots: Sequence[Path], *, limit: int) -> list[Path]:
    """The paths matching ``pattern`` (relative to ``workspace``, or absolute under one of ``roots``),
    sorted, unresolved: confine each as any path (`ToolRuntime.resolve_path`) before reading it.

    Raises:
        GlobRefused: the pattern leaves the roots, looks at too many names, runs too long, or matches more
            than ``limit`` paths.
    """
    base, parts = _anchor(pattern, workspace, roots)
    walk = _Walk(pattern, roots)
    found: list[Path] = []
    for path in walk.matches(base, parts):
        found.append(path)
        if len(found) > limit:
            raise GlobRefused(f"more than {limit} files match {shown(pattern)}\nnext: narrow the paths")
    return sorted(set(found))
