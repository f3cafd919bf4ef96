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
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

__all__ = [
    "IMPORTABLE_SUFFIXES",
    "MAX_IMPORTABLE_FILES",
    "import_roots",
    "importable_files",
    "imported_names",
    "is_virtualenv",
    "resolve_program",
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
    ``__pycache__`` is safe to leave out: runs get ``PYTHONPYCACHEPREFIX`` in the trust root, so Python
    never reads bytecode there, and it never loads a sourceless file from it.
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
            if d not in _NOT_USER_CODE and not d.startswith(".") and not is_virtualenv(here / d)
        )
        for name in sorted(filenames):
            if PurePosixPath(name).suffix not in suffixes:
                continue
            if len(found) >= max_files:
                notes.append(f"more than {max_files} importable files: the rest are not listed")
                return sorted(found), notes
            found.append((rel_dir / name).as_posix())
    return sorted(found), notes


def is_virtualenv(folder: Path) -> bool:
    """A virtual environment (``pyvenv.cfg``) with nothing importable at its top: a ``pyvenv.cfg`` planted
    in a package folder (beside its ``__init__.py`` or a module) does not hide that package."""
    if not (folder / "pyvenv.cfg").is_file():
        return False
    try:
        with os.scandir(folder) as entries:
            return not any(PurePosixPath(entry.name).suffix in IMPORTABLE_SUFFIXES for entry in entries)
    except OSError:
        return False


def import_roots(workspace: Path, cwd: Path, script: Path | None, env: Mapping[str, str]) -> list[Path]:
    """The folders inside ``workspace`` a run imports from, resolved, in the order Python searches them:
    the script's folder (or ``cwd`` for ``-m``), ``cwd``, and each ``PYTHONPATH`` entry of the run's
    ``env`` (relative entries against ``cwd``). Folders outside the workspace are left out."""
    root = workspace.resolve()
    candidates = [script.parent if script is not None else cwd, cwd]
    candidates += [Path(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    found: list[Path] = []
    for candidate in candidates:
        path = (cwd / candidate).resolve()
        if path.is_relative_to(root) and path not in found:
            found.append(path)
    return found


def resolve_program(name: str, cwd: Path, path_value: str | None) -> Path | None:
    """The file a launch runs for program ``name``: a name with a slash against ``cwd``, a bare name on
    ``path_value`` (the run's ``PATH``; ``os.defpath`` when None). Not resolved through links: the
    caller decides whether the name or its target matters."""
    if "/" in name:
        path = Path(name) if Path(name).is_absolute() else cwd / name
        return path if path.is_file() else None
    found = shutil.which(name, path=os.defpath if path_value is None else path_value)
    return Path(found) if found is not None else None
