"""Hang diagnosis: notice that a run stopped making progress, ask every rank where it is, say who disagrees.

**Progress** is a step boundary the server observed (:mod:`perfgate.execution.ticks`) or a byte of output
on either stream. **The rule** (`stall_limit_s`): with ``stall_s`` given, a run is stalled after
``stall_s`` seconds without progress, start-up included; without it, the watch arms once a step time has
been observed and allows ``max(STALL_FLOOR_S, STALL_STEP_FACTOR x the slowest step seen)``. Under that
default a stall ends the run only when every rank that answered waits inside a torch.distributed call
(none is working); otherwise (rank 0 writes a long checkpoint while the others wait in a barrier, an
evaluation that prints nothing) the stacks are kept as a warning and the allowance doubles.

**The capture** (`HangWatch.on_stall`): the harness announced each rank in ``<record_dir>/hang/``
(:mod:`perfgate.harness.stacks`). Each announced pid that belongs to the run and whose signal mask
shows the stack handler gets `STACK_SIGNAL`; where the flight recorder is on, its trigger FIFO gets a
byte. The server waits up to `CAPTURE_WAIT_S` for the dumps, reads them (capped at `MAX_DUMP_BYTES`)
and names each rank's collective and script line (:mod:`perfgate.execution.hang_read`). Then the
executor stops the run through its usual stop path (TERM, grace, KILL of every process of the run).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Set
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread
from pydantic import BaseModel, Field

from perfgate.execution.hang_read import FlightEntry, RankPlace, last_flight_entry, parse_stacks, place
from perfgate.execution.ticks import LaunchTicks
from perfgate.harness.stacks import HANG_DIR
from perfgate.security.quoting import file_text

__all__ = [
    "CAPTURE_WAIT_S",
    "MAX_DUMP_BYTES",
    "STALL_FLOOR_S",
    "STALL_STEP_FACTOR",
    "HangDiagnosis",
    "HangWatch",
    "RankHang",
    "diagnose",
    "ends_run",
    "stall_limit_s",
]

STALL_FLOOR_S = 60.0
"""Least time without progress the default rule calls a stall."""
STALL_STEP_FACTOR = 20.0
"""The default allowance in slowest observed steps."""
CAPTURE_WAIT_S = 5.0
"""How long the server waits for the ranks' dumps after signalling them."""
MAX_DUMP_BYTES = 256 * 1024
"""Bytes read of one rank's stack dump or flight-recorder dump."""
MAX_RANKS = 4096
"""Announcements read per run."""
_POLL_S = 0.05


def stall_limit_s(stall_s: float | None, slowest_step_s: float | None) -> tuple[float | None, str]:
    """Seconds without progress that make a stall, and the rule in words; None while the default rule is
    not armed (no step time observed yet)."""
    if stall_s is not None:
        return stall_s, f"stall_s={stall_s:g} s given with the call"
    if slowest_step_s is None:
        return None, "default rule not armed: no step time observed yet"
    limit = max(STALL_FLOOR_S, STALL_STEP_FACTOR * slowest_step_s)
    return limit, (
        f"default: max({STALL_FLOOR_S:g} s, {STALL_STEP_FACTOR:g} x slowest observed step "
        f"{slowest_step_s:.3f} s) = {limit:.1f} s"
    )


class RankHang(BaseModel):
    """Where one rank was when the run stalled."""

    rank: int
    pid: int | None = Field(description="Its process id on this machine, as the harness announced it.")
    state: Literal["in_collective", "elsewhere", "exited", "no_stack"] = Field(
        description="in_collective: its stack is inside a torch.distributed operation; elsewhere: it is "
        "not; exited: it was no longer running; no_stack: it did not answer (no stack handler, another "
        "machine, or it did not write within the capture wait)."
    )
    collective: str | None = Field(
        description="The torch.distributed operation it waits in (all_reduce, ...)."
    )
    call_site: str | None = Field(description="The innermost frame outside torch: the script line waiting.")
    flight_recorder_seq: int | None = Field(
        default=None, description="Sequence number of the last collective the flight recorder holds for it."
    )
    flight_recorder_op: str | None = Field(
        default=None, description="That collective's name (gloo:all_reduce, ...)."
    )
    last_step_boundary: int | None = Field(
        default=None, description="The last step boundary the server observed from it (n ends step n-1)."
    )
    stack_top: list[str] = Field(default_factory=list[str], description="Innermost frames, innermost first.")


class HangDiagnosis(BaseModel):
    """A run that stopped making progress: each rank's place and who disagrees."""

    rule: str = Field(description="The stall rule that fired, with its figures.")
    stall_s: float = Field(description="Seconds without progress that made the stall.")
    idle_s: float = Field(description="Seconds without progress when the stall was declared.")
    detected_after_s: float = Field(description="Seconds from the launch's start to the stall.")
    capture_ms: float = Field(description="Time taken to signal the ranks and read their dumps.")
    ended_run: bool = Field(description="The run was stopped for it (else kept as a warning).")
    ranks: list[RankHang]
    waiting_ranks: list[int] = Field(description="Ranks found inside a torch.distributed operation.")
    odd_ranks: list[int] = Field(
        description="Ranks whose place differs from the majority's (all ranks of a tie, none when they agree)."
    )
    collective: str | None = Field(description="The operation the waiting ranks are in (the most common).")
    summary: str
    stacks_artifact: str | None = Field(default=None, description="Artifact holding every rank's full dump.")


def _ranges(ranks: list[int]) -> str:
    """``0-3, 7`` for [0, 1, 2, 3, 7]."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def _where(r: RankHang) -> str:
    site = f" at {file_text(r.call_site)}" if r.call_site else ""
    seq = f" (collective #{r.flight_recorder_seq})" if r.flight_recorder_seq is not None else ""
    if r.state == "in_collective":
        return f"waits in {r.collective}{seq}{site}"
    if r.state == "elsewhere":
        return f"is in no collective{site}"
    return "had exited" if r.state == "exited" else "gave no stack"


def diagnose(ranks: list[RankHang]) -> tuple[list[int], list[int], str | None, str]:
    """(waiting ranks, odd ranks, their collective, a sentence) from each rank's place."""
    waiting = [r.rank for r in ranks if r.state == "in_collective"]
    ops = Counter(r.collective for r in ranks if r.state == "in_collective")
    collective = ops.most_common(1)[0][0] if ops else None
    if not ranks:
        return (
            [],
            [],
            None,
            "no rank announced a stack handler (no harness in this run, or it could not write)",
        )
    groups: dict[str, list[int]] = {}
    for r in ranks:
        groups.setdefault(_where(r), []).append(r.rank)
    steps = {r.rank: r.last_step_boundary for r in ranks if r.last_step_boundary is not None}
    at = ""
    if len(set(steps.values())) > 1:
        at = "; last step boundary seen: " + ", ".join(f"rank {k} {v}" for k, v in sorted(steps.items()))
    if len(groups) == 1:
        where = next(iter(groups))
        if waiting:
            return (
                waiting,
                [],
                collective,
                (
                    f"every rank {where}: they agree, so the wait is on something outside the run's ranks "
                    f"(a peer outside this launch, the network or the backend){at}"
                ),
            )
        return waiting, [], collective, f"every rank {where}: no rank waits for another{at}"
    sizes = sorted((len(v) for v in groups.values()), reverse=True)
    majority = max(groups, key=lambda k: len(groups[k])) if sizes[0] > sizes[1] else None
    odd = sorted(r for k, v in groups.items() if k != majority for r in v)
    parts = [
        f"rank{'s' if len(v) > 1 else ''} {_ranges(v)} {k}"
        for k, v in sorted(groups.items(), key=lambda kv: min(kv[1]))
    ]
    return waiting, odd, collective, "ranks disagree: " + "; ".join(parts) + at


def ends_run(stall_s: float | None, ranks: list[RankHang]) -> bool:
    """Whether a stall stops the run: always under a given ``stall_s``; under the default rule only when
    every rank that answered waits in a collective (none is working)."""
    answered = [r for r in ranks if r.state in ("in_collective", "elsewhere")]
    return stall_s is not None or (bool(answered) and all(r.state == "in_collective" for r in answered))


def _sig_caught(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (its SigCgt mask), so the signal cannot kill it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _read_capped(path: Path, offset: int = 0) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(MAX_DUMP_BYTES)
    except OSError:
        return b""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _announcements(folder: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for path in sorted(folder.glob("rank*.json"))[:MAX_RANKS]:
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            doc = json.loads(_read_capped(path))
            if isinstance(doc, dict) and isinstance(doc.get("rank"), int) and isinstance(doc.get("pid"), int):  # pyright: ignore[reportUnknownMemberType]
                out.append(doc)  # pyright: ignore[reportUnknownArgumentType]
    return out


class HangWatch:
    """Watches one launch for a stall and diagnoses it (the executor's ``watch``).

    ``ticks`` is the launch's tick listener's observation (None: no step boundaries reach the server),
    ``record_dir`` the folder the harness writes to (None: no harness, so no stacks).
    """

    def __init__(self, stall_s: float | None, record_dir: Path | None, ticks: LaunchTicks | None) -> None:
        self.stall_s = stall_s
        self.record_dir = record_dir
        self.ticks = ticks
        self.started_ns = time.monotonic_ns()
        self._since_ns = self.started_ns
        self._factor = 1.0
        self.diagnoses: list[HangDiagnosis] = []
        self.dumps: dict[int, str] = {}
        """rank -> the stack text it wrote (for the evidence)."""

    def dumps_text(self) -> str:
        """Every rank's stack dump, one after another, for the evidence."""
        return "".join(f"==== rank {r} ====\n{text}\n" for r, text in sorted(self.dumps.items()))

    @property
    def ended(self) -> HangDiagnosis | None:
        """The diagnosis the run was stopped for, if it was."""
        return next((d for d in self.diagnoses if d.ended_run), None)

    def _limit(self) -> tuple[float | None, str]:
        slowest = (
            self.ticks.slowest_step_ns / 1e9
            if self.ticks is not None and self.ticks.slowest_step_ns
            else None
        )
        limit, rule = stall_limit_s(self.stall_s, slowest)
        if limit is not None and self._factor > 1:
            return limit * self._factor, f"{rule}, x{self._factor:g} after a stall outside collectives"
        return limit, rule

    def _last_progress_ns(self, last_output_ns: int) -> int:
        tick = self.ticks.last_ns if self.ticks is not None else 0
        return max(self._since_ns, last_output_ns, tick)

    def due(self, last_output_ns: int, now_ns: int) -> bool:
        """No progress for longer than the rule allows."""
        limit, _ = self._limit()
        return limit is not None and now_ns - self._last_progress_ns(last_output_ns) > limit * 1e9

    async def on_stall(self, pids: Set[int], last_output_ns: int, now_ns: int) -> bool:
        """Capture every rank's place; True when the run is to be stopped for it."""
        limit, rule = self._limit()
        assert limit is not None
        t0 = time.monotonic()
        ranks = await self._capture(pids)
        waiting, odd, collective, sentence = diagnose(ranks)
        end = ends_run(self.stall_s, ranks)
        idle_s = (now_ns - self._last_progress_ns(last_output_ns)) / 1e9
        summary = f"no progress for {idle_s:.1f} s ({rule}): {sentence}"
        self.diagnoses.append(
            HangDiagnosis(
                rule=rule,
                stall_s=limit,
                idle_s=idle_s,
                detected_after_s=(now_ns - self.started_ns) / 1e9,
                capture_ms=(time.monotonic() - t0) * 1000,
                ended_run=end,
                ranks=ranks,
                waiting_ranks=waiting,
                odd_ranks=odd,
                collective=collective,
                summary=summary,
            )
        )
        if not end:
            self._factor *= 2
            self._since_ns = time.monotonic_ns()
        return end

    async def _capture(self, pids: Set[int]) -> list[RankHang]:
        if self.record_dir is None:
            return []
        folder = self.record_dir / HANG_DIR
        notes = await anyio.to_thread.run_sync(_announcements, folder)
        asked: dict[int, int] = {}  # rank -> stack file size before the signal
        triggered: set[int] = set()
        for note in notes:
            rank, pid, signum = int(note["rank"]), int(note["pid"]), int(note.get("signal") or 0)  # pyright: ignore[reportArgumentType]
            if pid not in pids:
                continue
            if note.get("stacks") and signum and _sig_caught(pid, signum):
                asked[rank] = _size(folder / f"rank{rank}.stacks.txt")
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)
            if note.get("flight_recorder"):
                (folder / f"rank{rank}.fr.json").unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    fd = os.open(folder / f"rank{rank}.fr-trigger", os.O_WRONLY | os.O_NONBLOCK)
                    try:
                        os.write(fd, b"1")
                        triggered.add(rank)
                    finally:
                        os.close(fd)
        await self._wait(folder, asked, triggered)
        return [self._rank(note, folder, asked, pids) for note in sorted(notes, key=lambda n: int(n["rank"]))]  # pyright: ignore[reportArgumentType]

    async def _wait(self, folder: Path, asked: dict[int, int], triggered: set[int]) -> None:
        """Until every asked rank's stack file grew and stopped growing, and every trigger was answered."""
        last: dict[int, int] = {}
        with anyio.move_on_after(CAPTURE_WAIT_S):
            while True:
                sizes = {r: _size(folder / f"rank{r}.stacks.txt") for r in asked}
                grown = all(sizes[r] > before for r, before in asked.items())
                settled = grown and sizes == last
                answered = all((folder / f"rank{r}.fr.json").exists() for r in triggered)
                if settled and answered:
                    return
                last = sizes
                await anyio.sleep(_POLL_S * 2)

    def _rank(self, note: dict[str, object], folder: Path, asked: dict[int, int], pids: Set[int]) -> RankHang:
        rank, pid = int(note["rank"]), int(note["pid"])  # pyright: ignore[reportArgumentType]
        boundary = None
        if self.ticks is not None:
            seen = self.ticks.stamps.get(rank)
            boundary = max(seen) if seen else None
        fr: FlightEntry | None = None
        if note.get("flight_recorder"):
            fr = last_flight_entry(_read_capped(folder / f"rank{rank}.fr.json"))
        where: RankPlace | None = None
        if rank in asked:
            text = _read_capped(folder / f"rank{rank}.stacks.txt", asked[rank]).decode(
                "utf-8", errors="replace"
            )
            self.dumps[rank] = text
            where = place(parse_stacks(text))
        if where is None:
            state = "exited" if pid not in pids else "no_stack"
        else:
            state = "in_collective" if where.collective else "elsewhere"
        return RankHang(
            rank=rank,
            pid=pid,
            state=state,
            collective=where.collective if where else None,
            call_site=where.call_site if where else None,
            flight_recorder_seq=fr.seq if fr else None,
            flight_recorder_op=fr.op if fr else None,
            last_step_boundary=boundary,
            stack_top=list(where.stack_top) if where else [],
        )
