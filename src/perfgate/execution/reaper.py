"""Find and stop everything a command started, including what left its process group.

A command runs in its own session and process group, but its descendants can leave that group
(``setsid``, ``setpgid``) or detach by double-forking. Three marks find them all the same:

- the **process group** the command leads;
- the **ancestry**: the server is made a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux), so a
  descendant whose parent exits is re-parented to the server, not to init, and stays in the tree;
- the **run tag**: every command gets ``PERFGATE_RUN_TAG=<random>`` in its environment, which its
  descendants inherit; after the server itself was killed (SIGKILL: no handler runs), the next start
  finds the tags of the runs it had listed in the trust root (`RunList`) and stops what carries them,
  and records that in the ledger.

Stopping sends SIGTERM to every member, waits the grace period, then SIGKILLs what is left, repeating
until nothing carries the marks (a process forking while being killed is caught on the next pass).
Limits (the threat model, docs/approvals.md): a descendant that clears its environment *and* leaves the
group while the server is not running escapes; cgroups would close that gap and are not used yet.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

__all__ = [
    "RUN_TAG_VAR",
    "RunHandle",
    "RunList",
    "become_subreaper",
    "members",
    "new_tag",
    "reap_zombies",
    "stop_blocking",
]

RUN_TAG_VAR = "PERFGATE_RUN_TAG"
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.02
_subreaper: bool | None = None
_SEEN: dict[str, set[int]] = {}
"""Run tag -> pids seen alive as its members: only those zombies are reaped here (never another
command's process, which its own runner waits for)."""


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux >= 3.4); True when it is."""
    global _subreaper
    if _subreaper is None:
        done = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                done = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                done = False
        _subreaper = done
        return done
    return _subreaper


def new_tag() -> str:
    return secrets.token_hex(12)


@dataclass(frozen=True)
class RunHandle:
    """One started command: its pid (= its process group id, it leads a new session) and its tag."""

    pid: int
    tag: str

    @property
    def pgid(self) -> int:
        return self.pid


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    state: str
    start: int


def _processes() -> dict[int, _Proc]:
    procs: dict[int, _Proc] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return procs
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) < 20:
            continue
        procs[int(name)] = _Proc(int(name), int(rest[1]), int(rest[2]), rest[0], int(rest[19]))
    return procs


def _has_tag(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read()
    except OSError:
        return False


def members(runs: Iterable[RunHandle], *, include_zombies: bool = False) -> set[int]:
    """Live processes of these runs: their group, their descendants, and whatever carries their tag."""
    runs = list(runs)
    if not runs:
        return set()
    if not Path("/proc/self/stat").exists():  # no /proc: the process groups are all that can be seen
        alive: set[int] = set()
        for run in runs:
            try:
                os.killpg(run.pgid, 0)
                alive.add(run.pgid)
            except OSError:
                continue
        return alive
    procs = _processes()
    me = os.getpid()
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    groups = {r.pgid for r in runs}
    needles = [f"{RUN_TAG_VAR}={r.tag}\0".encode() for r in runs]
    for p in procs.values():
        if p.pid == me:
            continue
        if p.pgrp in groups or any(_has_tag(p.pid, n) for n in needles):
            found.add(p.pid)
    stack = [r.pid for r in runs if r.pid in procs] + list(found)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, ()):
            if child not in found and child != me:
                found.add(child)
                stack.append(child)
    live = {pid for pid in found if procs.get(pid) is None or procs[pid].state not in ("Z", "X")}
    for run in runs:
        _SEEN.setdefault(run.tag, set()).update(p for p in live if p != run.pid)
    return found if include_zombies else live


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def reap_zombies(runs: Iterable[RunHandle], *, forget: bool = False) -> None:
    """Collect the exit status of these runs' descendants that died re-parented to this process.

    Only pids seen alive as members of the runs (never a command's own process: its runner waits for
    it). ``forget`` drops the runs' bookkeeping (when they are over).
    """
    runs = list(runs)
    seen: set[int] = set()
    for r in runs:
        seen |= _SEEN.get(r.tag, set())
    roots = {r.pid for r in runs}
    if seen:
        me = os.getpid()
        for p in _processes().values():
            if p.pid in seen and p.pid not in roots and p.ppid == me and p.state == "Z":
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p.pid, os.WNOHANG)
    if forget:
        for r in runs:
            _SEEN.pop(r.tag, None)


def stop_blocking(runs: Iterable[RunHandle], grace_s: float) -> list[int]:
    """TERM every member of ``runs``, wait up to ``grace_s``, KILL until none is left; returns who was hit."""
    runs = list(runs)
    hit: set[int] = set(members(runs))
    _signal_all(hit, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap_zombies(runs)
        if not members(runs):
            break
        time.sleep(_POLL_S)
    for _ in range(200):
        left = members(runs)
        if not left:
            break
        hit |= left
        _signal_all(left, signal.SIGKILL)
        reap_zombies(runs)
        time.sleep(_POLL_S)
    reap_zombies(runs)
    return sorted(hit)


def _start_time(pid: int) -> int | None:
    proc = _processes().get(pid) if Path(f"/proc/{pid}").exists() else None
    return proc.start if proc is not None else None


class RunList:
    """The commands a server has running, in the trust root, so the next start can stop leftovers.

    Entries are ``{"pid", "tag", "server_pid", "server_start"}``; a server's pid with its start time
    (clock ticks since boot) tells a live server from a dead one whose pid was reused.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = path.with_name(path.name + ".lock")

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        return (
            [cast("dict[str, Any]", e) for e in cast("list[Any]", data) if isinstance(e, dict)]
            if isinstance(data, list)
            else []
        )

    def _write(self, entries: list[dict[str, Any]]) -> None:
        from perfgate.security.trustroot import write_private

        write_private(self.path, (json.dumps(entries) + "\n").encode())

    @contextlib.contextmanager
    def _locked(self):  # type: ignore[no-untyped-def]  # a generator context manager
        from perfgate.helpers.filelock import held

        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with held(self._lock):
            yield

    def add(self, run: RunHandle) -> None:
        entry = {**asdict(run), "server_pid": os.getpid(), "server_start": _start_time(os.getpid())}
        with self._locked():
            self._write([*self._read(), entry])

    def discard(self, run: RunHandle) -> None:
        with self._locked():
            self._write([e for e in self._read() if e.get("tag") != run.tag])

    def stop_leftovers(self, grace_s: float = 2.0) -> list[dict[str, Any]]:
        """Stop what runs of dead servers left behind; returns one entry per run with the pids stopped."""
        with self._locked():
            entries = self._read()
            dead: list[dict[str, Any]] = []
            live: list[dict[str, Any]] = []
            for e in entries:
                server_pid = e.get("server_pid")
                alive = (
                    isinstance(server_pid, int)
                    and server_pid != os.getpid()
                    and (_start_time(server_pid) == e.get("server_start"))
                )
                (live if alive else dead).append(e)
            reports: list[dict[str, Any]] = []
            for e in dead:
                pid, tag = e.get("pid"), e.get("tag")
                if not isinstance(pid, int) or not isinstance(tag, str):
                    continue
                run = RunHandle(pid, tag)
                # Only the tag proves a process is ours after this long: the pid and group may be reused.
                tagged = [p for p in members([RunHandle(-1, tag)]) if p != os.getpid()]
                stopped = stop_blocking([RunHandle(-1, tag)], grace_s) if tagged else []
                reports.append(
                    {"pid": run.pid, "tag": tag, "server_pid": e.get("server_pid"), "stopped": stopped}
                )
            self._write(live)
        return reports
