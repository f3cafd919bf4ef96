"""Inserting the harness into training commands, and the importable copy of perfgate."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.benchmarking import BenchmarkError
from perfgate.benchmarking.windows.launch import (
    ENTRY_SOURCE,
    harness_entry,
    harness_pythonpath,
    prepare_harness_path,
    wrap_command,
)

ENTRY = Path("/trust/harness/0123456789abcdef/perfgate-harness.py")
H = [str(ENTRY), "--"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--lr", "1"], ["python", *H, "train.py", "--lr", "1"]),
        (
            ["/usr/bin/python3.11", "-u", "-X", "dev", "train.py"],
            ["/usr/bin/python3.11", "-u", "-X", "dev", *H, "train.py"],
        ),
        (["python", "-uXdev", "train.py"], ["python", "-uXdev", *H, "train.py"]),
        (["python", "-m", "pkg.train", "-m", "x"], ["python", *H, "-m", "pkg.train", "-m", "x"]),
        (["python", "-um", "pkg.train"], ["python", "-u", *H, "-m", "pkg.train"]),
        (
            ["torchrun", "--nproc-per-node", "2", "--standalone", "train.py", "--steps", "3"],
            ["torchrun", "--nproc-per-node", "2", "--standalone", *H, "train.py", "--steps", "3"],
        ),
        (
            ["torchrun", "--nproc_per_node=8", "-m", "pkg.train"],
            ["torchrun", "--nproc_per_node=8", *H, "-m", "pkg.train"],
        ),
        (
            ["torchrun", "--virtual-local-rank", "evil.py", "train.py"],
            ["torchrun", "--virtual-local-rank", *H, "evil.py", "train.py"],
        ),
        (
            ["python", "-m", "torch.distributed.run", "--nnodes", "1", "train.py"],
            ["python", "-m", "torch.distributed.run", "--nnodes", "1", *H, "train.py"],
        ),
    ],
)
def test_commands_are_wrapped_with_the_harness(argv: list[str], expected: list[str]) -> None:
    assert wrap_command(argv, ENTRY) == expected


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["accelerate", "launch", "train.py"], "timing='explicit'"),
        (["python", "-c", "print(1)"], "script file"),
        (["python"], "no script"),
        (["torchrun", "--nproc-per-node", "2"], "no training script"),
        (["torchrun", "--no-python", "bash", "x.sh"], "non-Python"),
        (["torchrun", "--virt", "evil.py", "train.py"], "spell the option out"),
        (["torchrun", "--standalone=1", "train.py"], "not one perfgate knows"),
        (["python", "-Z", "train.py"], "not one perfgate knows"),
        (["python", "-m", "perfgate.harness", "--", "t.py"], "already names perfgate's harness"),
        (["python", "/x/perfgate-harness.py", "--", "t.py"], "already names perfgate's harness"),
    ],
)
def test_unwrappable_commands_say_what_to_do(argv: list[str], fragment: str) -> None:
    with pytest.raises(BenchmarkError, match=fragment):
        wrap_command(argv, ENTRY)


def test_the_copy_of_perfgate_is_importable_without_the_installed_package(tmp_path: Path) -> None:
    target = harness_pythonpath(tmp_path)
    assert harness_pythonpath(tmp_path) == target  # content-addressed, stable
    prepare_harness_path(target)
    prepare_harness_path(target)  # idempotent
    code = "import perfgate.harness, sys; print(perfgate.harness.__file__)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],  # -S: no site-packages, so no installed perfgate
        env={"PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip().startswith(str(target))


def test_an_edited_harness_copy_is_replaced_before_it_runs(tmp_path: Path) -> None:
    """An edited timing harness, entry or a start-up file anywhere in the copy never runs (the copy is in
    the trust root; the check stands should anything else write there)."""
    target = prepare_harness_path(harness_pythonpath(tmp_path))
    window = target / "perfgate" / "harness" / "window.py"
    honest = window.read_bytes()
    window.write_bytes(honest + b"\nSTEP_TIME_SCALE = 0.5  # planted\n")
    (target / "perfgate" / "sitecustomize.py").write_text("print('planted')\n")
    assert prepare_harness_path(harness_pythonpath(tmp_path)) == target
    assert window.read_bytes() == honest and not (target / "perfgate" / "sitecustomize.py").exists()
    for planted in ("sitecustomize.py", "evil.pth", "usercustomize.py"):
        (target / planted).write_text("import os; os.system('touch /tmp/owned')\n")
        assert prepare_harness_path(harness_pythonpath(tmp_path)) == target
        assert not (target / planted).exists()
    entry = harness_entry(target)
    entry.write_text(entry.read_text() + "\nprint('planted')\n")
    prepare_harness_path(target)
    assert entry.read_text() == ENTRY_SOURCE


def test_calls_racing_to_replace_an_edited_copy_never_remove_the_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls find the copy edited at once: one replaces it, the other then finds it ready. Before, the
    second moved aside (and deleted) the fresh copy the first had just made for its command to import."""
    import threading

    from perfgate.benchmarking.windows import launch

    target = prepare_harness_path(harness_pythonpath(tmp_path))
    (target / "perfgate" / "sitecustomize.py").write_text("print('planted')\n")
    both_checked = threading.Barrier(2, timeout=2)
    first_in, first_done = threading.Event(), threading.Event()
    real = launch._copy_matches  # pyright: ignore[reportPrivateUsage]

    def copy_matches(
        t: Path, root: Path
    ) -> bool:  # both look before either replaces; the second goes on late
        first_in.set()
        found = real(t, root)
        with contextlib.suppress(threading.BrokenBarrierError):  # with the lock, the second waits there
            both_checked.wait()
        if threading.current_thread().name == "second":
            first_done.wait(10)
        return found

    monkeypatch.setattr(launch, "_copy_matches", copy_matches)
    fresh: list[int] = []

    def prepare(name: str) -> None:
        prepare_harness_path(target)
        if name == "first":
            fresh.append(
                os.open(target / "perfgate" / "__init__.py", os.O_RDONLY)
            )  # what its command imports
            first_done.set()

    threads = [threading.Thread(target=prepare, args=(n,), name=n) for n in ("first", "second")]
    threads[0].start()
    assert first_in.wait(10)  # the first call is checking (holding the lock, when there is one)
    threads[1].start()
    for t in threads:
        t.join(30)
    try:
        assert len(fresh) == 1 and os.fstat(fresh[0]).st_nlink == 1  # the first call's copy stayed in place
    finally:
        for fd in fresh:
            os.close(fd)
    assert not (target / "perfgate" / "sitecustomize.py").exists()
