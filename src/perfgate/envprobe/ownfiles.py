"""perfgate's own files in a user's tree: never part of the code state a run or an approval binds to.

Two kinds: the workspace's ``.perfgate/`` folder (ledger, artifacts, reports; perfgate writes a
``.gitignore`` holding ``*`` there, but a folder committed before that, or with ``git add -f``, is still
tracked), and a copy of perfgate's harness (``harness/<16 hex digits>/`` holding ``perfgate-harness.py`` and
``perfgate/``, made in the trust root's state folder, which an operator may have put inside a repository).
A change to either is perfgate's doing, not the user's: counting it would make every run after the first
look like a code change (the ledger grows with each call).

Only these exact shapes are left out: a workspace's own ``.perfgate`` at its top, and a harness folder whose
name is a 16-hex-digit digest; nothing else that merely looks like them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

__all__ = ["HARNESS_COPY_GLOB", "STATE_DIR", "is_own_path", "own_pathspecs"]

STATE_DIR = ".perfgate"
"""The workspace's state folder (`perfgate.evidence.ledger.STATE_DIR_NAME`)."""
_HEX16 = "[0-9a-f]" * 16
HARNESS_COPY_GLOB = f"**/harness/{_HEX16}/**"
"""Where a harness copy's files are (`perfgate.benchmarking.launch.harness_pythonpath`), as a git glob."""
_HARNESS_DIGEST = re.compile(r"[0-9a-f]{16}")


def own_pathspecs(root: str | os.PathLike[str], workspace: Path) -> list[str]:
    """git pathspecs for the whole repository at ``root`` except perfgate's own files (give them after
    ``--`` to ``git status`` or ``git diff``; paths in the output stay as git prints them)."""
    rel = os.path.relpath(workspace.resolve(), Path(root).resolve())
    prefix = "" if rel == "." else Path(rel).as_posix() + "/"
    return [":(top)", f":(top,exclude){prefix}{STATE_DIR}", f":(top,exclude,glob){HARNESS_COPY_GLOB}"]


def is_own_path(rel: str | PurePosixPath) -> bool:
    """Whether ``rel`` (relative to the workspace, posix separators) is one of perfgate's own files."""
    parts = PurePosixPath(rel).parts
    if parts[:1] == (STATE_DIR,):
        return True
    return any(
        parts[i] == "harness" and _HARNESS_DIGEST.fullmatch(parts[i + 1]) is not None
        for i in range(len(parts) - 2)
    )
