"""What a command line says, read as the comparison reads it: its options, positional arguments and
parallel degrees, what differs between two of them, and the topology change two command lines make."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

from perfgate.benchmarking.workload.vocabulary import canonical_key, vocabulary_name

__all__ = [
    "argv_changes",
    "argv_degrees",
    "argv_options",
    "argv_topology",
    "is_number",
    "launched_argv",
    "positionals",
]

_DEGREES = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "data_parallel")
_FLAG_ONLY_DEGREES = {
    "data_parallel_shard_degree": "data_parallel",
    "data_parallel_replicate_degree": "data_parallel",
}
"""torchtitan's two data-parallel options (FSDP shard and replicate degrees): no contract key, but each
sets a data-parallel degree. Every other option is read through the vocabulary (``--tp``,
``--tensor-model-parallel-size``, ``--parallelism.pipeline_parallel_degree`` name their entries), normalized:
leading dashes dropped, '-' as '_', the last dotted segment."""


def launched_argv(inputs: Mapping[str, Any]) -> Any:
    """The command as launched: a Slurm launch adds its launcher and resources (nodes, tasks, CPUs,
    GRES, partition) as trailing tokens, so a change of any of them is an argv difference."""
    command: Any = inputs.get("command")
    launcher = inputs.get("launcher", "local")
    if launcher in (None, "local"):
        return command
    if not isinstance(command, list):
        return None
    slurm = json.dumps(inputs.get("slurm"), sort_keys=True, separators=(",", ":"))
    tokens: list[Any] = [*cast("list[Any]", command), f"launcher={launcher}", f"slurm={slurm}"]
    return tokens


def is_number(token: str) -> bool:
    """``token`` reads as a number (``0.1``, ``-3``, ``1e-4``, ``nan``): an option's value, never an option."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def argv_options(tokens: list[str]) -> dict[str, str]:
    """Command-line options as name -> value: ``--lr 0.1``, ``--lr=0.1``, ``--train.batch-size 8`` (the last
    dotted segment, ``-`` as ``_``, lower case); an option followed by another option is a switch ('true')."""
    out: dict[str, str] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("-") or token.lstrip("-") == "" or is_number(token):
            continue
        flag, eq, value = token.partition("=")
        name = flag.lstrip("-").replace("-", "_").lower().rsplit(".", 1)[-1]
        if not eq:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            value = (
                following
                if following is not None and (not following.startswith("-") or is_number(following))
                else "true"
            )
        out[name] = value
    return out


def positionals(tokens: list[str]) -> list[str]:
    """The tokens that are neither an option nor an option's value (read as `argv_options` reads them)."""
    out: list[str] = []
    value_next = False
    for token in tokens:
        is_option = token.startswith("-") and token.lstrip("-") != "" and not is_number(token)
        if is_option:
            value_next = "=" not in token
        elif value_next:
            value_next = False
        else:
            out.append(token)
    return out


def argv_changes(b_argv: list[str], c_argv: list[str]) -> list[str]:
    """What differs between two command lines: each changed option (as `argv_options` names it), and
    'positional arguments' when the tokens outside options differ (another script, another order)."""
    b_opts, c_opts = argv_options(b_argv), argv_options(c_argv)
    changed = [f"--{o}" for o in sorted(set(b_opts) | set(c_opts)) if b_opts.get(o) != c_opts.get(o)]
    if positionals(b_argv) != positionals(c_argv):
        changed.append("positional arguments")
    return changed


def argv_degrees(argv: Any) -> dict[str, str]:
    """Parallel degrees a command line sets (``--tensor-model-parallel-size 2``, ``--tp=2``,
    ``--parallelism.pipeline_parallel_degree 4``): vocabulary key -> the value given."""
    tokens = [str(x) for x in cast("list[Any]", argv)] if isinstance(argv, list) else []
    out: dict[str, str] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        flag, eq, value = token.partition("=")
        name = flag.lstrip("-").replace("-", "_").lower().rsplit(".", 1)[-1]
        if not eq:
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
        key = _FLAG_ONLY_DEGREES.get(name) or vocabulary_name(name)
        if key in _DEGREES and value.lstrip("-").isdigit():
            out[key] = value
    return out


def argv_topology(
    b_command: Any,
    c_command: Any,
    b_execution: Mapping[str, Any],
    c_execution: Mapping[str, Any],
    declared: Iterable[str],
) -> tuple[list[str], list[str]]:
    """(parallel degrees the two command lines set differently, reasons): a degree changed on the command
    line is a topology change whatever else was declared, and a command line that contradicts its own
    contract's degree (``*_execution``: each side's declared execution settings) is named (what ran beats
    what was declared)."""
    b_deg, c_deg = argv_degrees(b_command), argv_degrees(c_command)
    changed: list[str] = []
    reasons: list[str] = []
    names = {canonical_key(d) for d in declared}
    for key in sorted(set(b_deg) | set(c_deg)):
        if b_deg.get(key) != c_deg.get(key):
            changed.append(key)
            if key not in names:
                reasons.append(
                    f"the command line changes {key} ({b_deg.get(key, 'unset')} -> {c_deg.get(key, 'unset')}) but it "
                    f"was not declared: a parallel degree is a topology change; declare '{key}' and compare with "
                    "per_device=true"
                )
    for key in changed:
        missing = [
            side
            for side, execution in (("baseline", b_execution), ("candidate", c_execution))
            if key not in execution
        ]
        if missing:
            reasons.append(
                f"the command line changes {key} but the {' and '.join(missing)} "
                + ("contracts do" if len(missing) > 1 else "contract does")
                + " not declare it: "
                f"add execution.{key} (baseline {b_deg.get(key, 'unset')}, candidate {c_deg.get(key, 'unset')}) so the "
                "comparison is of what ran"
            )
    for side, execution, degrees in (("baseline", b_execution, b_deg), ("candidate", c_execution, c_deg)):
        for key, value in degrees.items():
            if key in execution and str(execution[key]) != value:
                reasons.append(
                    f"the {side} command line sets {key}={value} but its contract declares {execution[key]}: fix "
                    "the contract to what ran"
                )
    return changed, reasons
