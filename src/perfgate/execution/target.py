"""What a command is: the user's command inside the harness wrapper, and the script or module it runs.

Tools wrap training commands as ``python ENTRY -- train.py ARGS`` (or the torchrun form), with ENTRY the
harness entry file in the trust root. Approvals and allowlist rules must be about what the user's command
runs, not about the wrapper: a rule for ``python ENTRY *`` would allow every script the agent can write. `user_argv` removes the
wrapper; `command_target` names the script or module the command runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from perfgate.execution.launcher import (
    TORCHRUN_MODULES,
    LauncherError,
    TorchrunCommand,
    is_python,
    parse_python,
    parse_torchrun,
)

__all__ = [
    "HARNESS_ENTRY",
    "HARNESS_MODULE",
    "SLURM_MODULE",
    "Target",
    "command_target",
    "files_named",
    "harness_entries",
    "is_slurm_submission",
    "user_argv",
]

HARNESS_MODULE = "perfgate.harness"
HARNESS_ENTRY = "perfgate-harness.py"
"""The file perfgate starts the harness from (``python <trust root>/harness/<digest>/perfgate-harness.py
[options] -- train.py``): a path in the trust root, so nothing in the run's directory is imported first."""
SLURM_MODULE = "perfgate.execution.slurm"
"""perfgate's Slurm launcher (`perfgate.execution.slurm`): ``python -m perfgate.execution.slurm [resources] --
CMD`` runs CMD as a Slurm job's ranks."""
_SHELLS = {"sh", "bash", "zsh", "dash"}


@dataclass(frozen=True)
class Target:
    """The script (a path as written) or module (a dotted name) a command runs."""

    kind: Literal["script", "module", "program"]
    name: str

    def file(self, cwd: Path) -> Path | None:
        """The file this target runs, resolved against ``cwd`` (modules: inside ``cwd``), if it exists."""
        if self.kind == "module":
            base = cwd.joinpath(*self.name.split("."))
            for candidate in (base.with_suffix(".py"), base / "__main__.py", base / "__init__.py"):
                if candidate.is_file():
                    return candidate.resolve()
            return None
        path = Path(self.name) if Path(self.name).is_absolute() else cwd / self.name
        return path.resolve() if path.is_file() else None


def is_slurm_submission(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs its command through perfgate's Slurm launcher (a cluster submission)."""
    return any(argv[i] == "-m" and argv[i + 1] == SLURM_MODULE for i in range(len(argv) - 1))


def harness_entries(argv: Sequence[str]) -> list[str]:
    """The tokens of ``argv`` (past the program) that name a harness entry file; the gate refuses a
    request where one is not the server's own (`perfgate.execution.gate`)."""
    return [t for t in argv[1:] if os.path.basename(t) == HARNESS_ENTRY]


def user_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` without perfgate's wrappers: the Slurm launcher (``python -m perfgate.execution.slurm
    [resources] --``) and the harness entry (``ENTRY [options] --``).

    ``python -m perfgate.harness`` stays: a ``perfgate/`` folder in the working directory would be
    imported in its place, so what it runs is not the user's script alone, and a human sees it.
    """
    tokens = list(argv)
    if is_slurm_submission(tokens) and "--" in tokens:
        tokens = tokens[tokens.index("--") + 1 :]
    for i in range(1, len(tokens)):
        if os.path.basename(tokens[i]) == HARNESS_ENTRY:
            rest = tokens[i + 1 :]
            if "--" in rest:
                rest = rest[rest.index("--") + 1 :]
            return (*tokens[:i], *rest)
    return tuple(tokens)


def _torchrun_target(command: TorchrunCommand) -> Target | None:
    if command.target is None or command.no_python:
        return Target("program", command.target) if command.target is not None else None
    return Target("module" if command.module else "script", command.target)


def command_target(argv: Sequence[str]) -> Target | None:
    """The script or module the user's command runs (harness removed), or None when it cannot be told.

    The launcher's options are read by `perfgate.execution.launcher`, the reader the launch uses too; a
    command whose options it cannot read has no target (no rule matches it; a human sees the argv).
    """
    user = user_argv(argv)
    program = os.path.basename(user[0])
    try:
        if is_python(user[0]):
            parsed = parse_python(user)
            if parsed.mode == "module" and parsed.target in TORCHRUN_MODULES:
                return _torchrun_target(parse_torchrun((), parsed.args))
            if parsed.mode in ("script", "module") and parsed.target is not None:
                return Target(parsed.mode, parsed.target)
            return None
        if program == "torchrun":
            return _torchrun_target(parse_torchrun((), user[1:]))
    except LauncherError:
        return None
    if program in _SHELLS:
        positional = [t for t in user[1:] if not t.startswith("-")]
        return Target("script", positional[0]) if positional else None
    if "/" in user[0]:
        return Target("program", user[0])
    return None


def files_named(argv: Sequence[str], cwd: Path) -> list[Path]:
    """Code files the command names: its script or module, and argv tokens or ``--opt=FILE`` values that
    are existing code or config files (relative to ``cwd``), in first-seen order, resolved.

    Other files (data, checkpoints, the dumps and logs a run writes) are not code: binding them would
    make a run's own outputs invalidate its approval between two launches.
    """
    from perfgate.envprobe.provenance import CODE_SUFFIXES

    seen: dict[Path, None] = {}
    target = command_target(argv)
    if target is not None and (found := target.file(cwd)) is not None:
        seen[found] = None
    for token in user_argv(argv):
        for piece in {token, token.partition("=")[2]}:
            if not piece or len(piece) > 4096 or "\x00" in piece:
                continue
            path = Path(piece) if Path(piece).is_absolute() else cwd / piece
            if path.suffix not in CODE_SUFFIXES:
                continue
            try:
                if path.is_file():
                    seen.setdefault(path.resolve(), None)
            except OSError:
                continue
    return list(seen)
