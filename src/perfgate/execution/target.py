"""What a command is: the user's command inside the harness wrapper, and the script or module it runs.

Tools wrap training commands as ``python -m perfgate.harness -- train.py ARGS`` (or the torchrun form).
Approvals and allowlist rules must be about what the user's command runs, not about the wrapper: a rule
for ``python -m perfgate.harness *`` would allow every script the agent can write. `user_argv` removes the
wrapper; `command_target` names the script or module the command runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "HARNESS_MODULE",
    "SLURM_MODULE",
    "Target",
    "command_target",
    "files_named",
    "is_slurm_submission",
    "user_argv",
]

HARNESS_MODULE = "perfgate.harness"
SLURM_MODULE = "perfgate.execution.slurm"
"""perfgate's Slurm launcher (`perfgate.execution.slurm`): ``python -m perfgate.execution.slurm [resources] --
CMD`` runs CMD as a Slurm job's ranks."""
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PY_VALUE_OPTS = {"-X", "-W", "--check-hash-based-pycs"}
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}
_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
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


def user_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` without perfgate's wrappers: the Slurm launcher (``python -m perfgate.execution.slurm
    [resources] --``) and the harness (``-m perfgate.harness [options] --``)."""
    tokens = list(argv)
    if len(tokens) > 3 and tokens[1:3] == ["-m", SLURM_MODULE] and "--" in tokens:
        tokens = tokens[tokens.index("--") + 1 :]
    for i in range(len(tokens) - 1):
        if tokens[i] == "-m" and tokens[i + 1] == HARNESS_MODULE:
            rest = tokens[i + 2 :]
            if "--" in rest:
                rest = rest[rest.index("--") + 1 :]
            return (*tokens[:i], *rest)
    return tuple(tokens)


def _is_python(program: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(program)))


def _python_target(args: Sequence[str]) -> Target | None:
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "-m":
            return Target("module", args[i + 1]) if i + 1 < len(args) else None
        if tok == "-c":
            return None
        if not tok.startswith("-") or tok == "-":
            return Target("script", tok)
        i += 2 if tok in _PY_VALUE_OPTS else 1
    return None


def _torchrun_target(args: Sequence[str]) -> Target | None:
    i = 0
    module = False
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-"):
            return Target("module", tok) if module else Target("script", tok)
        if tok in ("-m", "--module"):
            module = True
            i += 1
        elif tok in _TORCHRUN_FLAGS or (tok.startswith("--") and "=" in tok):
            i += 1
        else:
            i += 2
    return None


def command_target(argv: Sequence[str]) -> Target | None:
    """The script or module the user's command runs (harness removed), or None when it cannot be told."""
    user = user_argv(argv)
    program = os.path.basename(user[0])
    if _is_python(user[0]):
        target = _python_target(user[1:])
        if target is not None and target.kind == "module" and target.name in _TORCHRUN_MODULES:
            rest = list(user[1:])
            return _torchrun_target(rest[rest.index(target.name) + 1 :])
        return target
    if program == "torchrun":
        return _torchrun_target(user[1:])
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
