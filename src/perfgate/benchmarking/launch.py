"""Put the harness in front of a training command, and give it a copy of perfgate to import.

Recognised forms (argv lists, never shell strings):

* ``python [-opts] script.py ARGS``      -> ``python [-opts] -m perfgate.harness -- script.py ARGS``
* ``python [-opts] -m pkg.train ARGS``   -> ``python [-opts] -m perfgate.harness -- -m pkg.train ARGS``
* ``torchrun [opts] script.py ARGS`` (and ``python -m torch.distributed.run``)
                                         -> ``torchrun [opts] -m perfgate.harness -- script.py ARGS``

A command that already runs ``perfgate.harness`` is left alone. Other launchers (accelerate,
deepspeed, shell scripts) cannot be rewritten safely: use explicit timing there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from perfgate._statefs import make_dirs, remove_tree
from perfgate.benchmarking.errors import BenchmarkError

__all__ = ["HARNESS_MODULE", "harness_pythonpath", "prepare_harness_path", "wrap_command"]

HARNESS_MODULE = "perfgate.harness"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PY_VALUE_OPTS = {"-X", "-W", "--check-hash-based-pycs"}
_TORCHRUN_FLAGS = {
    "--standalone",
    "--no-python",
    "--no_python",
    "-m",
    "--module",
    "--run-path",
    "--run_path",
    "--virtual-local-rank",
    "--virtual_local_rank",
}
_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


def _is_python(program: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(program)))


def _python_split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(interpreter + its options, the rest starting at the script or ``-m``)."""
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok in ("-m", "-c") or not tok.startswith("-") or tok == "-":
            break
        i += 2 if tok in _PY_VALUE_OPTS else 1
    return list(argv[:i]), list(argv[i:])


def _torchrun_wrap(head: list[str], opts_and_target: list[str]) -> list[str]:
    i = 0
    module = False
    kept: list[str] = []
    while i < len(opts_and_target):
        tok = opts_and_target[i]
        if not tok.startswith("-"):
            break
        if tok in ("--no-python", "--no_python"):
            raise BenchmarkError("torchrun --no-python runs a non-Python program: the harness cannot time it")
        if tok in ("-m", "--module"):
            module = True
            i += 1
            continue
        if tok in _TORCHRUN_FLAGS or (tok.startswith("--") and "=" in tok):
            kept.append(tok)
            i += 1
        else:
            kept.extend(opts_and_target[i : i + 2])
            i += 2
    target = opts_and_target[i:]
    if not target:
        raise BenchmarkError("the torchrun command names no training script")
    script = ["-m", *target] if module else target
    return [*head, *kept, "-m", HARNESS_MODULE, "--", *script]


def wrap_command(argv: Sequence[str]) -> list[str]:
    """``argv`` rewritten to run under ``python -m perfgate.harness``.

    Raises:
        BenchmarkError: a launcher the harness cannot be inserted into.
    """
    argv = list(argv)
    if HARNESS_MODULE in argv:
        return argv
    program = os.path.basename(argv[0])
    if program == "torchrun":
        return _torchrun_wrap(argv[:1], argv[1:])
    if _is_python(argv[0]):
        head, rest = _python_split(argv)
        if not rest:
            raise BenchmarkError("the python command names no script or module")
        if rest[0] == "-c":
            raise BenchmarkError("python -c code cannot run under the harness: put the code in a script file")
        if rest[0] == "-m" and len(rest) > 1 and rest[1] in _TORCHRUN_MODULES:
            return _torchrun_wrap([*head, "-m", rest[1]], rest[2:])
        return [*head, "-m", HARNESS_MODULE, "--", *rest]
    raise BenchmarkError(
        f"cannot insert the harness into a {program!r} command. Start it as `python train.py ...` or "
        "`torchrun ... train.py ...`, put `-m perfgate.harness --` into your launcher yourself, or use "
        "timing='explicit' (perfgate.harness.Window in the script) or timing='log'"
    )


def _package_root() -> Path:
    import perfgate

    return Path(perfgate.__file__).resolve().parent


def _package_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def harness_pythonpath(state_dir: Path) -> Path:
    """Where a copy of this perfgate lives for training interpreters that lack it (content-addressed)."""
    root = _package_root()
    h = hashlib.sha256()
    for path in _package_files(root):
        st = path.stat()
        h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return state_dir / "harness-path" / h.hexdigest()[:16]


def _copy_matches(target: Path, root: Path) -> bool:
    """Whether the copy holds exactly the installed package's files (the workspace is the agent's to
    write: an edited harness would time what it likes)."""
    copy = target / "perfgate"
    wanted = {p.relative_to(root): p for p in _package_files(root)}
    present: set[Path] = {p.relative_to(copy) for p in _package_files(copy)} if copy.is_dir() else set()
    if present != set(wanted):
        return False
    return all((copy / rel).read_bytes() == src.read_bytes() for rel, src in wanted.items())


def prepare_harness_path(target: Path) -> Path:
    """Create the copy at ``target`` (from :func:`harness_pythonpath`), or replace it when its content
    differs from the installed package (someone edited it).

    Calls racing on one copy (parallel tool calls, two servers) are serialized by a lock beside it, so
    one creates or replaces it and the others find it ready: never does one move aside the fresh copy
    another call's command is about to import.
    """
    from perfgate._filelock import held

    with held(target.with_name(target.name + ".lock"), confined=True):
        return _prepare_harness_path(target)


def _prepare_harness_path(target: Path) -> Path:
    """`prepare_harness_path` under its lock."""
    make_dirs(target.parent)  # in the agent-writable .perfgate/: a link planted on the way is refused
    if (target / "perfgate" / "__init__.py").is_file() and _copy_matches(target, _package_root()):
        return target
    if target.exists():
        stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=target.parent))
        with contextlib.suppress(OSError):
            target.rename(stale / "old")
        remove_tree(stale)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    root = _package_root()
    for path in _package_files(root):
        dest = staging / "perfgate" / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    try:
        staging.rename(target)
    except OSError:
        # Another call created it first; theirs is identical.
        remove_tree(staging)
    return target
