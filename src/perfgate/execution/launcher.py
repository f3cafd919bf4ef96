"""One reading of a command's launcher options, for approval and for launch alike.

What a human (or an allowlist rule) approves is the script a command runs (`perfgate.execution.target`),
and where perfgate puts its harness is in front of that same script (`perfgate.benchmarking.windows.launch`). Both
read the command here, so the two can never disagree on which token is the script: a launcher option read
as a flag on one side and as taking a value on the other would let approval see ``train.py`` while
``evil.py`` runs.

Options are read the way the launchers themselves read them. The Python interpreter: single-letter flags
combine (``-uB``), ``-W``/``-X`` take their value attached or as the next token, ``-c``/``-m`` end the
options, and so does ``--``. torchrun (``torch.distributed.run``'s argparse): long options by their exact
names, with ``=VALUE`` or the next token; ``-r``/``-t`` with an attached or the next value. An option
neither table knows is refused rather than guessed at, and so are argparse's abbreviations (``--virt``
for ``--virtual-local-rank``) and the ``PET_*`` variables torchrun reads as options (``PET_NO_PYTHON``).

Stdlib only: the approval path and the detached supervisor import it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "TORCHRUN_FLAGS",
    "TORCHRUN_MODULES",
    "TORCHRUN_VALUED",
    "LauncherError",
    "PythonCommand",
    "TorchrunCommand",
    "is_python",
    "parse_python",
    "parse_torchrun",
    "torchrun_env_options",
]

TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})

_TORCHRUN_VALUED_NAMES = (
    "nnodes",
    "nproc-per-node",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "event-log-handler",
    "role",
    "log-dir",
    "redirects",
    "tee",
    "local-ranks-filter",
    "duplicate-stdout-filters",
    "duplicate-stderr-filters",
    "node-rank",
    "master-addr",
    "master-port",
    "local-addr",
    "logs-specs",
    "numa-binding",
    "signals-to-handle",
    "shutdown-timeout",
)
_TORCHRUN_FLAG_NAMES = ("standalone", "module", "no-python", "run-path", "virtual-local-rank", "help")


def _spellings(names: Sequence[str]) -> frozenset[str]:
    """``--a-b`` and ``--a_b``: torchrun accepts both for every option."""
    return frozenset(f"--{s}" for n in names for s in (n, n.replace("-", "_")))


TORCHRUN_VALUED = _spellings(_TORCHRUN_VALUED_NAMES) | {"-r", "-t"}
"""torchrun options that take a value (torch 2.13's parser; a test compares with the installed one)."""
TORCHRUN_FLAGS = _spellings(_TORCHRUN_FLAG_NAMES) | {"-m", "-h"}
"""torchrun options that take none."""

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PY_FLAG_LETTERS = set("bBdEhiIOPqRsStuvVx?")
_PY_VALUE_LETTERS = set("WX")
_PY_LONG_VALUED = {"--check-hash-based-pycs"}
_PY_LONG_FLAGS = {"--help", "--version", "--help-env", "--help-xoptions", "--help-all"}
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


class LauncherError(ValueError):
    """A command whose launcher options perfgate cannot read the way the launcher would."""


def is_python(program: str) -> bool:
    """Whether ``program`` names a Python interpreter (``python``, ``python3``, ``/x/python3.11``)."""
    return bool(_PYTHON.match(os.path.basename(program)))


@dataclass(frozen=True)
class PythonCommand:
    """``python [options] (script | -m module | -c code | -) args``."""

    interpreter: tuple[str, ...]
    """The program and its own options."""
    mode: Literal["script", "module", "code", "stdin", "none"]
    target: str | None
    """The script path, module name or code; None for stdin or nothing."""
    args: tuple[str, ...]


@dataclass(frozen=True)
class TorchrunCommand:
    """``torchrun [options] (script | -m module) args``, or ``python ... -m torch.distributed.run ...``."""

    launcher: tuple[str, ...]
    """``("torchrun",)`` or the interpreter with its options, ``-m`` and the launcher module."""
    options: tuple[str, ...]
    """torchrun's options as given, less ``-m``/``--module`` (see ``module``)."""
    module: bool
    no_python: bool
    target: str | None
    args: tuple[str, ...]


def parse_python(argv: Sequence[str]) -> PythonCommand:
    """Read ``argv`` (``argv[0]`` an interpreter) as CPython reads its command line.

    Raises:
        LauncherError: an option the interpreter does not have, or one missing its value.
    """
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = argv[i + 1 :]
            head = tuple(argv[: i + 1])
            if not rest:
                return PythonCommand(head, "none", None, ())
            if rest[0] == "-":
                return PythonCommand(head, "stdin", None, tuple(rest[1:]))
            return PythonCommand(head, "script", rest[0], tuple(rest[1:]))
        if tok == "-" or not tok.startswith("-"):
            mode: Literal["script", "stdin"] = "stdin" if tok == "-" else "script"
            return PythonCommand(tuple(argv[:i]), mode, None if tok == "-" else tok, tuple(argv[i + 1 :]))
        if tok.startswith("--"):
            name = tok.partition("=")[0]
            if name in _PY_LONG_VALUED:
                i += 1 if "=" in tok else 2
            elif tok in _PY_LONG_FLAGS:
                i += 1
            else:
                raise LauncherError(f"the Python option {tok!r} is not one perfgate knows")
            continue
        # A cluster of single letters: flags, then at most one letter that takes the rest (or the next
        # token) as its value, or -c/-m that end the interpreter's options.
        for j, letter in enumerate(tok[1:], start=1):
            if letter in "cm":
                value = tok[j + 1 :]
                head = tuple(argv[:i]) + ((tok[:j],) if j > 1 else ())
                if value:
                    target, rest = value, argv[i + 1 :]
                elif i + 1 < len(argv):
                    target, rest = argv[i + 1], argv[i + 2 :]
                else:
                    raise LauncherError(f"python -{letter} names no {'module' if letter == 'm' else 'code'}")
                return PythonCommand(head, "module" if letter == "m" else "code", target, tuple(rest))
            if letter in _PY_VALUE_LETTERS:
                i += 1 if tok[j + 1 :] else 2
                break
            if letter not in _PY_FLAG_LETTERS:
                raise LauncherError(f"the Python option -{letter} (in {tok!r}) is not one perfgate knows")
        else:
            i += 1
        if i > len(argv):
            raise LauncherError(f"the Python option {tok!r} needs a value")
    return PythonCommand(tuple(argv), "none", None, ())


def torchrun_env_options(env: Mapping[str, str]) -> list[str]:
    """The ``PET_*`` names in ``env``: torchrun takes each as the default of an option (``PET_NO_PYTHON``,
    ``PET_MODULE``), which the command line a human approves does not show."""
    return sorted(k for k in env if k.startswith("PET_"))


def parse_torchrun(launcher: Sequence[str], rest: Sequence[str]) -> TorchrunCommand:
    """Read torchrun's options and target from ``rest`` (what follows ``launcher``).

    Raises:
        LauncherError: an option torchrun's parser would read otherwise than this table says (unknown,
            abbreviated, a flag given a value, a value missing).
    """
    options: list[str] = []
    module = no_python = False
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-") or _NEGATIVE.match(tok):
            break
        name, eq, _value = tok.partition("=")
        if name in ("-m", "--module") and not eq:
            module = True
            i += 1
            continue
        if name in TORCHRUN_FLAGS and not eq:
            no_python = no_python or name in ("--no-python", "--no_python")
            options.append(tok)
            i += 1
        elif name in TORCHRUN_VALUED and name.startswith("--") and eq:
            options.append(tok)
            i += 1
        elif tok in TORCHRUN_VALUED:
            if i + 1 >= len(rest):
                raise LauncherError(f"the torchrun option {tok} needs a value")
            value = rest[i + 1]
            if value.startswith("-") and not _NEGATIVE.match(value):
                raise LauncherError(f"the torchrun option {tok} is followed by {value!r}, not a value")
            options.extend((tok, value))
            i += 2
        elif tok[:2] in ("-r", "-t") and not tok.startswith("--"):
            options.append(tok)  # -r3: the value attached
            i += 1
        else:
            raise LauncherError(
                f"the torchrun option {tok!r} is not one perfgate knows (an abbreviation or a newer option): "
                "spell the option out in full, as `torchrun --help` lists it"
            )
    target = rest[i] if i < len(rest) else None
    args = tuple(rest[i + 1 :]) if target is not None else ()
    return TorchrunCommand(tuple(launcher), tuple(options), module, no_python, target, args)
