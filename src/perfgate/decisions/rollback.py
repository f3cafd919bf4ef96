"""A kept change's rollback must name something that can be checked, here and now.

"revert it" cannot be followed by anyone; a rollback counts when it names at least one of: a commit of
the workspace's git repository (``git revert 1a2b3c4``), a file in the workspace (``git checkout --
train.py``, ``git apply -R change.patch``), or a command-line option or environment assignment that the
baseline's own windows ran with (``--num-workers 0``, ``OMP_NUM_THREADS=1``), each checked against the
repository, the workspace or the ledger.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, str_list

__all__ = ["MAX_TOKENS", "example_options", "rollback_check"]

MAX_TOKENS = 64
"""Tokens of a rollback that are looked at (a rollback is a command or a reference, not an essay)."""
_HEX = re.compile(r"[0-9a-fA-F]{7,64}")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")


def _tokens(text: str) -> list[str]:
    try:
        parts = shlex.split(text)
    except ValueError:
        parts = text.split()
    return [p.strip("`'\",;()") for p in parts][:MAX_TOKENS]


def _in_workspace(token: str, workspace: Path) -> bool:
    if not token or token.startswith("-") or "\0" in token or len(token) > 1000:
        return False
    root = workspace.resolve()
    try:
        path = (root / token).resolve()
    except (OSError, RuntimeError):
        return False
    return path != root and path.is_relative_to(root) and path.is_file()


def _baseline_ran(token: str, baseline: Sequence[EvidenceRecord]) -> bool:
    """The option or assignment is one the baseline windows' recorded command or environment holds."""
    for record in baseline:
        argv = str_list(record.inputs.get("command"))
        env = {str(k): str(v) for k, v in as_dict(record.inputs.get("env")).items()}
        if token.startswith("-"):
            name, eq, value = token.partition("=")
            if token in argv or (eq and any(a == name and b == value for a, b in pairwise(argv))):
                return True
        elif (m := _ASSIGN.fullmatch(token)) is not None and (
            env.get(m.group(1)) == m.group(2) or token in argv
        ):
            return True
    return False


def rollback_check(
    rollback: str, workspace: Path, baseline: Sequence[EvidenceRecord]
) -> tuple[list[str], str | None]:
    """(what the rollback names that was checked, the problem when it names nothing checkable)."""
    from perfgate.execution.changes import commit_exists

    found: list[str] = []
    unknown: list[str] = []
    for token in _tokens(rollback):
        if _HEX.fullmatch(token):
            if commit_exists(workspace, token):
                found.append(f"commit {token}")
            else:
                unknown.append(f"{token} is no commit of the workspace's repository")
        elif token in ("-", "--"):
            continue
        elif token.startswith("-") or _ASSIGN.fullmatch(token):
            if _baseline_ran(token, baseline):
                found.append(f"{token} (the baseline's windows ran with it)")
            elif baseline:
                unknown.append(f"{token} is not in the baseline windows' recorded command or environment")
        elif ("/" in token or "." in token) and _in_workspace(token, workspace):
            found.append(f"file {token}")
    if found:
        return found, None
    why = "; ".join(unknown[:3]) or "it names no commit, workspace file or baseline setting"
    return [], f"rollback {rollback[:120]!r} cannot be checked: {why}"


def example_options(baseline: Sequence[EvidenceRecord], limit: int = 3) -> list[str]:
    """Options the baseline's first window ran with, to show in a refusal."""
    argv = str_list(baseline[0].inputs.get("command")) if baseline else []
    return [a for a in argv if a.startswith("-")][:limit]
