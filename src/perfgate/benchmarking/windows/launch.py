"""Put the harness in front of a training command, started from a copy of perfgate the agent cannot write.

Recognised forms (argv lists, never shell strings), with ``ENTRY`` the harness entry file in the trust
root (``<state>/harness/<digest>/perfgate-harness.py``, next to a copy of this perfgate):

* ``python [-opts] script.py ARGS``      -> ``python [-opts] ENTRY -- script.py ARGS``
* ``python [-opts] -m pkg.train ARGS``   -> ``python [-opts] ENTRY -- -m pkg.train ARGS``
* ``torchrun [opts] script.py ARGS`` (and ``python -m torch.distributed.run``)
                                         -> ``torchrun [opts] ENTRY -- script.py ARGS``

The harness is started by its file's path, never as ``-m perfgate.harness``: Python puts a script's own
folder first on the import path, so ``perfgate`` is the copy next to the entry (identical to the installed
package, checked before each run), not a ``perfgate/`` folder in the run's working directory. The entry
then gives the training script the import path ``python train.py`` would have given it. Commands are read
by `perfgate.execution.launcher`, the reader approval uses too. A command that already names the harness
is refused: perfgate inserts it. Other launchers (accelerate, deepspeed, shell scripts) cannot be
rewritten safely: use explicit timing there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.execution.launcher import (
    TORCHRUN_MODULES,
    LauncherError,
    is_python,
    parse_python,
    parse_torchrun,
)
from perfgate.execution.target import HARNESS_ENTRY, HARNESS_MODULE

__all__ = [
    "ENTRY_SOURCE",
    "HARNESS_MODULE",
    "harness_entry",
    "harness_pythonpath",
    "launch_env",
    "names_harness",
    "prepare_harness_path",
    "wrap_command",
]

ENTRY_SOURCE = """\
# perfgate's harness entry: started by its path, so this folder (a copy of perfgate the agent cannot write)
# is where perfgate comes from, never the run's working directory.
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.realpath(__file__))
if _sys.path and _sys.path[0] and _os.path.realpath(_sys.path[0]) == _here:
    del _sys.path[0]
_sys.path.insert(0, _here)
try:
    from perfgate.harness.launch import main as _main
finally:
    _sys.path.remove(_here)
# What `python -m pkg.train` would put first; the harness puts a script's own folder there instead.
_sys.path.insert(0, _os.getcwd())
_sys.exit(_main())
"""


_START_UP_VARIABLES = ("PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "PYTHONPYCACHEPREFIX")
"""Variables that choose where the interpreter finds code to run at start-up, or its bytecode."""


def launch_env(env: dict[str, str], pycache: Path, copy: Path | None) -> dict[str, str]:
    """The environment changes of a launch: the request's ``env`` with Python's bytecode cache moved to
    ``pycache`` (`perfgate.security.trustroot.TrustRoot.pycache_dir`) and, when ``copy`` is given, that copy first on
    PYTHONPATH.

    ``PYTHONPYCACHEPREFIX`` makes every interpreter of the run (torchrun's ranks and the processes they
    start inherit it) read and write compiled bytecode there only, never in a ``__pycache__`` folder of the
    workspace: a ``.pyc`` planted there with the source's size and mtime would otherwise run in place of
    the approved source.

    Raises:
        BenchmarkError: ``env`` sets one of the variables that choose start-up code or the bytecode cache,
            a ``PET_*`` variable torchrun would read as an option, the launch id the server gives, or a
            variable of perfgate's harness.
    """
    from perfgate.execution.launcher import torchrun_env_options
    from perfgate.execution.launches import GIVEN_ENV, LAUNCH_ENV
    from perfgate.execution.scope import measuring_variable

    numbered = sorted(k for k in env if k in (LAUNCH_ENV, GIVEN_ENV))
    if numbered:
        raise BenchmarkError(
            f"env sets {', '.join(numbered)}: perfgate numbers each launch itself (1, 2, 3 ... per workspace, "
            "what {launch} in a dump path becomes); drop it"
        )
    own = sorted(k for k in env if measuring_variable(k))
    if own:
        raise BenchmarkError(
            f"env sets {', '.join(own)}: perfgate sets its harness's variables itself from the tool's inputs "
            "(warmup_steps, measure_steps, capture, ...); drop them and use those inputs"
        )
    refused = [k for k in _START_UP_VARIABLES if k in env] + torchrun_env_options(env)
    if refused:
        raise BenchmarkError(
            f"env sets {', '.join(refused)}: these choose the code an interpreter runs before the script "
            "(start-up files, bytecode) or torchrun's options, which the approved command line would not show; "
            "drop them (give torchrun options on its command line)"
        )
    out = dict(env)
    out["PYTHONPYCACHEPREFIX"] = str(pycache)
    if copy is not None:
        existing = env.get("PYTHONPATH")
        out["PYTHONPATH"] = str(copy) if not existing else f"{copy}{os.pathsep}{existing}"
    return out


def _torchrun_wrap(launcher: Sequence[str], rest: Sequence[str], entry: str) -> list[str]:
    parsed = parse_torchrun(launcher, rest)
    if parsed.no_python:
        raise BenchmarkError("torchrun --no-python runs a non-Python program: the harness cannot time it")
    if parsed.target is None:
        raise BenchmarkError("the torchrun command names no training script")
    script = ["-m", parsed.target] if parsed.module else [parsed.target]
    return [*parsed.launcher, *parsed.options, entry, "--", *script, *parsed.args]


def names_harness(argv: Sequence[str]) -> bool:
    """Whether ``argv`` already starts perfgate's harness (``-m perfgate.harness`` or an entry file)."""
    return any(os.path.basename(t) == HARNESS_ENTRY for t in argv) or any(
        argv[i] == "-m" and argv[i + 1] == HARNESS_MODULE for i in range(len(argv) - 1)
    )


def wrap_command(argv: Sequence[str], entry: Path) -> list[str]:
    """``argv`` rewritten to run under the harness started from ``entry`` (`harness_entry`).

    Raises:
        BenchmarkError: a launcher the harness cannot be inserted into, options perfgate cannot read the
            way the launcher would, or a command that already names the harness.
    """
    argv = list(argv)
    if names_harness(argv):
        raise BenchmarkError(
            "the command already names perfgate's harness: give the training command alone (python train.py "
            "... or torchrun ... train.py ...); perfgate inserts the harness itself"
        )
    program = os.path.basename(argv[0])
    try:
        if program == "torchrun":
            return _torchrun_wrap(argv[:1], argv[1:], str(entry))
        if is_python(argv[0]):
            parsed = parse_python(argv)
            if parsed.mode == "none":
                raise BenchmarkError("the python command names no script or module")
            if parsed.mode == "code":
                raise BenchmarkError(
                    "python -c code cannot run under the harness: put the code in a script file"
                )
            if parsed.mode == "stdin":
                raise BenchmarkError(
                    "a script read from stdin cannot run under the harness: name the script file"
                )
            assert parsed.target is not None
            if parsed.mode == "module" and parsed.target in TORCHRUN_MODULES:
                return _torchrun_wrap([*parsed.interpreter, "-m", parsed.target], parsed.args, str(entry))
            script = ["-m", parsed.target] if parsed.mode == "module" else [parsed.target]
            return [*parsed.interpreter, str(entry), "--", *script, *parsed.args]
    except LauncherError as exc:
        raise BenchmarkError(str(exc)) from exc
    raise BenchmarkError(
        f"cannot insert the harness into a {program!r} command. Start it as `python train.py ...` or "
        "`torchrun ... train.py ...`, or use timing='explicit' (perfgate.harness.Window in the script) or "
        "timing='log'"
    )


def _package_root() -> Path:
    import perfgate

    return Path(perfgate.__file__).resolve().parent


def _package_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def harness_pythonpath(state_dir: Path) -> Path:
    """Where the copy of this perfgate and the harness entry live: ``<state_dir>/harness/<digest>``, with
    ``state_dir`` the trust root's state (only the operator writes there), content-addressed."""
    root = _package_root()
    h = hashlib.sha256(ENTRY_SOURCE.encode())
    for path in _package_files(root):
        st = path.stat()
        h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return state_dir / "harness" / h.hexdigest()[:16]


def harness_entry(copy: Path) -> Path:
    """The entry file in a copy made by `prepare_harness_path`."""
    return copy / HARNESS_ENTRY


def _copy_matches(target: Path, root: Path) -> bool:
    """Whether the folder holds exactly the entry and the installed package's files, nothing else: a
    ``sitecustomize.py`` or ``.pth`` beside them would run at every start-up of the training interpreter."""
    wanted = {Path("perfgate") / p.relative_to(root): p for p in _package_files(root)}
    present = {p.relative_to(target) for p in target.rglob("*") if not p.is_dir()}
    if present != {*wanted, Path(HARNESS_ENTRY)}:
        return False
    if harness_entry(target).read_text(encoding="utf-8") != ENTRY_SOURCE:
        return False
    return all((target / rel).read_bytes() == src.read_bytes() for rel, src in wanted.items())


def prepare_harness_path(target: Path) -> Path:
    """Create the copy at ``target`` (from :func:`harness_pythonpath`), or replace it when its content
    differs from the installed package and the entry (someone edited it).

    Calls racing on one copy (parallel tool calls, two servers) are serialized by a lock beside it, so
    one creates or replaces it and the others find it ready: never does one move aside the fresh copy
    another call's command is about to import.
    """
    from perfgate.helpers.filelock import held

    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with held(target.with_name(target.name + ".lock")):
        return _prepare_harness_path(target)


def _prepare_harness_path(target: Path) -> Path:
    """`prepare_harness_path` under its lock."""
    if harness_entry(target).is_file() and _copy_matches(target, _package_root()):
        return target
    if target.exists():
        stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=target.parent))
        with contextlib.suppress(OSError):
            target.rename(stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    root = _package_root()
    for path in _package_files(root):
        dest = staging / "perfgate" / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    harness_entry(staging).write_text(ENTRY_SOURCE, encoding="utf-8")
    try:
        staging.rename(target)
    except OSError:
        # Another call created it first; theirs is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return target
