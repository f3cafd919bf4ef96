"""Which untracked files are code: what a command can import, not the agent's scratch.

In a git workspace the code state is the commit, the diff of tracked files, and the untracked (not
ignored) files with a code suffix that a run can import:

- those in a folder that also holds tracked files (a new module next to the code imports by name);
- those in an untracked folder inside a tracked one (``src/pkg/new/``: a subpackage of the code);
- those in an untracked top-level folder that is a Python package (an ``__init__.py`` beside the file
  or in a folder above it);
- those in any other untracked top-level folder whose name code that counts imports (``import scratch``
  or ``from scratch.x import y`` in the diff's added lines or in a counted untracked file).

Everything else untracked (notes, copies and outputs under a folder no code imports) does not change
the code state: writing there needs no new approval. Files a command names are bound by their own digest
whatever folder they are in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

__all__ = [
    "IMPORTABLE_SUFFIXES",
    "MAX_IMPORTABLE_FILES",
    "importable_files",
    "imported_names",
    "untracked_code",
]

_IMPORT = re.compile(
    r"^\s*(?:from\s+([A-Za-z_]\w*)|import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*))", re.M
)


def imported_names(source: str) -> set[str]:
    """Top-level names of the modules ``source`` imports (``import a.b, c`` gives a and c)."""
    names: set[str] = set()
    for match in _IMPORT.finditer(source):
        if match.group(1):
            names.add(match.group(1))
        else:
            names.update(part.split()[0].split(".")[0] for part in match.group(2).split(","))
    return names


def untracked_code(
    untracked: Iterable[str], tracked_dirs: set[str], diff: bytes, read: Callable[[str], str]
) -> list[str]:
    """The untracked code files (workspace-relative posix paths) that count as code (module docstring).

    ``tracked_dirs``: folders holding tracked files ("" for the top); ``read``: a file's text by path.
    """
    candidates = sorted(set(untracked))
    counted: set[str] = set()
    waiting: dict[str, list[str]] = {}  # top-level untracked folder -> its files, counted once imported
    present = set(candidates)
    for rel in candidates:
        path = PurePosixPath(rel)
        folder = str(path.parent) if str(path.parent) != "." else ""
        root = _untracked_root(path, tracked_dirs)
        if folder in tracked_dirs or "/" in root or _in_package(path, tracked_dirs, present):
            counted.add(rel)  # next to tracked code, inside the project's tree, or a package
        else:
            waiting.setdefault(root, []).append(rel)
    added = "\n".join(
        line[1:] for line in diff.decode("utf-8", "replace").splitlines() if line.startswith("+")
    )
    sources: list[str] = [added, *(read(rel) for rel in sorted(counted))]
    while sources and waiting:
        names = {name for source in sources for name in imported_names(source)}
        reached = [root for root in waiting if PurePosixPath(root).name in names]
        sources = []
        for root in reached:
            for rel in waiting.pop(root):
                counted.add(rel)
                sources.append(read(rel))
    return sorted(counted)


def _untracked_root(path: PurePosixPath, tracked_dirs: set[str]) -> str:
    """The outermost folder of ``path`` that holds no tracked file (its import name)."""
    parts = path.parent.parts
    for i in range(len(parts)):
        if "/".join(parts[: i + 1]) not in tracked_dirs:
            return "/".join(parts[: i + 1])
    return str(path.parent)


def _in_package(path: PurePosixPath, tracked_dirs: set[str], present: set[str]) -> bool:
    """An ``__init__.py`` in the file's folder or any folder above it that holds no tracked file."""
    folder = path.parent
    while str(folder) not in (".", "") and str(folder) not in tracked_dirs:
        if f"{folder}/__init__.py" in present:
            return True
        folder = folder.parent
    return False


IMPORTABLE_SUFFIXES = frozenset({".py", ".pyc", ".pyo", ".pth", ".so", ".pyd", ".pyx", ".pxd"})
"""Files Python can import or run at start-up: sources, bytecode (sourceless ``.pyc`` included), ``.pth``
files and extension modules (``x.cpython-311-x86_64-linux-gnu.so`` ends in ``.so``)."""
MAX_IMPORTABLE_FILES = 5000
"""`importable_files` stops listing after this many files and says so in its notes."""
MAX_IMPORTABLE_DEPTH = 24
"""Folders deeper than this below the workspace are not walked (noted)."""
_NOT_USER_CODE = frozenset({".git", ".perfgate", "__pycache__", "node_modules"})


def importable_files(
    root: Path, suffixes: frozenset[str] = IMPORTABLE_SUFFIXES, max_files: int = MAX_IMPORTABLE_FILES
) -> tuple[list[str], list[str]]:
    """Every file under ``root`` with one of ``suffixes``, tracked by git or not, ignored or not.

    Returns (root-relative posix paths, sorted; notes on what was left out). Not walked: ``.git``,
    perfgate's ``.perfgate``, ``__pycache__`` (perfgate moves the bytecode cache out of the workspace),
    ``node_modules``, hidden folders and virtual environments (a folder holding ``pyvenv.cfg``): installed
    packages, not the user's code. Folder links are not followed; a file link is listed (its target runs).
    """
    found: list[str] = []
    notes: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root)
        if len(rel_dir.parts) >= MAX_IMPORTABLE_DEPTH:
            if dirnames:
                notes.append(
                    f"folders below {rel_dir.as_posix()} are deeper than {MAX_IMPORTABLE_DEPTH}: not read"
                )
            dirnames[:] = []
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in _NOT_USER_CODE and not d.startswith(".") and not (here / d / "pyvenv.cfg").is_file()
        )
        for name in sorted(filenames):
            if PurePosixPath(name).suffix not in suffixes:
                continue
            if len(found) >= max_files:
                notes.append(f"more than {max_files} importable files: the rest are not listed")
                return sorted(found), notes
            found.append((rel_dir / name).as_posix())
    return sorted(found), notes
