"""Does a checkpoint resume the training it saved? A resumed launch against the uninterrupted run it resumes.

The agent runs the candidate once as a whole job (``job=true``): the harness lists every file a checkpoint
writer saved and the step in progress when it did. Then it runs the candidate's command with its resume
option, marked ``resume_of=<that run's evidence id>``. From the two runs' records (the server's hash-checked
copies) this module finds, without taking the agent's word for any of it:

- **loaded**: the files the resumed launch read with ``torch.load``, ``torch.distributed.checkpoint.load`` or
  ``safetensors.torch.load_file``; none means it started from scratch whatever its option said;
- **resumed from**: the step at which the uninterrupted run saved the file it loaded (the last save of that
  path: what the file held), so the resumed launch's step ``k`` is the uninterrupted run's step ``S + k``;
- **loss**: the resumed launch's loss at each step against the uninterrupted run's at the aligned step,
  within the tolerance a comparison's ``same_training`` uses (`perfgate.benchmarking.runs.training.losses_apart`);
  and the alignment checked against a fresh start: where the losses agree as well at offset 0, the check
  cannot tell a resume from a restart and says so.

- **tensors**: where both runs captured the model's tensors (``capture={'step': ...}`` or ``dump_tensors``)
  at the same training step (the resumed launch's step ``k``, the uninterrupted run's ``S + k``), the pair
  of files to give compare_tensors, each named with the digest its run recorded; the keep's
  ``checkpoint_resume`` gate reads a tensor check of exactly those two files (`perfgate.decisions.gates.launches`).

A resume that loads the weights but not the optimizer's state (fresh Adam moments, a reset learning-rate
schedule) matches at its first step and drifts from the next: the loss check names the first step apart,
and the tensors at an aligned step after it differ.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from perfgate.benchmarking.reading.records import RankRecord
from perfgate.benchmarking.runs.dumps import TensorDump
from perfgate.benchmarking.runs.training import losses_apart
from perfgate.benchmarking.workload.provenance import workspace_relative

__all__ = ["ResumeCheck", "ResumeTensors", "check_resume", "launch_losses", "saved_files", "tensor_pair"]

_SHOWN = 3


class ResumeTensors(BaseModel):
    """Two tensor files of the same training step: the uninterrupted run's and the resumed launch's."""

    step: int = Field(
        description="The uninterrupted run's step both hold (resumed_from_step + the resumed launch's own step)."
    )
    reference: str = Field(description="The uninterrupted run's file: compare_tensors' reference.")
    reference_digest: str = Field(description="Its digest as that run recorded it.")
    candidate: str = Field(description="The resumed launch's file: compare_tensors' candidate.")
    candidate_digest: str = Field(description="Its digest as this run recorded it.")


class ResumeCheck(BaseModel):
    """A resumed launch against the uninterrupted run it resumes (`run_benchmark_window(resume_of=...)`)."""

    status: Literal["passed", "failed"] = Field(
        description="passed: the resumed launches loaded a checkpoint the uninterrupted run saved and their "
        "loss matches its loss at the aligned steps; failed: one of these did not hold (reason says which)."
    )
    reason: str = Field(description="The verdict in one line, leading with what to do when failed.")
    resume_of: str = Field(description="Evidence id of the uninterrupted run.")
    loaded: list[str] = Field(
        description="Files the resumed launches loaded (relative to the workspace where inside it)."
    )
    resumed_from_step: int | None = Field(
        description="The uninterrupted run's step when it saved the loaded file (its last save of that path): "
        "the resumed launch's step k is its step resumed_from_step + k."
    )
    steps_compared: int = Field(description="Aligned steps both runs recorded a loss for.")
    steps_apart: int = Field(description="Of those, steps whose loss differs beyond the tolerance.")
    tensors: ResumeTensors | None = Field(
        default=None,
        description="Captures of both runs at the same training step: compare_tensors(reference=tensors.reference, "
        "candidate=tensors.candidate) checks the tensors too, and the keep's checkpoint_resume gate reads that "
        "check; null: no such pair (the reason says how to capture one).",
    )


def launch_losses(record: RankRecord) -> dict[int, float]:
    """Step -> finite loss of one rank record: its windows' and, in a job run, every other step's."""
    steps: dict[int, float] = {}
    for w in record.windows:
        for i, value in enumerate(w.loss or []):
            if value is not None and math.isfinite(value):
                steps[w.first_step + i] = value
    if record.outside_windows is not None:
        steps.update((s, v) for s, v in record.outside_windows.loss if math.isfinite(v))
    return steps


def saved_files(records: Sequence[RankRecord]) -> dict[str, int]:
    """Path -> the step of its last save, over the launches in order (what the file holds afterwards)."""
    saved: dict[str, int] = {}
    for record in records:
        for f in record.job.checkpoint_files if record.job is not None else ():
            if f.op == "save":
                saved[f.path] = f.step
    return saved


def _save_for(loaded: str, saved: Mapping[str, int]) -> tuple[str, int] | None:
    """The save a load reads: the same path, or a file inside a saved checkpoint directory (DCP)."""
    if loaded in saved:
        return loaded, saved[loaded]
    for path, step in saved.items():
        if loaded.startswith(path.rstrip(os.sep) + os.sep):
            return path, step
    return None


def _by_step(losses: Sequence[Mapping[int, float]], offset: int) -> dict[int, list[float]]:
    merged: dict[int, list[float]] = {}
    for launch in losses:
        for step, value in launch.items():
            merged.setdefault(step + offset, []).append(value)
    return merged


def _apart(ref: Mapping[int, list[float]], got: Mapping[int, list[float]]) -> tuple[list[int], list[int]]:
    common = sorted(set(ref) & set(got))
    return common, [s for s in common if losses_apart(ref[s], got[s])]


def tensor_pair(
    uninterrupted: Sequence[TensorDump], resumed: Sequence[TensorDump], step: int
) -> tuple[ResumeTensors | None, str]:
    """The captures of one training step in both runs (the resumed launch's step ``k`` is the uninterrupted
    run's ``step + k``), and a clause saying what was paired or how to capture a pair. Each side's file is
    the last one written at its path (what the file holds now), on the lowest rank both captured."""

    def current(dumps: Sequence[TensorDump]) -> dict[tuple[int, int], TensorDump]:
        latest = {d.path: d for d in dumps}  # a path holds what was written there last
        return {(d.rank, d.step): d for d in latest.values()}

    theirs, ours = current(uninterrupted), current(resumed)
    pairs = sorted(
        ((rank, k, theirs[rank, k + step], d) for (rank, k), d in ours.items() if (rank, k + step) in theirs),
        key=lambda p: (p[1], -p[0]),  # the last step, on the lowest rank, is tried first
    )
    later = sorted({s - step for (_, s) in theirs if s > step})
    how = (
        f"capture={{'step': {later[-1]}}} on the resume launch (a label of its own, so that it writes another "
        f"file) compares them with the uninterrupted run's capture at step {later[-1] + step}"
        if later
        else f"capture={{'step': {step} + k}} on the uninterrupted run and {{'step': k}} on the resume launch "
        "(each with a label of its own) compare them"
    )
    if not pairs:
        if ours:
            at = sorted({k for _, k in ours})[:_SHOWN]
            return None, (
                f"tensors not paired: the resumed launch captured at its step {', '.join(map(str, at))} (the "
                f"uninterrupted run's {', '.join(str(k + step) for k in at)}), where the uninterrupted run "
                f"captured nothing; {how}"
            )
        return None, f"tensors not captured: {how}"
    for _, k, ref, got in reversed(pairs):
        if ref.path != got.path:
            return ResumeTensors(
                step=k + step,
                reference=ref.path,
                reference_digest=ref.digest,
                candidate=got.path,
                candidate_digest=got.digest,
            ), (
                f"compare_tensors(reference={ref.path!r}, candidate={got.path!r}) checks the tensors at step "
                f"{k + step} too"
            )
    path = pairs[-1][2].path
    return None, (
        f"tensors not paired: the resume launch wrote its capture over {path}, the uninterrupted run's file; "
        "give it another label (or capture.path) and run it again"
    )


def check_resume(
    uninterrupted: Sequence[RankRecord],
    resumed: Sequence[RankRecord],
    *,
    resume_of: str,
    workspace: Path,
    dumps: tuple[Sequence[TensorDump], Sequence[TensorDump]] = ((), ()),
    other_code: str | None = None,
) -> ResumeCheck:
    """Judge rank 0's records of each resumed launch against rank 0's of each uninterrupted launch; where
    ``dumps`` (the uninterrupted run's tensor files, the resumed launch's) hold captures of one training
    step, name the pair to compare. ``other_code``: how the code the resumed launch ran differs from the
    uninterrupted run's (its provenance); a resume of other code shows nothing of this code's checkpoints."""
    loads = list(
        dict.fromkeys(
            f.path
            for r in resumed
            for f in (r.job.checkpoint_files if r.job is not None else ())
            if f.op == "load"
        )
    )
    shown = [workspace_relative(Path(p), workspace) for p in loads]
    saved = saved_files(uninterrupted)

    def result(
        ok: bool,
        reason: str,
        step: int | None = None,
        compared: int = 0,
        apart: int = 0,
        tensors: ResumeTensors | None = None,
    ) -> ResumeCheck:
        return ResumeCheck(
            status="passed" if ok else "failed",
            reason=reason,
            resume_of=resume_of,
            loaded=shown,
            resumed_from_step=step,
            steps_compared=compared,
            steps_apart=apart,
            tensors=tensors,
        )

    saves = ", ".join(
        f"{workspace_relative(Path(p), workspace)} at step {s}" for p, s in list(saved.items())[:_SHOWN]
    )
    if other_code is not None:
        return result(
            False,
            f"the resumed launch ran other code than {resume_of} ({other_code}): restore the code {resume_of} ran "
            "and run the resume again, or run the uninterrupted job again on this code",
        )
    if not loads:
        return result(
            False,
            "the resumed launch loaded no checkpoint (no torch.load, torch.distributed.checkpoint.load or "
            f"safetensors load_file was seen): it started from scratch; pass the resume option a file {resume_of} "
            f"saved ({saves or 'it saved none'}) and run it again",
        )
    found = [m for p in loads if (m := _save_for(p, saved)) is not None]
    if not found:
        return result(
            False,
            f"the resumed launch loaded {', '.join(shown[:_SHOWN])}, which {resume_of} never saved "
            f"({saves or 'it saved no checkpoint: run it with job=true and a save inside the run'}): resume "
            "from a checkpoint that run wrote",
        )
    path, step = found[-1]
    where = f"{workspace_relative(Path(path), workspace)} (saved at step {step})"
    pair, tensors = tensor_pair(*dumps, step)
    reference = _by_step([launch_losses(r) for r in uninterrupted], 0)
    losses = [launch_losses(r) for r in resumed]
    if not reference or not any(losses):
        return result(
            False,
            f"loaded {where}, but no loss was recorded to compare (a loop without backward() on a scalar loss); "
            "capture tensors at the same step in both runs and compare_tensors them",
            step,
        )
    common, apart = _apart(reference, _by_step(losses, step))
    if not common:
        return result(
            False,
            f"loaded {where}, but the resumed launch's steps ({step} onwards on the uninterrupted run's count) "
            f"overlap none that {resume_of} recorded: resume from an earlier checkpoint of that run",
            step,
        )
    if apart:
        first = apart[0]
        return result(
            False,
            f"the loss diverges after resuming from {where}: {len(apart)} of {len(common)} aligned steps differ "
            f"(first: step {first}, uninterrupted {min(reference[first]):.6g} vs resumed "
            f"{min(_by_step(losses, step)[first]):.6g}); restore everything the checkpoint should carry "
            "(optimizer state, learning-rate schedule, RNG and data position), then run the resume again",
            step,
            len(common),
            len(apart),
            pair,
        )
    if step > 0:
        scratch, scratch_apart = _apart(reference, _by_step(losses, 0))
        if scratch and not scratch_apart:
            return result(
                False,
                f"loaded {where} and the loss agrees, but it agrees as well with a start from scratch (the loss "
                "barely moved before the save): resume from a later checkpoint, where the two differ",
                step,
                len(common),
            )
    return result(
        True,
        f"resumed from {where}: the loss matches the uninterrupted run at all {len(common)} aligned steps; "
        + tensors,
        step,
        len(common),
        0,
        pair,
    )
