"""Host load while a profile was captured: how much of the job's CPUs other processes took.

`HostLoadSampler` reads Linux ``/proc`` before and after the captured run, on the server that launches
it. Over that window:

- busy CPU time of the CPUs the job may run on (the server's affinity set; per-CPU lines of
  ``/proc/stat``: user + nice + system + irq + softirq + steal),
- the job's own CPU time: this process and every child it reaped (``os.times``); the launched command,
  its ranks and DataLoader workers are reaped before the run returns,
- other processes' CPU time = busy - job (never below 0), and the few that used most (``/proc/<pid>/stat``,
  their short command name only: argv can hold secrets).

The window is the whole launch (start-up included), not only the traced steps; a process the job left
behind unreaped counts as "other". Outside Linux, or where ``/proc`` cannot be read, the load is
``unknown`` with the reason, never zero. Traces analyzed without a capture carry ``unknown`` too.
"""

from __future__ import annotations

import os
import time

from perfgate.traces.models import HostLoad, OtherProcess

__all__ = ["BUSY_NEIGHBOUR_SHARE", "HostLoadSampler", "busy_neighbour", "unknown_host_load"]

_TOP_OTHERS = 3
BUSY_NEIGHBOUR_SHARE = 0.25
"""Other processes' share of the job's CPUs from which a timed window is flagged as distorted."""


def busy_neighbour(load: HostLoad) -> str | None:
    """A sentence when other processes took enough of the job's CPUs to distort a timing, else ``None``."""
    if not load.measured or (load.other_share or 0.0) < BUSY_NEIGHBOUR_SHARE:
        return None
    top = ", ".join(f"{o.name} (pid {o.pid}, {o.cpus:g} CPUs)" for o in load.top_other)
    return (
        f"busy neighbour: other processes used {load.other_cpus or 0:.2f} of {load.cpus} CPUs "
        f"({load.other_share or 0:.0%}) during the launch" + (f", most {top}" if top else "")
    )


def unknown_host_load(reason: str) -> HostLoad:
    return HostLoad(measured=False, unknown_reason=reason)


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _busy_ticks(cpus: list[int]) -> int | None:
    wanted = {f"cpu{c}" for c in cpus}
    total = 0
    seen = 0
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(" ")
                if name in wanted:
                    f = [int(x) for x in rest.split()]
                    # user nice system idle iowait irq softirq steal: busy excludes idle and iowait.
                    total += f[0] + f[1] + f[2] + sum(f[5:8])
                    seen += 1
    except (OSError, ValueError, IndexError):
        return None
    return total if seen == len(wanted) else None


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _process_ticks() -> dict[int, tuple[str, int, int]]:
    """pid -> (short name, parent pid, user + system ticks) for every readable process."""
    out: dict[int, tuple[str, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                raw = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid ... utime stime": comm may hold spaces and parentheses.
        lpar, rpar = raw.find("("), raw.rfind(")")
        if lpar < 0 or rpar < 0:
            continue
        rest = raw[rpar + 2 :].split()
        try:
            out[int(entry)] = (raw[lpar + 1 : rpar][:32], int(rest[1]), int(rest[11]) + int(rest[12]))
        except (ValueError, IndexError):
            continue
    return out


_SERVICE_MARKS = (b"perfgate\x00serve", b"perfgate.cli\x00serve", b"perfgate.execution.detached")


def _perfgate_service(pid: int) -> bool:
    """Whether ``pid`` is a perfgate server or a detached run's supervisor (its command line says so; read
    here, never kept: argv can hold secrets)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read(4096)
    except OSError:
        return False
    return any(mark in cmdline for mark in _SERVICE_MARKS) and b"perfgate.harness" not in cmdline


def _descendants(root: int, procs: dict[int, tuple[str, int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen = {root}
    todo = [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            if kid not in seen:
                seen.add(kid)
                todo.append(kid)
    return seen


class HostLoadSampler:
    """``start()`` before the launch, ``stop()`` after it returned (its processes reaped)."""

    def __init__(self) -> None:
        self._cpus = _affinity()
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._t0 = 0.0
        self._busy0: int | None = None
        self._own0 = 0.0
        self._procs0: dict[int, tuple[str, int, int]] = {}

    def start(self) -> None:
        self._busy0 = _busy_ticks(self._cpus)
        self._procs0 = _process_ticks() if self._busy0 is not None else {}
        self._own0 = _own_cpu_s()
        self._t0 = time.monotonic()

    def stop(self) -> HostLoad:
        wall = time.monotonic() - self._t0
        own = _own_cpu_s() - self._own0
        busy1 = _busy_ticks(self._cpus)
        if self._busy0 is None or busy1 is None:
            return unknown_host_load("/proc/stat is not readable here (not Linux?): host load not measured")
        if wall <= 0:
            return unknown_host_load("the capture window was empty")
        procs1 = _process_ticks()
        ours = _descendants(os.getpid(), self._procs0) | _descendants(os.getpid(), procs1)
        others: list[OtherProcess] = []
        service_s = 0.0
        for pid, (name, _, ticks1) in procs1.items():
            before = self._procs0.get(pid)
            if pid in ours or before is None or before[0] != name:
                continue
            used_s = (ticks1 - before[2]) / self._hz
            if _perfgate_service(pid):
                # the server that launched the job (from a detached supervisor), or another perfgate
                # server: its work serves the agent, it is no neighbour to report
                service_s += used_s
                continue
            if used_s / wall >= 0.05:
                others.append(OtherProcess(pid=pid, name=name, cpus=round(used_s / wall, 3)))
        others.sort(key=lambda o: -o.cpus)
        busy_s = (busy1 - self._busy0) / self._hz
        other_s = max(busy_s - own - service_s, 0.0)
        n = len(self._cpus)
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = None
        return HostLoad(
            measured=True,
            window_s=round(wall, 3),
            cpus=n,
            job_cpus=round(own / wall, 3),
            other_cpus=round(other_s / wall, 3),
            other_share=round(min(other_s / wall / n, 1.0), 4),
            load_avg_1m=load1,
            top_other=others[:_TOP_OTHERS],
        )
