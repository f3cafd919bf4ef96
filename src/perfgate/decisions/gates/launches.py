"""What the compared launches observed beyond their speed: peak memory, timing the server corroborates,
replicas that agree, the whole job's time, a checkpoint the candidate resumes from, and the backend a
change names actually running."""

from __future__ import annotations

from perfgate.decisions.gates.base import Keep, not_applicable, unavailable, verdict
from perfgate.decisions.gates.windows import declared_contract, sides
from perfgate.decisions.verdict import Check
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["backend", "checkpoint_resume", "job_time", "peak_memory", "replicas", "trusted_timing"]


def peak_memory(keep: Keep) -> Check:
    """Peak memory may not grow beyond noise unless the ledger records its acceptance (`decisions.memory`)."""
    from perfgate.decisions.memory import peak_memory_verdict

    exp = keep.exp
    baseline, candidate = sides(keep.compared)
    said = peak_memory_verdict(exp, baseline, candidate, keep.get, keep.memory_growth_reason)
    ids = baseline + candidate
    if said.status == "unavailable":
        return unavailable(said.reason, ids)
    fix = (
        "reduce the candidate's memory and re-run it, or decide 'revert'"
        if exp.memory_budget_bytes is not None
        else "if the growth is acceptable, decide keep again with memory_growth_reason='<why it is acceptable>' "
        "(recorded with the keep); else reduce the candidate's memory and re-run it, or decide 'revert'"
    )
    return verdict(said.status == "passed", said.reason, ids, fix)


def trusted_timing(keep: Keep) -> Check:
    """Every compared window's launch was corroborated by the server's own observation (or not observed at
    all, as for a Slurm launch or imported log), and its windows ran like the steady steps around them."""
    ids = [wid for side in sides(keep.compared) for wid in side]
    bad: list[str] = []
    unobserved: list[str] = []
    noisy: list[str] = []
    for wid in ids:
        record = keep.get(wid)
        if record is None or record.tool != "run_benchmark_window":
            continue
        for raw in as_list(record.result.get("timing_checks")):
            check = as_dict(raw)
            status, consistency = check.get("status"), check.get("consistency")
            if status == "untrusted" or consistency == "measurement_dependent":
                why = "; ".join(str_list(check.get("reasons"))[:2])
                bad.append(f"{wid} launch {check.get('launch')}: {status}, {consistency} ({why})")
            elif status == "unobserved":
                unobserved.append(wid)
            if consistency == "noisy":
                noisy.append(str(check.get("next") or "longer windows settle it"))
    if bad:
        return verdict(
            False,
            "the server's observation contradicts the harness: " + " | ".join(bad),
            ids,
            "remove what changes the harness's clock or works differently while measured (see the approval's "
            "diff), re-run the candidate with run_benchmark_window, then compare_benchmarks again and "
            + keep.attach("comparison"),
        )
    # noisy: uneven steps on one side of the windows (load, a warm-up transient, periodic work), not a
    # contradiction; said, with what settles it, but never a refusal
    said = (
        f"; {len(noisy)} launch(es) noisy around their windows, not a contradiction: {noisy[0]}"
        if noisy
        else ""
    )
    if unobserved:
        return verdict(
            True,
            f"no contradiction; {len(set(unobserved))} window record(s) were not observed by the server (Slurm "
            "launches): their times are the harness's word" + said,
            ids,
        )
    return verdict(True, "the server's own clock corroborates every compared launch" + said, ids)


def replicas(keep: Keep) -> Check:
    """The candidate's data-parallel replicas held identical parameters after their last measured update."""
    ids = sides(keep.compared)[1]
    bad: list[str] = []
    agreed = 0
    for wid in ids:
        record = keep.get(wid)
        if record is None:
            continue
        for raw in as_list(record.result.get("replicas")):
            check = as_dict(raw)
            if check.get("status") == "disagree":
                bad.append(f"{wid} launch {check.get('launch')}: {check.get('reason')}")
            agreed += check.get("status") == "agree"
    if bad:
        return verdict(
            False,
            "the candidate's data-parallel replicas drifted apart: " + " | ".join(bad),
            ids,
            "make every rank apply the same update (the gradient all-reduce on every step), re-run the candidate "
            "with run_benchmark_window, then compare_benchmarks again and " + keep.attach("comparison"),
        )
    if agreed:
        return verdict(True, f"the replicas agreed after the last update ({agreed} launch(es))", ids)
    return not_applicable("no multi-rank data-parallel candidate launch to compare replicas in")


def job_time(keep: Keep) -> Check:
    """A keep whose whole job got slower says so; refused where the contract's objective is time_to_train."""
    comparison = keep.compared
    job = as_dict(comparison.result.get("job"))
    ids = [str(i) for i in as_list(comparison.inputs.get("candidate"))]
    objectives = {
        str(as_dict(as_dict(declared_contract(r)).get("invariants")).get("objective"))
        for i in ids
        if (r := keep.get(i)) is not None
    }
    wanted = "time_to_train" in objectives
    remeasure = (
        "run_benchmark_window(..., job=true) for both sides (same inputs otherwise), then compare_benchmarks(...) "
        "and attach it as the comparison"
    )
    if not job:
        if wanted:
            return verdict(
                False,
                "the contract's objective is time_to_train, but the sides were not measured as whole jobs",
                [comparison.id],
                remeasure,
            )
        return not_applicable("the whole job was not measured (run_benchmark_window job=true measures it)")
    summary = str(job.get("summary"))
    if job.get("verdict") != "slower":
        return verdict(True, summary, [comparison.id])
    if wanted:
        return verdict(
            False,
            summary + "; the contract's objective is time_to_train",
            [comparison.id],
            "shrink the part that grew (the job's parts say which), re-measure the candidate with job=true and "
            "compare again; or decide 'revert'",
        )
    return verdict(
        True,
        summary + " (said, not gated: declare invariants.objective='time_to_train' to gate the job)",
        [comparison.id],
    )


def checkpoint_resume(keep: Keep) -> Check:
    """A layout or checkpointing change resumes from its own checkpoint (`perfgate.decisions.resume_gate`)."""
    from perfgate.decisions.resume_gate import resume_check

    return resume_check(keep.exp, keep.compared, keep.ledger, keep.get)


def backend(keep: Keep) -> Check:
    """A named dispatcher backend or CUDA/MUSA graphs ran in a trace of the candidate's own command
    (`perfgate.decisions.backends`)."""
    from perfgate.decisions.backends import backend_check

    return backend_check(keep.exp, keep.compared, keep.ledger.records(tool="profile_segment"), keep.get)
