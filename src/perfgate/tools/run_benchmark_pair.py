"""run_benchmark_pair: baseline and candidate launched in turn under one approval, stopped when the verdict
is settled, and compared in the same call.

The A/B an agent used to assemble by hand (a window call per side, the baseline again after the candidate,
then compare_benchmarks; three approvals and as many minutes of waiting) is one call here: the two sides'
launches alternate A B B A A B ..., each pair's log ratio of launch medians feeds a sequential test that
spends the confidence across its looks (`perfgate.benchmarking.comparing.sequential`), and the run stops at the
first look that settles or at the launch budget. What it leaves in the ledger is what those calls would
have left: a run_benchmark_window record per side (its launches, artifacts, provenance and timing checks,
written by that tool's own code) and a compare_benchmarks record over them, so record_decision keeps or
refuses exactly as it would on the separate calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perfgate.benchmarking.comparing.sequential import MIN_PAIRS, Look, look
from perfgate.benchmarking.comparing.verdict import DEFAULT_MIN_EFFECT
from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.records import load_records
from perfgate.benchmarking.windows.collect import harness_windows, log_windows
from perfgate.benchmarking.windows.window_launch import record_dir
from perfgate.benchmarking.windows.window_run import Launched
from perfgate.benchmarking.workload.provenance import RunProvenance
from perfgate.benchmarking.workload.vocabulary import vocabulary_name
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.execution.codeswap import SWAP_DIR, CodeSwap, SwapRefusedError, plan_swap, recover, recovered
from perfgate.execution.request import CodeRef, CommandRequest
from perfgate.execution.rundir import one_run
from perfgate.helpers.cpus import usable_cpus
from perfgate.helpers.statefs import fresh_dir, remove_tree
from perfgate.security.scrubber import Scrubber
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec
from perfgate.tools import compare_benchmarks, run_benchmark_window
from perfgate.tools.run_benchmark_window_models import BenchmarkContract, RunBenchmarkWindowInput

__all__ = ["SPEC", "PairCandidate", "RunBenchmarkPairInput", "RunBenchmarkPairOutput", "run"]

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Pinned on both sides to the cores the server may use, unless a side sets one (threads are the change)."""


class PairCandidate(BaseModel):
    """How the candidate differs from the baseline; what it leaves out is the baseline's."""

    model_config = ConfigDict(extra="forbid")

    command: Annotated[
        list[str] | None, Field(min_length=1, description="The candidate's argv; default: the baseline's.")
    ] = None
    env: Annotated[
        dict[str, str] | None,
        Field(
            description="The candidate's environment variables (the whole set, not added to the baseline's)."
        ),
    ] = None
    contract: Annotated[
        BenchmarkContract | None,
        Field(
            description="The candidate's contract where its execution settings differ; default: the baseline's."
        ),
    ] = None
    label: Annotated[str, Field(description="The candidate side's label ({label} in capture paths).")] = (
        "candidate"
    )


class RunBenchmarkPairInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline_ref: Annotated[
        str | None,
        Field(
            max_length=200,
            description="One command at two code states: the baseline runs the code of this git ref (HEAD, a "
            "branch, a commit), the candidate the working tree. The server writes the ref's bytes over the "
            "files that differ before each baseline launch and puts the working tree's back after it (saved "
            "outside the workspace first; nothing is checked out). The candidate may change its command, env "
            "or contract as well.",
        ),
    ] = None

    baseline: Annotated[
        RunBenchmarkWindowInput,
        Field(
            description="The baseline, as run_benchmark_window takes it (command, env, warm-up, measured steps, "
            "contract, capture, ...); `repeats` is ignored (max_launches bounds the launches), detach, "
            "same_process and resume_of are not available here. Its label defaults to 'baseline'."
        ),
    ]
    candidate: Annotated[
        PairCandidate,
        Field(
            description="What the candidate changes: its command, env or contract; the rest is the baseline's "
            "(left out with baseline_ref: the same command on the working tree)."
        ),
    ] = Field(default_factory=PairCandidate)
    declared_changes: Annotated[
        list[str],
        Field(
            description="As compare_benchmarks takes them: the contract execution settings the candidate changed "
            "on purpose, and 'env:NAME' for a changed variable ('code' is added with baseline_ref)."
        ),
    ] = Field(default_factory=list[str])
    max_launches: Annotated[
        int,
        Field(
            ge=MIN_PAIRS,
            le=20,
            description="Launches per side at most (the budget, shown in the approval); the run stops at the "
            "first look that settles, which a large change reaches at 3 a side.",
        ),
    ] = 8
    confidence: Annotated[
        float,
        Field(
            ge=0.8,
            le=0.995,
            description="Chance that a settled verdict is not a false one, spent across the looks.",
        ),
    ] = 0.95
    min_effect: Annotated[
        float, Field(ge=0, le=0.5, description="Smallest relative change that settles as improved/regressed.")
    ] = DEFAULT_MIN_EFFECT
    per_device: Annotated[bool, Field(description="As compare_benchmarks' per_device.")] = False
    pin_threads: Annotated[
        bool,
        Field(
            description="Set OMP_NUM_THREADS and MKL_NUM_THREADS to the cores the server may use on both sides "
            "(shown in the approval), unless a side sets either: a run that sizes its pools by itself on a "
            "busy host is the commonest cause of within_noise."
        ),
    ] = True
    reason: Annotated[
        str, Field(max_length=2000, description="Why this A/B is needed (shown to the approver).")
    ] = ""

    @field_validator("declared_changes")
    @classmethod
    def _canonical(cls, declared: list[str]) -> list[str]:
        return [f"env:{d[4:]}" if d.lower().startswith("env:") else vocabulary_name(d) for d in declared]

    @model_validator(mode="after")
    def _runs_here(self) -> RunBenchmarkPairInput:
        b = self.baseline
        if b.detach or b.same_process or b.resume_of is not None or b.launcher != "local":
            raise ValueError(
                "a paired run launches each side here, one launch at a time: leave detach, same_process, "
                "resume_of and launcher='slurm' out (run_benchmark_window has them)"
            )
        c = self.candidate
        if c.command is None and c.env is None and c.contract is None and self.baseline_ref is None:
            raise ValueError(
                "the candidate changes nothing: give baseline_ref (the code edited since a commit) or the "
                "candidate's command, env or contract"
            )
        return self


class PairLook(BaseModel):
    pairs: int
    speedup: float = Field(
        description="exp(mean log ratio of the pairs' median steps), baseline / candidate."
    )
    low: float
    high: float
    level: float = Field(
        description="This look's two-sided confidence (the stated one spent across the looks)."
    )
    settled: Literal["improved", "regressed"] | None


class RunBenchmarkPairOutput(BaseModel):
    evidence_id: str
    state: EvidenceState = Field(
        description="passed: the comparison is decisive; executed: compared, not decisive; failed: a launch "
        "failed (nothing compared)."
    )
    verdict: compare_benchmarks.Verdict | None = Field(
        description="compare_benchmarks' verdict over the windows the run measured (its record: comparison_id)."
    )
    settled: bool = Field(description="The sequential test settled before the budget ran out.")
    stopped: Literal["settled", "budget", "failure"]
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    comparison_id: str | None = Field(description="The compare_benchmarks record: a keep's 'comparison'.")
    baseline_id: str = Field(description="The baseline's run_benchmark_window record.")
    candidate_id: str = Field(description="The candidate's run_benchmark_window record.")
    launches: int = Field(description="Launches per side.")
    order: str = Field(description="The launches in time, A baseline and B candidate (ABBAAB...).")
    looks: list[PairLook]
    pinned: dict[str, str] = Field(description="Thread variables the run set on both sides.")
    baseline_median_ms: list[float] = Field(description="Each baseline launch's median step, in order.")
    candidate_median_ms: list[float]
    baseline_tensor_dumps: list[str] = Field(description="Paths of the baseline's captured tensor files.")
    candidate_tensor_dumps: list[str]
    method: str
    failure_reason: str | None = None
    warnings: list[str] = Field(default_factory=list[str])
    next: str = Field(description="The call that uses this evidence.")


# --------------------------------------------------------------------------- the two sides


def _pinned(inp: RunBenchmarkPairInput) -> dict[str, str]:
    """The thread variables to set on both sides: none when a side sets one or pinning is off."""
    envs = [inp.baseline.env, inp.candidate.env or {}]
    if not inp.pin_threads or any(v in env for env in envs for v in THREAD_VARIABLES):
        return {}
    return dict.fromkeys(THREAD_VARIABLES, str(usable_cpus()))


def sides(inp: RunBenchmarkPairInput, launches: int | None = None) -> tuple[RunBenchmarkWindowInput, ...]:
    """The two run_benchmark_window inputs this pair runs (``launches`` as their repeats; default the
    budget): what each side's record holds as its inputs."""
    pinned = _pinned(inp)
    b, c = inp.baseline, inp.candidate
    common = {"repeats": launches or inp.max_launches, "reason": inp.reason or b.reason}
    base = b.model_copy(update={**common, "label": b.label or "baseline", "env": {**b.env, **pinned}})
    cand = b.model_copy(
        update={
            **common,
            "label": c.label,
            "command": c.command if c.command is not None else b.command,
            "env": {**(c.env if c.env is not None else b.env), **pinned},
            "contract": c.contract if c.contract is not None else b.contract,
        }
    )
    return base, cand


def command(inp: RunBenchmarkPairInput, rt: ToolRuntime) -> CommandRequest:
    """Both sides as one request: the baseline's launch, its candidate's as `CommandRequest.paired`."""
    base, cand = (run_benchmark_window.command(side, rt) for side in sides(inp))
    if inp.baseline_ref is not None:
        base = base.model_copy(update={"code_ref": _code_ref(inp.baseline_ref, rt)})
    reason = inp.reason or (
        f"run_benchmark_pair: baseline and candidate in turn (A B B A ...), at most {inp.max_launches} launches a "
        f"side, stopping when the verdict is settled at {inp.confidence:.0%}; {base.reason}"
    )
    return base.model_copy(update={"paired": cand.model_copy(update={"reason": ""}), "reason": reason})


def _swap_dir(rt: ToolRuntime) -> Path:
    """Where a code-state pair saves the candidate's files and its journal: the server's, never the workspace."""
    return rt.private_dir / SWAP_DIR


def _code_ref(ref: str, rt: ToolRuntime) -> CodeRef:
    """The baseline's code at ``ref``, after restoring any working tree a crashed pair left swapped (the
    answer says so).

    Raises:
        ToolError: the swap cannot be exact (not a repository, no such ref, unmerged files, links, files
            under .perfgate or outside the workspace); the message says what to do.
    """
    recover(rt.workspace, rt.private_dir)
    try:
        return plan_swap(rt.workspace, ref)
    except SwapRefusedError as exc:
        lines = [f"run_benchmark_pair cannot run the baseline at {ref!r}: {exc}", *recovered(rt.private_dir)]
        raise ToolError("\n".join(lines)) from exc


def _code_identity(side: RunBenchmarkWindowInput, rt: ToolRuntime) -> tuple[str | None, str | None]:
    """(commit, diff sha256) of the code the side would run now: what its window record's code state holds."""
    from perfgate.benchmarking.workload.provenance import run_code_scope
    from perfgate.envprobe import git_snapshot

    cwd = rt.resolve_path(side.cwd, kind="dir")
    roots, programs = run_code_scope(side.command, cwd, side.env, rt.workspace)
    snapshot, _ = git_snapshot(rt.workspace, roots=roots, programs=programs)
    return (snapshot.commit, snapshot.diff_sha256) if snapshot is not None else (None, None)


def _median_ms(
    side: RunBenchmarkWindowInput, launched: Launched, launch: int, scrub: Scrubber
) -> float | None:
    """The launch's median step (ms) of its slowest rank, as its window will report it; None: it measured
    no window (the record says why)."""
    p = run_benchmark_window.plan(side)
    try:
        if p.timing == "log":
            windows = log_windows(p, launched.stdout, launch)[0]
        else:
            found = load_records(launched.record_dir, scrub)
            windows = harness_windows(p, found.records, found.problems)
    except BenchmarkError:
        return None
    return windows[0].stats.median_ms if windows else None


# --------------------------------------------------------------------------- the run


@dataclasses.dataclass
class _Side:
    inp: RunBenchmarkWindowInput
    launches: run_benchmark_window.BlockingLaunches
    run_dir: Path
    index: int
    kept: list[Launched] = dataclasses.field(default_factory=list[Launched])
    medians: list[float] = dataclasses.field(default_factory=list[float])

    async def launch(self) -> Launched:
        """One more launch; its records are moved aside (the next launch starts with a fresh folder)."""
        n = len(self.kept)
        got = await self.launches(n, f"launch{n}_")
        kept = self.run_dir / f"launch{n}"
        record_dir(self.run_dir).rename(kept)
        got = dataclasses.replace(got, record_dir=kept)
        self.kept.append(got)
        if got.failure is None and (
            median := await anyio.to_thread.run_sync(
                _median_ms, self.inp, got, n, self.launches.ev.scrubber()
            )
        ):
            self.medians.append(median)
        return got


def _window_runtime(rt: ToolRuntime, tool: str, inputs: BaseModel) -> ToolRuntime:
    """``rt`` writing another tool's record: the record a separate call of ``tool`` would write."""
    return dataclasses.replace(rt, tool=tool, inputs=inputs.model_dump(mode="json"), committed=None)


async def run(inp: RunBenchmarkPairInput, rt: ToolRuntime) -> RunBenchmarkPairOutput:
    from perfgate.benchmarking.windows.launch import harness_pythonpath, prepare_harness_path

    request = command(inp, rt)
    base_inp, cand_inp = sides(inp)
    if base_inp.timing == "harness" or base_inp.harness_on_path:
        await anyio.to_thread.run_sync(prepare_harness_path, harness_pythonpath(rt.ledger.trust.state_dir))
    pair: list[_Side] = []
    for index, side in enumerate((base_inp, cand_inp)):
        side_rt = _window_runtime(rt, "run_benchmark_window", side)
        folder = run_benchmark_window.window_run_dir(side, rt)
        ev = side_rt.evidence()
        pair.append(
            _Side(
                side,
                run_benchmark_window.BlockingLaunches(side, side_rt, request, ev, folder, index),
                folder,
                index,
            )
        )
    recover(rt.workspace, rt.private_dir)
    notes = recovered(rt.private_dir)
    swap = CodeSwap(rt.workspace, request.code_ref, _swap_dir(rt)) if request.code_ref is not None else None
    with (
        one_run(pair[0].run_dir, rt.tool, rt.relative(pair[0].run_dir)),
        one_run(pair[1].run_dir, rt.tool, rt.relative(pair[1].run_dir)),
        swap if swap is not None else contextlib.nullcontext(),
    ):
        try:
            out = await _run_pair(inp, rt, pair, swap)
        finally:
            for side in pair:
                remove_tree(side.run_dir)
    if notes:
        out.warnings[:0] = notes
    return out


def _code_at(
    side: _Side, rt: ToolRuntime, swap: CodeSwap | None, provenance: RunProvenance
) -> Callable[[], contextlib.AbstractContextManager[object]]:
    """What each of the side's launches runs inside: its code put in place (the ref's for a code-state
    pair's baseline) and checked to be the code its window record names, or the launch is refused."""
    expected = (provenance.code.commit, provenance.code.diff_sha256)

    @contextlib.contextmanager
    def at() -> Generator[None]:
        with swap.baseline() if swap is not None and side.index == 0 else contextlib.nullcontext():
            if swap is not None and _code_identity(side.inp, rt) != expected:
                raise ToolError(
                    f"the workspace's code is not the {'baseline' if side.index == 0 else 'candidate'}'s its "
                    "record names (was it edited during the run?); nothing ran. Leave the workspace alone "
                    "while a paired run goes on and call again."
                )
            yield

    return at


async def _run_pair(
    inp: RunBenchmarkPairInput, rt: ToolRuntime, pair: list[_Side], swap: CodeSwap | None
) -> RunBenchmarkPairOutput:
    """Launch A B B A ... until a look settles, the budget is spent or a launch fails; then record each side
    and compare them. ``swap``: a code-state pair's, the baseline's provenance read with its code in place."""
    provenances: list[RunProvenance] = []
    for side in pair:
        fresh_dir(side.run_dir)

        def read(side: _Side = side) -> RunProvenance:
            with swap.baseline() if swap is not None and side.index == 0 else contextlib.nullcontext():
                return run_benchmark_window.window_provenance(side.inp, side.launches.rt, side.launches.ev)

        provenances.append(await anyio.to_thread.run_sync(read))
        side.launches.around = _code_at(side, rt, swap, provenances[-1])
    alpha = 1.0 - inp.confidence
    order = ""
    seen: list[Look] = []
    stopped: Literal["settled", "budget", "failure"] = "budget"
    for n in range(inp.max_launches):
        first, second = (0, 1) if n % 2 == 0 else (1, 0)
        failed = False
        for index in (first, second):
            order += "AB"[index]
            await rt.progress(len(order), 2 * inp.max_launches, f"launch {len(order)}: {'AB'[index]}")
            if (await pair[index].launch()).failure is not None:
                failed = True
                break
        if failed or any(len(s.medians) < len(s.kept) for s in pair):
            stopped = "failure"
            break
        ratios = [math.log(a / b) for a, b in zip(pair[0].medians, pair[1].medians, strict=True)]
        if len(ratios) >= MIN_PAIRS:
            seen.append(look(ratios, max_pairs=inp.max_launches, alpha=alpha, min_effect=inp.min_effect))
            if seen[-1].settled is not None:
                stopped = "settled"
                break
    launches = min(len(s.kept) for s in pair) if stopped != "failure" else None
    outs: list[run_benchmark_window.RunBenchmarkWindowOutput | None] = []
    for side, provenance in zip(pair, provenances, strict=True):
        ran = len(side.kept)
        kept = side.kept

        async def replay(launch: int, label: str, kept: list[Launched] = kept) -> Launched:
            return kept[launch]

        final = side.inp.model_copy(update={"repeats": max(ran, 1)})
        side.launches.rt = _window_runtime(side.launches.rt, "run_benchmark_window", final)
        outs.append(await side.launches.record(provenance, replay, final) if ran else None)
    return await _answer(inp, rt, pair, outs, seen, order, stopped, launches)


async def _answer(
    inp: RunBenchmarkPairInput,
    rt: ToolRuntime,
    pair: list[_Side],
    outs: list[run_benchmark_window.RunBenchmarkWindowOutput | None],
    seen: list[Look],
    order: str,
    stopped: Literal["settled", "budget", "failure"],
    launches: int | None,
) -> RunBenchmarkPairOutput:
    """Compare the sides (unless a launch failed) and commit this call's own record."""
    base, cand = outs
    ids = [o.evidence_id if o is not None else "" for o in outs]
    compared: compare_benchmarks.CompareBenchmarksOutput | None = None
    failure = next((o.failure_reason for o in outs if o is not None and o.failure_reason), None)
    if stopped != "failure" and base is not None and cand is not None:
        cmp_inp = compare_benchmarks.CompareBenchmarksInput(
            baseline=[base.evidence_id],
            candidate=[cand.evidence_id],
            # the code is the change a code-state pair makes, declared by construction
            declared_changes=[*inp.declared_changes, *(["code"] if inp.baseline_ref is not None else [])],
            per_device=inp.per_device,
            min_effect=inp.min_effect,
        )
        compared = await compare_benchmarks.run(cmp_inp, _window_runtime(rt, "compare_benchmarks", cmp_inp))
    ev = rt.evidence()
    last = seen[-1] if seen else None
    method = (
        "launches alternate A B B A ...; after each pair from the third, a two-sided Student t interval on the "
        "mean log ratio of the pair's launch medians (baseline / candidate), at confidence "
        f"1 - {1 - inp.confidence:.3g}/{max(1, inp.max_launches - MIN_PAIRS + 1)} per look (Bonferroni across "
        "the looks, so stopping early keeps the stated error rate); the run stops at the first look whose "
        "interval excludes 1 with an effect of at least min_effect, or at the budget. The verdict is "
        "compare_benchmarks' over the windows measured"
    )
    next_call = (
        f"record_decision(action='decide', ..., evidence=[{{'id': '{compared.evidence_id}', 'role': 'comparison'}}, "
        "environment and correctness evidence])"
        if compared is not None and compared.verdict == "improved"
        else "read the comparison's noise lines before measuring again"
        if compared is not None
        else "fix the failed launch (failure_reason) and call again"
    )
    out = RunBenchmarkPairOutput(
        evidence_id=ev.id,
        state=compared.state if compared is not None else EvidenceState.FAILED,
        verdict=compared.verdict if compared is not None else None,
        settled=stopped == "settled",
        stopped=stopped,
        speedup=compared.speedup if compared is not None else None,
        ci_low=compared.ci_low if compared is not None else None,
        ci_high=compared.ci_high if compared is not None else None,
        comparison_id=compared.evidence_id if compared is not None else None,
        baseline_id=ids[0],
        candidate_id=ids[1],
        launches=launches if launches is not None else max(len(s.kept) for s in pair),
        order=order,
        looks=[PairLook(**dataclasses.asdict(x)) for x in seen],
        pinned=_pinned(inp),
        baseline_median_ms=pair[0].medians,
        candidate_median_ms=pair[1].medians,
        baseline_tensor_dumps=[d.path for d in base.tensor_dumps] if base is not None else [],
        candidate_tensor_dumps=[d.path for d in cand.tensor_dumps] if cand is not None else [],
        method=method,
        failure_reason=failure if stopped == "failure" else None,
        warnings=[
            *([last.describe()] if last is not None else []),
            *(compared.warnings if compared is not None else []),
            *_side_warnings(outs, compared.warnings if compared is not None else []),
        ],
        next=next_call,
    )
    return await rt.commit(ev, out)


def _side_warnings(
    outs: list[run_benchmark_window.RunBenchmarkWindowOutput | None], already: list[str]
) -> list[str]:
    """Each side's window warnings (a capture that wrote nothing, a contract the run contradicted, a busy
    neighbour), marked A or B, that the comparison did not already give."""
    return [
        f"{'AB'[i]}: {w}"
        for i, out in enumerate(outs)
        if out is not None
        for w in out.warnings
        if w not in already
    ]


def _brief(out: RunBenchmarkPairOutput) -> list[str]:
    """What the agent reads first: the verdict and how the run stopped, the records a keep names, the next call."""
    if out.verdict is None:
        return [
            f"paired run failed after {out.order or 'no launch'}: {out.failure_reason}",
            f"next: {out.next}",
        ]
    figures = (
        f"speedup {out.speedup:.3f}x [{out.ci_low:.3f}, {out.ci_high:.3f}]"
        if out.speedup is not None
        else "no speedup"
    )
    how = (
        f"settled at {out.launches} launches a side"
        if out.settled
        else f"the budget of {out.launches} a side ran out"
    )
    return [
        f"verdict {out.verdict}: {figures}; {how} ({out.order})",
        f"comparison {out.comparison_id}, baseline {out.baseline_id}, candidate {out.candidate_id}",
        f"next: {out.next}",
    ]


SPEC = ToolSpec(
    name="run_benchmark_pair",
    title="A/B in one call: baseline and candidate in turn",
    description=(
        "A/B in one call and one approval (needs approval): baseline and candidate launched in turn (A B B A), "
        "stopped when a sequential test settles, compared; writes both window records and the comparison."
    ),
    details=(
        "Launch the baseline (a run_benchmark_window input) and the candidate (its command, env or contract "
        "changed, or the working tree against the code of baseline_ref, swapped in place per launch) in turn, A B B A A B ..., under one approval that shows both and their difference, with "
        "threads pinned to the server's cores unless a side sets them. After each pair from the third, a "
        "Student t interval on the mean log ratio of the pairs' launch medians is looked at with the "
        "confidence spent across the looks (Bonferroni): launch medians ignore stalls, logs make step time's "
        "multiplicative, right-skewed changes symmetric, adjacent pairs cancel the host's drift. The run stops "
        "at the first look that settles or at max_launches a side, then records each side as run_benchmark_window "
        "would and compares them as compare_benchmarks would: the answer's comparison_id is a keep's "
        "'comparison', and every gate applies to it unchanged."
    ),
    input_model=RunBenchmarkPairInput,
    output_model=RunBenchmarkPairOutput,
    run=run,
    read_only=False,
    destructive=False,
    idempotent=False,
    open_world=True,
    runs_commands=True,
    command=command,
    brief=_brief,
)
