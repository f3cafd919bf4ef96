"""Approval and launch read a command's launcher options alike, and as the launcher itself does.

The ground truth is the installed torch's own torchrun parser (``torch.distributed.run``), introspected:
every option it has is given in each spelling and form, and the script torchrun would run must be the
script approval names (`command_target`) and the one the harness is put in front of (`wrap_command`).
Before, ``--virtual-local-rank`` was a flag on the launch side and took a value on the approval side:
``torchrun --virtual-local-rank evil.py train.py`` was approved as train.py and ran evil.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from perfgate.benchmarking import BenchmarkError
from perfgate.benchmarking.windows.launch import wrap_command
from perfgate.execution.launcher import TORCHRUN_FLAGS, TORCHRUN_VALUED, parse_python
from perfgate.execution.target import Target, command_target

ENTRY = Path("/trust/harness/0123456789abcdef/perfgate-harness.py")


def _torch_parser() -> argparse.ArgumentParser:
    run = pytest.importorskip("torch.distributed.run")
    return run.get_args_parser()


def _options() -> list[tuple[str, bool, str]]:
    """(option string, takes a value, a value it accepts) for every option of the installed torchrun."""
    out: list[tuple[str, bool, str]] = []
    for action in _torch_parser()._actions:  # pyright: ignore[reportPrivateUsage]
        value = str(next(iter(action.choices))) if action.choices else "1"
        for name in action.option_strings:
            out.append((name, action.nargs != 0, value))
    return out


def test_every_option_of_the_installed_torchrun_is_known_with_its_arity() -> None:
    options = _options()
    assert ("--virtual-local-rank", False, "1") in options
    for name, valued, _ in options:
        assert name in (TORCHRUN_VALUED if valued else TORCHRUN_FLAGS), (name, valued)
    # ...and nothing is known that torchrun does not have (an option read wrongly either way)
    assert {n for n, _, _ in options} == TORCHRUN_VALUED | TORCHRUN_FLAGS


def _forms(name: str, valued: bool, value: str) -> list[list[str]]:
    if not valued:
        return [[name]]
    forms = [[name, value]]
    forms.append([f"{name}={value}"] if name.startswith("--") else [f"{name}{value}"])
    return forms


@pytest.mark.parametrize("launcher", [["torchrun"], ["python", "-m", "torch.distributed.run"]])
def test_every_option_is_read_as_torchrun_reads_it(launcher: list[str]) -> None:
    parser = _torch_parser()
    checked = 0
    for name, valued, value in _options():
        if name in ("-h", "--help", "--no-python", "--no_python"):
            continue  # help exits; --no-python runs a program, not a script (refused by the launch)
        for form in _forms(name, valued, value):
            # evil.py right after the option: a flag read as taking a value would hide it
            rest = [*form, "evil.py", "train.py", "--steps", "3"]
            truth = parser.parse_args(rest)
            kind = "module" if truth.module else "script"
            assert command_target([*launcher, *rest]) == Target(kind, truth.training_script), rest
            wrapped = wrap_command([*launcher, *rest], ENTRY)
            at = wrapped.index(str(ENTRY))
            assert wrapped[:at] == [*launcher, *(t for t in form if t not in ("-m", "--module"))]
            script = wrapped[at + 2 :]
            assert script[: 1 + truth.module] == (["-m"] if truth.module else []) + [truth.training_script]
            assert script[1 + truth.module :] == truth.training_script_args
            # approval reads the wrapped command as the launch runs it
            assert command_target(wrapped) == Target(kind, truth.training_script)
            checked += 1
    assert checked > 50


@pytest.mark.parametrize(
    "rest",
    [
        ["--virt", "evil.py", "train.py"],  # argparse expands the abbreviation to --virtual-local-rank
        ["--nproc", "2", "train.py"],
        ["--standalone=yes", "train.py"],
        ["--nnodes", "--standalone", "train.py"],
        ["-mt", "3", "train.py"],
    ],
)
def test_options_perfgate_cannot_read_are_refused_not_guessed(rest: list[str]) -> None:
    with pytest.raises(BenchmarkError):
        wrap_command(["torchrun", *rest], ENTRY)
    assert command_target(["torchrun", *rest]) is None  # no rule matches; a human sees the argv


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["python", "-u", "-X", "dev", "t.py"], ("script", "t.py")),
        (["python", "-uX", "dev", "t.py"], ("script", "t.py")),
        (["python", "-Xdev", "t.py"], ("script", "t.py")),
        (["python", "-uWerror", "t.py"], ("script", "t.py")),
        (["python", "-um", "pkg.t"], ("module", "pkg.t")),
        (["python", "-mpkg.t", "x"], ("module", "pkg.t")),
        (["python", "--check-hash-based-pycs", "always", "t.py"], ("script", "t.py")),
        (["python", "--", "t.py"], ("script", "t.py")),
    ],
)
def test_python_options_are_read_as_the_interpreter_reads_them(
    argv: list[str], target: tuple[str, str]
) -> None:
    parsed = parse_python(argv)
    assert (parsed.mode, parsed.target) == target
    assert command_target(argv) == Target(*target)  # pyright: ignore[reportArgumentType]
