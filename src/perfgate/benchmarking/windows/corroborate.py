"""Check what a launch's harness records say against what the server observed of the launch itself.

The harness times steps from inside the training process, where the code under test can rebind its
clock or skip work only while it is measured. Two checks keep such figures from supporting a keep:

1. **Clock.** Every step boundary reached the server as it happened and was stamped there
   (:mod:`perfgate.execution.ticks`). For each rank, the span the record reports from its first to its
   last observed boundary, and each window's elapsed time, must match the server's stamps of the same
   boundaries within ``ABS_SLACK_NS + REL_SLACK x span``. A stamp is never earlier than its boundary but
   may be later (the stamping thread waited for a core, or read several boundaries at once), so each edge
   is read through the smallest lag (stamp minus record time) among the boundaries within ``LATE_REACH`` of
   it: a late read is not a bent clock, and a bent clock moves every lag. The slack covers what remains;
   a clock bent by more than 5 % shows on any window longer than ~0.5 s. A boundary observed
   twice, or a record that ends after the last observed boundary with most of its steps never seen, is
   tampering or a lost channel: the timing is not corroborated.
2. **Consistency.** The harness keeps timing steps after the last window (guard steps) and times the
   warm-up. Work that the script skips only while it is measured makes its windows faster than the steady
   steps on *both* sides of them: the pace drops as a window opens and comes back as it closes. So each
   side (the warm-up tail, the guard steps) is compared with the windows on its own: it is "slower beyond
   noise" when its median step exceeds the windows' median by more than ``max(CONSISTENCY_MARGIN,
   3 x IQR/median)`` (the larger spread of the two) and exceeds nearly every measured step (the windows'
   90th percentile: a slow kind of step that also occurs inside the windows, a periodic checkpoint or a
   loader stall, is not skipped while measured). Both sides slower beyond noise is
   ``measurement_dependent`` (no keep). One side only (a warm-up transient such as DataLoader workers
   starting, a burst of other load, a save at the end), or a script that ended with its window so only its
   warm-up can be compared, is ``noisy``: it blocks nothing, and ``next`` names the run that settles it.

A launch without observations (a Slurm launch, whose boundaries do not reach this machine as they happen,
or an older record) is ``unobserved``: its figures stand on the harness's word, and the answer says so.

A log-timed launch (`corroborate_log`) is held to the same two checks. Its clock is the time that passed
between its step lines on the server's clock (`perfgate.execution.linestamps`): the steps a window's lines
report must add up to the time between the line before the window and the window's last line, within
``LOG_ABS_SLACK_NS + LOG_REL_SLACK x span``. The wider bound covers the stamping on the server's event loop
and the printing itself; a log whose step times leave out part of each iteration (a timer around the
forward and backward only) is not corroborated either: its figures do not say how fast the job runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from perfgate.benchmarking.reading.records import RankRecord
from perfgate.execution.linestamps import OutputStamps
from perfgate.execution.ticks import LaunchTicks

__all__ = [
    "ABS_SLACK_NS",
    "CONSISTENCY_MARGIN",
    "LOG_ABS_SLACK_NS",
    "LOG_REL_SLACK",
    "REL_SLACK",
    "TimingCheck",
    "corroborate_launch",
    "corroborate_log",
]

ABS_SLACK_NS = 25_000_000
"""Disagreement always allowed between a record and the server's stamps: a stamping thread that waits for
the interpreter lock or a core on a busy 2-core host (observed up to ~10 ms), with margin."""
REL_SLACK = 0.05
"""Disagreement allowed in proportion to the span compared."""
CONSISTENCY_MARGIN = 0.25
"""Windows at most this much faster than the steady steps on one side of them (median), or 3x the spread."""
MIN_NEIGHBOURS = 3
"""Steady steps around the windows (both sides together) the fewest that a comparison rests on."""
MIN_SIDE = 2
"""Steps on one side of the windows (warm-up tail or guard steps) for that side to be compared."""
SLOW_QUANTILE = 0.9
"""A side counts as slower only when its median step exceeds this quantile of the measured steps."""
LATE_REACH = 2
"""Boundaries on each side of an edge whose stamps may stand for it when its own stamp arrived late."""
TAIL_ABS_NS = 1_500_000_000
"""Time allowed after the last step boundary of a launch the harness stopped there (it writes its record and
the interpreter exits): a busy 2-core host's teardown of a torch process, with margin."""
TAIL_REL = 0.5
"""... plus this share of the observed span of steps."""
MIN_COVERAGE = 0.9
"""Share of a rank's boundaries that must have been observed for its timing to count as corroborated."""

LOG_ABS_SLACK_NS = 50_000_000
"""`ABS_SLACK_NS` for log lines, stamped as the server's event loop reads them (not a dedicated thread)."""
LOG_REL_SLACK = 0.10
"""`REL_SLACK` for log lines: the time between two step lines holds the printing and logging too."""

Status = Literal["corroborated", "untrusted", "unobserved"]
Consistency = Literal["consistent", "noisy", "measurement_dependent", "unverified"]


class TimingCheck(BaseModel):
    """One launch's harness figures checked against the server's own observation of the launch."""

    launch: int = Field(description="Launch index within the run.")
    status: Status = Field(
        description="corroborated: every rank's reported times match the server's stamps of the same step "
        "boundaries (for timing='log', the step times printed match the time between the lines as they "
        "arrived); untrusted: they disagree beyond the bound, a boundary arrived twice, or most were never "
        "seen (no keep can rest on this launch); unobserved: no stamps (Slurm launch), the harness's word only."
    )
    consistency: Consistency = Field(
        description="consistent: the measured windows' median step matches the steady steps around them "
        "(warm-up tail and guard steps after the last window); noisy: the steps on one side of the windows "
        "were slower (a warm-up transient, other load, periodic saves or loader stalls) or only the warm-up "
        "could be compared; this blocks no keep, and `next` says what settles it; measurement_dependent: the "
        "steps on both sides are slower than the windows beyond noise and than nearly every measured step "
        "(work done differently while measured: no keep); unverified: too few neighbouring steps to tell."
    )
    reasons: list[str] = Field(default_factory=list[str], description="Why, for each finding.")
    next: str | None = Field(
        default=None, description="The run that settles a noisy or unverified consistency (None otherwise)."
    )
    launch_duration_ms: float | None = Field(
        default=None, description="The launch's wall time as the server measured it (start to exit)."
    )
    server_span_ms: float | None = Field(
        default=None, description="First to last observed step boundary on the server's clock (slowest rank)."
    )
    reported_span_ms: float | None = Field(
        default=None, description="The same boundaries' span as the harness record reports it."
    )
    clock_ratio: float | None = Field(
        default=None, description="server_span_ms / reported_span_ms: 1.0 when the record's clock is true."
    )
    boundaries_observed: int = Field(
        default=0, description="Step boundaries stamped by the server, all ranks (timing='log': step lines)."
    )
    boundaries_reported: int = Field(
        default=0,
        description="Step boundaries the records report, all ranks (timing='log': step lines the log holds).",
    )
    neighbour_ratio: float | None = Field(
        default=None,
        description="Median neighbouring steady step / median measured step (slowest rank); above 1 means the "
        "windows ran faster than the steps around them.",
    )
    head_ms: float | None = Field(default=None, description="Launch start to the first observed boundary.")
    tail_ms: float | None = Field(default=None, description="Last observed boundary to the launch's end.")

    @property
    def blocks_keep(self) -> bool:
        return self.status == "untrusted" or self.consistency == "measurement_dependent"


def _bound(span_ns: int) -> float:
    return ABS_SLACK_NS + REL_SLACK * span_ns


def _boundary_times(record: RankRecord) -> dict[int, int]:
    """Boundary -> the record's time of it (ns from the record's origin): boundary b ends step b - 1."""
    steps = record.steps
    times = {b + 1: end for b, end in enumerate(steps.end_ns)}
    if steps.start_ns:
        times[0] = steps.start_ns[0]
    return times


def _clock(record: RankRecord, stamps: dict[int, int], reasons: list[str]) -> tuple[bool, int, int]:
    """Check one rank; returns (agrees, server span, reported span) over its observed boundaries."""
    reported = _boundary_times(record)
    common = sorted(b for b in stamps if b in reported)
    if len(common) < 2:
        reasons.append(
            f"rank {record.rank}: {len(common)} of {len(reported)} step boundaries reached the server"
        )
        return False, 0, 0
    ok = True
    if len(common) < MIN_COVERAGE * (len(reported) - 1):  # boundary 0 is not always sent (backdated start)
        reasons.append(
            f"rank {record.rank}: only {len(common)} of {len(reported)} step boundaries reached the server "
            "(the channel was closed or flooded from inside the process)"
        )
        ok = False
    first, last = common[0], common[-1]
    at = {b: i for i, b in enumerate(common)}

    def lag(b: int) -> int:
        # a stamp is never earlier than the boundary it stamps, but may be later: the stamping thread waited
        # for a core on a busy host, or read several boundaries at once. The smallest lag among the nearby
        # boundaries is the closest to the record's true offset; a bent clock moves every one of them.
        near = common[max(0, at[b] - LATE_REACH) : at[b] + LATE_REACH + 1]
        return min(stamps[k] - reported[k] for k in near)

    server = stamps[last] - stamps[first]
    said = reported[last] - reported[first]
    if abs(lag(last) - lag(first)) > _bound(max(server, said)):
        reasons.append(
            f"rank {record.rank}: steps {first}-{last} took {server / 1e6:.1f} ms on the server's clock but "
            f"{said / 1e6:.1f} ms by the record (x{server / max(said, 1):.2f}): the process's clock or its "
            "step boundaries were bent"
        )
        ok = False
    for w in record.windows:
        a, b = w.first_step, w.last_step + 1
        if a in at and b in at:
            seen = stamps[b] - stamps[a]
            # the server's span of the window, its late edges read from their prompt neighbours
            prompt = reported[b] - reported[a] + lag(b) - lag(a)
            if abs(prompt - w.elapsed_ns) > _bound(max(seen, w.elapsed_ns)):
                reasons.append(
                    f"rank {record.rank}: window {w.index} took {seen / 1e6:.1f} ms on the server's clock but "
                    f"{w.elapsed_ns / 1e6:.1f} ms by the record"
                )
                ok = False
        else:
            reasons.append(f"rank {record.rank}: window {w.index}'s edges never reached the server")
            ok = False
    return ok, server, said


class _Sides(NamedTuple):
    """One series' windows against the steady steps on each side of them."""

    verdict: Consistency
    ratio: float | None
    """The larger of (side's median step / measured median step) over the sides compared."""
    reason: str | None
    next: str | None


def _judge(times: Sequence[float], windows: Sequence[tuple[int, int]]) -> _Sides:
    """Compare one series of step times with its windows (first and last step, inclusive) on each side: the
    second half of the warm-up (its start holds compilation and caches) and every guard step after the last
    window. Either side's spread widens what counts as "beyond noise" (load on a busy host lands on some
    steps, not others)."""
    measured: list[float] = []
    for a, b in windows:
        measured.extend(times[a : b + 1])
    if not measured:
        return _Sides("unverified", None, None, None)
    first = min(a for a, _ in windows)
    last = max(b for _, b in windows)
    sides = {"warm-up tail": list(times[first // 2 : first]), "guard steps": list(times[last + 1 :])}
    mid = statistics.median(measured)
    compared = {name: steps for name, steps in sides.items() if len(steps) >= MIN_SIDE}
    if mid <= 0 or sum(len(s) for s in compared.values()) < MIN_NEIGHBOURS:
        return _Sides(
            "unverified",
            None,
            "too few steady steps around the windows to compare them with",
            "run more steps: the harness times guard steps after the last window when the script goes on",
        )
    top = _quantile(measured, SLOW_QUANTILE)
    ratios = {name: statistics.median(steps) / mid for name, steps in compared.items()}
    slower = [
        name
        for name, steps in compared.items()
        if ratios[name] > 1 + max(CONSISTENCY_MARGIN, 3 * max(_spread(measured), _spread(steps)))
        and statistics.median(steps) > top
    ]
    ratio = max(ratios.values())
    if len(slower) == len(sides):
        return _Sides(
            "measurement_dependent",
            ratio,
            f"the measured windows' median step is {ratio:.2f}x faster than the steady steps around them, on "
            "both sides (warm-up tail and guard steps): the script works differently while it is measured",
            None,
        )
    if not slower:
        return _Sides("consistent", ratio, None, None)
    (side,) = slower
    if len(compared) < len(sides):
        why = (
            f"the {side} ran {ratios[side]:.2f}x slower than the measured windows, and the script ended with its "
            "last window, so no steady steps after the windows could be compared (a warm-up transient such as "
            "loader workers starting, or other load)"
        )
        settle = (
            "to settle it, give the script more steps than warm-up + windows (the harness times a quarter of a "
            "window of guard steps after the last one), or measure longer windows"
        )
    else:
        other = next(n for n in compared if n != side)
        why = (
            f"the {side} ran {ratios[side]:.2f}x slower than the measured windows but the {other} ran like them "
            "(a warm-up transient, a burst of other load, or periodic work such as a save or a loader stall)"
        )
        settle = (
            "to settle it, measure longer windows or more repeats, interleaved with the baseline "
            "(compare_benchmarks suggests the order)"
        )
    return _Sides("noisy", ratio, why, settle)


def _quantile(times: Sequence[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spread(times: Sequence[float]) -> float:
    """IQR / median of step times (0 with fewer than 4)."""
    if len(times) < 4:
        return 0.0
    q = statistics.quantiles(times, n=4)
    return (q[2] - q[0]) / q[1] if q[1] > 0 else 0.0


def _unaccounted_tail(records: Sequence[RankRecord], ticks: LaunchTicks) -> str | None:
    """Why the launch's time after its last boundary is more than a stopped process's exit; None when it is
    not. The harness stops a launch at the first work after its last window (``window_complete``), so what
    follows the last boundary the record holds is writing the record and exiting: time there that no step
    accounts for is steps whose boundaries were sent early (a thread writing the channel faster than the steps
    ran). Lines for boundaries the record never reached are forged outright. Judged for optimizer-timed
    launches, which the harness always stops (an explicit window may be told not to)."""
    if not records or any(r.stop_reason != "window_complete" or r.timing != "optimizer" for r in records):
        return None
    last_ns = 0
    beyond = 0
    for r in records:
        reported = _boundary_times(r)
        stamps = ticks.stamps.get(r.rank, {})
        seen = [t for b, t in stamps.items() if b in reported]
        last_ns = max(last_ns, *seen) if seen else last_ns
        beyond += sum(1 for b in stamps if b > max(reported, default=0) + 1)
    if beyond:
        return (
            f"{beyond} boundary line(s) arrived for steps the record never reached: something in the process "
            "wrote the server's channel"
        )
    if last_ns == 0:
        return None
    first_ns = min((t for st in ticks.stamps.values() for t in st.values()), default=last_ns)
    span_ns, tail_ns = last_ns - first_ns, ticks.ended_ns - last_ns
    if tail_ns <= TAIL_ABS_NS + TAIL_REL * span_ns:
        return None
    claimed = max(sum(r.steps.step_time_ns) for r in records)
    return (
        f"the launch took {ticks.duration_ns / 1e9:.2f} s exec to exit: {(first_ns - ticks.started_ns) / 1e9:.2f} s "
        f"before its first step boundary, {claimed / 1e9:.2f} s of steps the record claims, and "
        f"{tail_ns / 1e9:.2f} s after its last boundary, where the harness had stopped the script: that time is "
        "work no step accounts for (boundaries sent before the steps ran)"
    )


def corroborate_launch(
    launch: int, records: Sequence[RankRecord], ticks: LaunchTicks | None, *, job: bool = False
) -> TimingCheck:
    """Check one launch's records against the server's observation of it (``None``: nothing observed);
    ``job``: the launch ran to its own end (its tail is the script's, not a stopped process's exit)."""
    check = TimingCheck(launch=launch, status="unobserved", consistency="unverified")
    reasons = check.reasons
    check.boundaries_reported = sum(r.steps.count + 1 for r in records)
    # consistency first: it needs no observation
    worst: float | None = None
    for r in records:
        sides = _judge(r.steps.step_time_ns, [(w.first_step, w.last_step) for w in r.windows])
        if sides.ratio is not None:
            worst = sides.ratio if worst is None else max(worst, sides.ratio)
        _merge(check, sides, f"rank {r.rank}: ")
    check.neighbour_ratio = None if worst is None else round(worst, 4)
    if ticks is None:
        return check
    check.launch_duration_ms = ticks.duration_ns / 1e6
    check.boundaries_observed = sum(len(s) for s in ticks.stamps.values())
    ok = True
    if ticks.duplicates or ticks.dropped:
        reasons.append(
            f"{ticks.duplicates} step boundaries arrived twice and {ticks.dropped} lines were not boundaries: something "
            "in the process wrote to the server's channel"
        )
        ok = False
    spans: list[tuple[int, int]] = []
    for r in records:
        agrees, server, said = _clock(r, ticks.stamps.get(r.rank, {}), reasons)
        ok = ok and agrees
        spans.append((server, said))
    all_stamps = [t for s in ticks.stamps.values() for t in s.values()]
    if all_stamps:
        check.head_ms = (min(all_stamps) - ticks.started_ns) / 1e6
        check.tail_ms = (ticks.ended_ns - max(all_stamps)) / 1e6
    server, said = max(spans, default=(0, 0))
    if not job and (tail := _unaccounted_tail(records, ticks)) is not None:
        reasons.append(tail)
        ok = False
    if said > 0:
        check.server_span_ms = server / 1e6
        check.reported_span_ms = said / 1e6
        check.clock_ratio = round(server / said, 4)
    check.status = "corroborated" if ok and records else "untrusted"
    return check


def corroborate_log(
    launch: int,
    entries: Sequence[tuple[int, float, int]],
    windows: Sequence[tuple[int, int]],
    stamps: OutputStamps | None,
) -> TimingCheck:
    """Check a log-timed launch: its step lines (``(step, step_time_ms, end offset in the log)``, as
    `perfgate.benchmarking.reading.logparse.parse_placed_log` gives them), the windows read from them (first and last
    step of each), against the server's stamps of the log's arrival (``None``: not stamped)."""
    check = TimingCheck(launch=launch, status="unobserved", consistency="unverified")
    reasons = check.reasons
    check.boundaries_reported = len(entries)
    index = {step: i for i, (step, _, _) in enumerate(entries)}
    spans = [(index[a], index[b]) for a, b in windows if a in index and b in index]
    _log_consistency(check, entries, spans)
    if stamps is None:
        return check
    check.launch_duration_ms = max(0, stamps.ended_ns - stamps.started_ns) / 1e6
    arrivals = [stamps.arrival(end) for _, _, end in entries]
    seen = [t for t in arrivals if t is not None]
    check.boundaries_observed = len(seen)
    if seen:
        check.head_ms = (seen[0] - stamps.started_ns) / 1e6
        check.tail_ms = (stamps.ended_ns - seen[-1]) / 1e6
    ok = bool(spans)
    server_total = said_total = 0.0
    for w, (i, j) in enumerate(spans):
        start = max(0, i - 1)
        said = sum((entries[k][0] - entries[k - 1][0]) * entries[k][1] for k in range(start + 1, j + 1)) * 1e6
        t0, t1 = arrivals[start], arrivals[j]
        if t0 is None or t1 is None or start == j:
            reasons.append(f"window {w}: its step lines never reached the server as they were printed")
            ok = False
            continue
        server = t1 - t0
        server_total += server
        said_total += said
        if abs(server - said) <= LOG_ABS_SLACK_NS + LOG_REL_SLACK * max(server, said):
            continue
        ok = False
        first, last = entries[start][0], entries[j][0]
        if server < said:
            bursts = len(set(arrivals[start : j + 1]))
            reasons.append(
                f"window {w}: the lines of steps {first}-{last} arrived within {server / 1e6:.1f} ms "
                f"({bursts} read(s)) but report {said / 1e6:.1f} ms: the output reached the server in bursts "
                "(print each step line with flush=True; perfgate sets PYTHONUNBUFFERED for Python) or the times "
                "are inflated"
            )
        else:
            reasons.append(
                f"window {w}: steps {first}-{last} took {server / 1e6:.1f} ms on the server's clock between "
                f"their lines but {said / 1e6:.1f} ms by the log (x{server / max(said, 1):.2f}): the printed "
                "times leave out part of each step or were bent; log a time that covers the whole iteration, or "
                "use timing='harness'"
            )
    if said_total > 0:
        check.server_span_ms = server_total / 1e6
        check.reported_span_ms = said_total / 1e6
        check.clock_ratio = round(server_total / said_total, 4)
    if stamps.dropped:
        reasons.append(f"{stamps.dropped} reads of the log were not stamped (more than the server keeps)")
    check.status = "corroborated" if ok else "untrusted"
    return check


_RANK: dict[Consistency, int] = {"unverified": 0, "consistent": 1, "noisy": 2, "measurement_dependent": 3}


def _merge(check: TimingCheck, sides: _Sides, prefix: str = "") -> None:
    """Fold one series' verdict into the launch's: the worst rank decides, its reason and next kept."""
    if sides.reason is not None and (sides.verdict != "unverified" or check.consistency == "unverified"):
        check.reasons.append(prefix + sides.reason)
    if _RANK[sides.verdict] > _RANK[check.consistency] or (
        sides.verdict == "unverified" and check.consistency == "unverified"
    ):
        check.consistency = sides.verdict
        check.next = sides.next


def _log_consistency(
    check: TimingCheck, entries: Sequence[tuple[int, float, int]], spans: Sequence[tuple[int, int]]
) -> None:
    """The log's windows against the steady steps around them (`corroborate_launch`'s second check): one
    time per step, a line standing for the steps since the previous one."""
    times: list[float] = []
    starts: list[int] = []
    prev = None
    for step, ms, _ in entries:
        starts.append(len(times))
        times.extend([ms] * (1 if prev is None else max(1, step - prev)))
        prev = step
    steps = [(starts[i], starts[j + 1] - 1 if j + 1 < len(starts) else len(times) - 1) for i, j in spans]
    sides = _judge(times, steps)
    if sides.ratio is not None:
        check.neighbour_ratio = round(sides.ratio, 4)
    _merge(check, sides, "in the log, ")
