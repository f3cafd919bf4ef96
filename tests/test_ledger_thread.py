"""The ledger thread (`run_in_ledger_thread`) keeps what ``anyio.to_thread.run_sync`` promised the append.

Each test breaks if the cheaper hand-off goes too far: a cancelled caller returning while its append still
runs, an error lost in the thread, a call queued behind a slow one, a forked child waiting on a thread it
does not have. Concurrent tool calls each committing one record in one chain: `tests/test_protocol.py`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import anyio
import pytest

from perfgate.evidence._writer import run_in_ledger_thread

pytestmark = pytest.mark.anyio


async def test_the_call_runs_in_the_ledger_thread_and_its_error_reaches_the_caller() -> None:
    assert await run_in_ledger_thread(lambda: threading.current_thread().name) == "perfgate-ledger"
    error = ValueError("evidence id 'x' already exists")

    def fail() -> None:
        raise error

    with pytest.raises(ValueError, match="already exists") as caught:
        await run_in_ledger_thread(fail)
    assert caught.value is error
    assert await run_in_ledger_thread(lambda a, b: a + b, 2, 3) == 5  # the thread serves on after an error


async def test_a_cancelled_caller_waits_for_the_call_to_finish_before_it_is_cancelled() -> None:
    """As run_sync (not abandoned on cancel): the append is never left running behind a caller that has
    already moved on (or answered)."""
    steps: list[str] = []
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        steps.append(f"done in {threading.current_thread().name}")

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_soon() -> None:
                await anyio.to_thread.run_sync(started.wait, 10.0)
                scope.cancel()

            tg.start_soon(cancel_soon)
            await run_in_ledger_thread(slow)
            steps.append("returned")
            await anyio.sleep(5)  # the next checkpoint delivers the cancellation
            steps.append("never")
    assert scope.cancelled_caught
    assert steps == ["done in perfgate-ledger", "returned"]


async def test_a_call_made_while_the_thread_is_busy_is_not_queued_behind_it() -> None:
    """The first call blocks until the second has run: queued behind it, the second never would."""
    second_ran = threading.Event()
    names: list[str] = []

    def first() -> bool:
        names.append(threading.current_thread().name)
        return second_ran.wait(20.0)

    def second() -> None:
        names.append(threading.current_thread().name)
        second_ran.set()

    async with anyio.create_task_group() as tg:
        results: list[bool] = []

        async def run_first() -> None:
            results.append(await run_in_ledger_thread(first))

        tg.start_soon(run_first)
        while not names:
            await anyio.sleep(0.005)
        await run_in_ledger_thread(second)
    assert results == [True]
    assert names[0] == "perfgate-ledger" and names[1] != "perfgate-ledger"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
async def test_a_forked_child_gets_a_ledger_thread_of_its_own() -> None:
    """Threads do not survive a fork: a child handing its append to the parent's (absent) thread would
    wait for ever."""
    assert await run_in_ledger_thread(os.getpid) == os.getpid()  # the parent's thread is running
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one call on a fresh event loop (in a new thread: the parent's loop was
        # running in this one), its answer through the pipe
        code = 1
        try:
            answer: list[int] = []
            runner = threading.Thread(
                target=lambda: answer.append(asyncio.run(run_in_ledger_thread(os.getpid))), daemon=True
            )
            runner.start()
            runner.join(20.0)
            os.write(write, str(answer[0] if answer else "hung").encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        deadline = time.monotonic() + 30.0
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's call never finished")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        assert os.read(read, 200).decode() == str(pid)  # ran in the child, not waiting for ever
    finally:
        os.close(read)
