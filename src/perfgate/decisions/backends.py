"""The keep's ``backend`` gate: a change that names a MoE dispatcher backend or CUDA/MUSA graphs is kept only
when a trace of the candidate's own command shows that backend ran and that graphs replayed.

What was asked is read from the experiment's changed variable, the comparison's declared changes, and the
candidate windows' command lines and contracts (a setting the candidate changes from the baseline counts
even when undeclared). What ran is read from profile_segment runs (the server launched them and analysed
their traces: ``ranks[].backends``), bound to the candidate by what ran: the same command, working
directory, environment, code state and file digests as one of the comparison's candidate windows, captured
after the experiment was opened; the newest such capture decides. A trace of the baseline's command, an older capture, or a trace the agent
brought (``mode='analyze'``) shows nothing about the candidate.

The candidate windows' ``logged_settings`` (the arguments the run's own stdout listed, read by the server) are
weaker evidence: what the job was told, not what ran. A refusal quotes them beside what the trace shows, so
the agent sees where the two disagree; they never pass the gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from perfgate.decisions.experiments import Experiment
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence import EvidenceRecord, canonical_json
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["backend_check"]

Lookup = Callable[[str], EvidenceRecord | None]

_TERMS = ("token_dispatcher", "cuda_graphs")
_OFF = frozenset({"", "0", "false", "no", "off", "none", "null", "disabled"})
_EXCHANGES = ("deepep", "hybridep", "alltoall", "allgather")


def _on(value: Any) -> bool:
    return str(value).strip().lower() not in _OFF


def _settings(record: EvidenceRecord) -> dict[str, str]:
    """The dispatcher and graph settings a window's command line and contract name, by vocabulary name."""
    from perfgate.benchmarking.workload.argv import argv_options, launched_argv
    from perfgate.benchmarking.workload.vocabulary import VOCABULARY, canonical_key, vocabulary_name

    out: dict[str, str] = {}
    command = launched_argv(record.inputs)
    if isinstance(command, list):
        for name, value in argv_options([str(t) for t in command]).items():  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            term = VOCABULARY.get(canonical_key(name))
            if term is not None and term.name in _TERMS:
                out[vocabulary_name(name)] = value
    contract = as_dict(record.inputs.get("contract"))
    for section in ("invariants", "execution"):
        for key, value in as_dict(contract.get(section)).items():
            term = VOCABULARY.get(canonical_key(key))
            if term is not None and term.name in _TERMS:
                out[vocabulary_name(key)] = str(value)
    return out


def _dispatcher(settings: Mapping[str, str]) -> str | None:
    """The exchange backend the settings ask for: deepep, hybridep, alltoall, allgather, or None."""
    comm = settings.get("expert_parallel_comm_backend", "").lower()  # torchtitan
    if comm in ("deepep", "hybridep"):
        return comm
    if comm == "standard":
        return "alltoall"
    kind = settings.get("token_dispatcher", "").lower()
    flex = (
        settings.get("moe_flex_dispatcher_backend") or settings.get("flex_dispatcher_backend") or ""
    ).lower()
    if kind == "flex" or _on(settings.get("moe_enable_deepep", "false")):
        return flex if flex in ("deepep", "hybridep") else "deepep"  # Megatron's flex default is DeepEP
    if kind.startswith("alltoall"):
        return "alltoall"
    if kind == "allgather":
        return "allgather"
    return None


def _graphs(settings: Mapping[str, str]) -> bool | None:
    """Whether the settings turn graphs on (True), off (False), or say nothing (None)."""
    said = [
        _on(v)
        for k, v in settings.items()
        if k in ("cuda_graphs", "cuda_graph_impl", "external_cuda_graph", "musa_graph", "enable_musa_graph")
    ]
    return (any(said)) if said else None


def _side_settings(ids: list[str], lookup: Lookup) -> tuple[dict[str, str], list[EvidenceRecord]]:
    merged: dict[str, str] = {}
    records: list[EvidenceRecord] = []
    for wid in ids:
        record = lookup(wid)
        if record is None:
            continue
        records.append(record)
        merged.update(_settings(record))
    return merged, records


def _log_says(records: list[EvidenceRecord]) -> str | None:
    """What the candidate windows' logs listed, quoted for a refusal ("the candidate's log says ..."),
    or None."""
    from perfgate.benchmarking.workload.vocabulary import vocabulary_name

    logged: dict[str, str] = {}
    for record in records:
        for key, value in as_dict(record.result.get("logged_settings")).items():
            logged.setdefault(str(key), str(value))
    if not logged:
        return None
    named = {vocabulary_name(k): v for k, v in logged.items()}
    read: list[str] = []
    if (dispatcher := _dispatcher(named)) is not None:
        read.append(f"dispatcher {dispatcher}")
    if (graphs := _graphs(named)) is not None:
        read.append("graphs on" if graphs else "graphs off")
    listed = ", ".join(f"{k}={v}" for k, v in sorted(logged.items()))
    return (
        f"the candidate's log says {listed}"
        + (f" ({', '.join(read)})" if read else "")
        + ": what the job was told, not what ran"
    )


def _run_identity(record: EvidenceRecord) -> str:
    """What ran: the command, working directory, environment given, code state and file digests."""
    prov = as_dict(record.result.get("provenance"))
    code = as_dict(prov.get("code"))
    return canonical_json(
        {
            "argv": prov.get("argv"),
            "cwd": prov.get("cwd"),
            "env": as_dict(record.inputs.get("env")),
            "code": [code.get("commit"), code.get("diff_sha256")],
            "files": as_dict(prov.get("files")),
        }
    )


def _wanted(
    exp: Experiment, comparison: EvidenceRecord, base: dict[str, str], cand: dict[str, str]
) -> tuple[str | None, bool, list[str]]:
    """(dispatcher wanted or 'any', graphs wanted, why each applies)."""
    from perfgate.benchmarking.workload.vocabulary import VOCABULARY
    from perfgate.decisions.binding import named_changes

    named = named_changes(exp, comparison)
    why: list[str] = []
    dispatcher: str | None = None
    changed = {k for k in set(base) | set(cand) if base.get(k) != cand.get(k)}
    changed_terms = {VOCABULARY[k].name for k in changed if k in VOCABULARY}
    if "token_dispatcher" in named or "token_dispatcher" in changed_terms:
        dispatcher = _dispatcher(cand) or "any"
        why.append(
            f"the token dispatcher ({dispatcher if dispatcher != 'any' else 'no value on the candidate'})"
            + (" is the declared change" if "token_dispatcher" in named else " differs from the baseline's")
        )
    graphs = False
    if "cuda_graphs" in named or "cuda_graphs" in changed_terms:
        on = _graphs(cand)
        if on is not False:  # turning graphs off asks nothing of a replay
            graphs = True
            why.append(
                "CUDA/MUSA graphs"
                + (" are the declared change" if "cuda_graphs" in named else " differ from the baseline's")
            )
    return dispatcher, graphs, why


def _families(record: EvidenceRecord) -> tuple[int, dict[str, int], dict[str, list[str]], bool]:
    """Over a profile's ranks: graph launches, kernels per exchange family, example names, whether every
    rank recorded its backends."""
    launches = 0
    kernels: dict[str, int] = {}
    names: dict[str, list[str]] = {}
    complete = True
    for rank in map(as_dict, as_list(record.result.get("ranks"))):
        seen = as_dict(rank.get("backends"))
        if not seen:
            complete = False
            continue
        launches += int(seen.get("graph_launches") or 0)
        for ex in map(as_dict, as_list(seen.get("token_exchange"))):
            family = str(ex.get("backend"))
            kernels[family] = kernels.get(family, 0) + int(ex.get("kernels") or 0)
            names.setdefault(family, str_list(ex.get("names"))[:1])
    return launches, kernels, names, complete and bool(as_list(record.result.get("ranks")))


def _dispatcher_problem(
    wanted: str, kernels: Mapping[str, int], names: Mapping[str, list[str]]
) -> str | None:
    seen = [f for f in _EXCHANGES if kernels.get(f)]
    shown = ", ".join(
        f"{f} ({kernels[f]} kernels, e.g. {names[f][0] if names.get(f) else '?'})" for f in seen
    )
    if wanted == "any":
        return None if seen else "no token-exchange kernel ran"
    if wanted in ("deepep", "hybridep"):
        return (
            None
            if wanted in seen
            else f"no {wanted} kernel ran; the exchange kernels were: {shown or 'none'}"
        )
    specific = [f for f in ("deepep", "hybridep") if f in seen]
    if specific:
        return f"{wanted} was asked for but {', '.join(specific)} kernels ran: {shown}"
    return None if wanted in seen else f"no {wanted} kernel ran; the exchange kernels were: {shown or 'none'}"


def backend_check(
    exp: Experiment, comparison: EvidenceRecord, profiles: list[EvidenceRecord], lookup: Lookup
) -> Check:
    """The ``backend`` gate over the comparison's candidate windows and the ledger's profile_segment runs."""
    base_settings, base_records = _side_settings(str_list(comparison.inputs.get("baseline")), lookup)
    cand_settings, cand_records = _side_settings(str_list(comparison.inputs.get("candidate")), lookup)
    dispatcher, graphs, why = _wanted(exp, comparison, base_settings, cand_settings)
    if dispatcher is None and not graphs:
        return Check(False, True, "the change names no MoE dispatcher backend or CUDA/MUSA graphs", [])
    asked = "; ".join(why)
    candidates = {_run_identity(r) for r in cand_records}
    baselines = {_run_identity(r) for r in base_records}
    bound: list[EvidenceRecord] = []
    unbound: list[str] = []
    for p in profiles:
        if not p.profiled or p.state.value not in OK_STATES:
            continue
        identity = _run_identity(p)
        if identity in candidates and p.seq >= exp.opened_seq:
            bound.append(p)
        elif identity in candidates:
            unbound.append(f"{p.id} was captured before the experiment was opened")
        elif identity in baselines:
            unbound.append(f"{p.id} is a trace of the baseline's command, not the candidate's")
    first = cand_records[0] if cand_records else None
    fix = (
        f"profile_segment(mode='run', command={_argv(first)!r}"
        + (
            f", env={as_dict(first.inputs.get('env'))!r}"
            if first and as_dict(first.inputs.get("env"))
            else ""
        )
        + "), the candidate window's own command, then decide keep again"
    )
    log = _log_says(cand_records)
    if not bound:
        return Check(
            True,
            False,
            f"{asked}, but no trace of the candidate's own run shows what ran"
            + (f" ({'; '.join(unbound)})" if unbound else "")
            + (f"; {log}; only a trace passes this gate" if log else ""),
            [comparison.id],
            fix,
        )
    # the newest capture decides, as the newest comparison does: a re-profiled candidate replaces the last
    problems: list[str] = []
    figures: list[str] = []
    for p in bound[-1:]:
        launches, kernels, names, complete = _families(p)
        if not complete:
            problems.append(f"{p.id} records no backends for some rank (analysed before they were recorded)")
            continue
        if graphs:
            figures.append(f"{p.id}: {launches} graph launches")
            if launches == 0:
                problems.append(
                    f"{p.id} shows 0 graph launches: no CUDA/MUSA graph replayed in the traced steps"
                )
        if dispatcher is not None:
            problem = _dispatcher_problem(dispatcher, kernels, names)
            seen = [f for f in _EXCHANGES if kernels.get(f)]
            figures.append(f"{p.id}: dispatcher kernels {', '.join(seen) or 'none'}")
            if problem is not None:
                problems.append(f"{p.id}: {problem}")
    ids = [comparison.id, bound[-1].id]
    if problems:
        return Check(
            True,
            False,
            f"{asked}, but the candidate's trace shows otherwise: "
            + " | ".join(problems)
            + (f"; {log}" if log else ""),
            ids,
            "make the candidate run what it names (the backend installed and selected, graphs captured and "
            "replayed: its log says why not), re-run its windows and "
            + fix.removesuffix(", then decide keep again")
            + ", then compare_benchmarks again; or decide 'revert'",
        )
    return Check(True, True, f"{asked}; the candidate's trace shows it ran ({'; '.join(figures)})", ids)


def _argv(record: EvidenceRecord | None) -> list[str]:
    if record is None:
        return ["<candidate command>"]
    return str_list(as_dict(record.result.get("provenance")).get("argv")) or str_list(
        record.inputs.get("command")
    )
