"""One parity check of two tensor inputs: open both, compare and digest them in the same reads (stoppable on
cancel), then histogram the errors of the worst-mismatched tensors."""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread

from perfgate.helpers.cpus import usable_cpus
from perfgate.security.digests import Algorithm
from perfgate.tensors._errors import ComparisonCancelled, TensorInputError
from perfgate.tensors.compare import CompareOptions, ComparisonReport, TensorComparison, compare_sources
from perfgate.tensors.histogram import error_histogram
from perfgate.tensors.source import DigestJob, TensorSource, open_tensor_source

__all__ = [
    "HISTOGRAM_CHUNK_ELEMENTS",
    "MAX_PLOTTED",
    "HashedFile",
    "ParityRun",
    "compare_files",
    "hash_jobs",
    "open_side",
    "worst_mismatches",
]

Role = Literal["reference", "candidate"]
Progress = Callable[[float, float, str], Coroutine[Any, Any, None]]
Histogram = tuple[list[float], list[int]]

MAX_PLOTTED = 4
"""Tensors whose error histograms are drawn: the ones with the most mismatched elements."""
HISTOGRAM_CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class HashedFile:
    """A file the check read, with its digests (algorithm -> hex) of the bytes compared."""

    role: Role
    path: Path
    digests: dict[Algorithm, str]
    size_bytes: int


@dataclass(frozen=True)
class ParityRun:
    report: ComparisonReport
    files: list[HashedFile]
    """Every file read, reference side first, each source's files in its own order."""
    histograms: dict[str, Histogram]
    """Error histograms of the worst-mismatched tensors (at most `MAX_PLOTTED`), by key."""


def open_side(role: Role, path: Path, confine: Callable[[Path], Path]) -> TensorSource:
    """Open one side, naming it in the error.

    Raises:
        TensorInputError: the input cannot be read as tensors (the message starts with ``role``).
    """
    try:
        return open_tensor_source(path, confine=confine)
    except TensorInputError as exc:
        raise TensorInputError(f"{role}: {exc}") from exc


def hash_jobs(
    jobs: list[tuple[Role, DigestJob]], stop: threading.Event
) -> list[tuple[Role, Path, dict[Algorithm, str], int]]:
    """Run digest jobs, one thread per file up to the usable CPUs (the hashers release the GIL); they stop
    at the next chunk once ``stop`` is set."""
    from concurrent.futures import Future, ThreadPoolExecutor

    def check() -> None:
        if stop.is_set():
            raise ComparisonCancelled

    if len(jobs) <= 1:
        return [(role, job.path, *job.run(check)) for role, job in jobs]
    with ThreadPoolExecutor(min(len(jobs), usable_cpus()), thread_name_prefix="perfgate-hash") as pool:
        futures: list[tuple[Role, Path, Future[tuple[dict[Algorithm, str], int]]]] = [
            (role, job.path, pool.submit(job.run, check)) for role, job in jobs
        ]
        try:
            return [(role, path, *future.result()) for role, path, future in futures]
        except BaseException:
            stop.set()
            raise


def worst_mismatches(report: ComparisonReport, count: int = MAX_PLOTTED) -> list[TensorComparison]:
    """The value mismatches with the most mismatched elements, most first."""
    return sorted(
        (t for t in report.tensors if t.status == "value_mismatch" and t.mismatched),
        key=lambda t: -(t.mismatched or 0),
    )[:count]


async def compare_files(
    reference_path: Path,
    candidate_path: Path,
    options: CompareOptions,
    *,
    confine: Callable[[Path], Path],
    algorithms: Callable[[tuple[Path, ...]], list[Algorithm]],
    progress: Progress,
) -> ParityRun:
    """Compare ``candidate_path`` with ``reference_path`` under ``options`` and digest every file read.

    ``confine`` checks each path a folder or index leads to; ``algorithms`` gets every file of both
    sources and names the digests to take (BLAKE3 first); ``progress`` receives (done, total, message)
    from the comparison.

    Raises:
        TensorInputError: an input cannot be read or compared (the message says which and why).
    """
    stop = threading.Event()
    reference = await anyio.to_thread.run_sync(open_side, "reference", reference_path, confine)
    try:
        candidate = await anyio.to_thread.run_sync(open_side, "candidate", candidate_path, confine)
        try:
            files = reference.files + candidate.files
            chosen = await anyio.to_thread.run_sync(algorithms, files)
            reference.start_digests(chosen)
            candidate.start_digests(chosen)
            report, hashed = await _compare_and_hash(reference, candidate, options, stop, progress)
            # a file changed after the comparison read it surfaces here as a TensorInputError
            histograms = {
                t.key: await anyio.to_thread.run_sync(
                    error_histogram,
                    reference,
                    candidate,
                    t.reference_key or t.key,
                    HISTOGRAM_CHUNK_ELEMENTS,
                    t.candidate_key,
                )
                for t in worst_mismatches(report)
            }
        finally:
            candidate.close()
    finally:
        reference.close()
    return ParityRun(report=report, files=[HashedFile(*h) for h in hashed], histograms=histograms)


async def _compare_and_hash(
    reference: TensorSource,
    candidate: TensorSource,
    options: CompareOptions,
    stop: threading.Event,
    progress: Progress,
) -> tuple[ComparisonReport, list[tuple[Role, Path, dict[Algorithm, str], int]]]:
    """Compare the inputs and digest them, stoppable on cancel. Files the comparison reads in order are
    hashed in the same pass (each chunk as it is read); their digests are finished (headers, bytes no key
    selected) once the comparison is done. The others (a shard index, a compressed NPZ) hash meanwhile on
    their own threads."""
    from anyio import from_thread  # only progress callbacks (worker threads) use it

    sides: list[tuple[Role, TensorSource]] = [("reference", reference), ("candidate", candidate)]
    jobs: list[tuple[Role, DigestJob]] = [
        (role, job) for role, source in sides for job in source.digest_jobs()
    ]
    report: list[ComparisonReport] = []
    hashed: dict[int, tuple[Role, Path, dict[Algorithm, str], int]] = {}
    failures: list[Exception] = []
    compared = anyio.Event()

    def on_progress(done: int, total: int, message: str) -> None:
        if not stop.is_set():
            from_thread.run(progress, float(done), float(total), message)

    def compare() -> ComparisonReport:
        return compare_sources(reference, candidate, options, progress=on_progress, cancelled=stop.is_set)

    def hash_some(after_comparison: bool) -> None:
        chosen = [i for i, (_, job) in enumerate(jobs) if job.after_comparison == after_comparison]
        results = hash_jobs([jobs[i] for i in chosen], stop)
        hashed.update(zip(chosen, results, strict=True))

    # Each task keeps its own failure: a task group would wrap it in an exception group, which the
    # SDK shows the agent only as a bare "error executing tool".
    async def run_compare() -> None:
        try:
            report.append(await anyio.to_thread.run_sync(compare, abandon_on_cancel=True))
        except (TensorInputError, ComparisonCancelled, OSError) as exc:
            failures.append(exc)
            stop.set()
        finally:
            compared.set()

    async def run_hash() -> None:
        try:
            await anyio.to_thread.run_sync(hash_some, False, abandon_on_cancel=True)
            await compared.wait()
            if not stop.is_set():
                await anyio.to_thread.run_sync(hash_some, True, abandon_on_cancel=True)
        except (TensorInputError, ComparisonCancelled, OSError) as exc:
            failures.append(exc)
            stop.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_compare)
            tg.start_soon(run_hash)
    except BaseException:
        stop.set()  # abandoned worker threads see this at their next chunk and exit
        raise
    for exc in failures:
        if isinstance(exc, TensorInputError):
            raise exc
        if isinstance(exc, OSError):
            raise TensorInputError(f"could not read the tensor files: {exc}") from exc
    assert report and len(hashed) == len(jobs), f"both workers finished: {failures}"
    return report[0], [hashed[i] for i in range(len(jobs))]
