"""Where a setting shows in what a run records: its measured environment fingerprint, the environment
variables set for it, its command-line options.

A declared change is exempt from "must match" exactly where its setting shows, and nowhere else:
``compare_benchmarks`` classifies each difference with `explains`, and the keep's ``same_environment``
gate lets a fingerprint field differ only when `explains` names a declared change for it. Everything else
a run records (devices, versions, any other switch) must still match. A declared change that names no
setting here (``code``, ``argv``) exempts nothing in the fingerprint.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from perfgate.benchmarking.workload.vocabulary import VOCABULARY, canonical_key
from perfgate.harness.runtime_env import ENV_VARS

__all__ = ["EXECUTION_KEYS", "WHERE_SHOWN", "Place", "Shows", "entries_showing", "explains", "option_name"]

Place = Literal["fingerprint", "env", "option"]
"""``fingerprint``: a field of a window's measured environment (``environment_fingerprint``); ``env``: an
environment variable set for the run (the window's ``env`` input); ``option``: a command-line option, by
`option_name`."""


@dataclass(frozen=True)
class Shows:
    """Where one vocabulary entry's setting can show, besides its contract key."""

    fingerprint: tuple[str, ...] = ()
    """Fields of the measured environment fingerprint (perfgate.harness.runtime_env) it changes."""
    env: tuple[str, ...] = ()
    """Environment variables (fnmatch patterns, case-sensitive) that set it."""
    options: tuple[str, ...] = ()
    """Command-line options that set it, beyond the entry's own vocabulary spellings (always counted)."""


_VISIBLE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "MUSA_VISIBLE_DEVICES")
_RANKS = Shows(fingerprint=("device_count", "device_names", *_VISIBLE), env=("WORLD_SIZE", *_VISIBLE))
_LAUNCHER = ("nproc_per_node", "nnodes", "num_nodes", "nodes", "gpus_per_node")
"""torchrun's and the frameworks' options that multiply into the world size."""

WHERE_SHOWN: dict[str, Shows] = {
    "microbatch": Shows(),
    "accumulation": Shows(),
    # more ranks on one host see more devices, often through a visibility variable
    "world_size": Shows(_RANKS.fingerprint, _RANKS.env, _LAUNCHER),
    "data_parallel": Shows(options=("data_parallel_shard_degree", "data_parallel_replicate_degree")),
    "tensor_parallel": Shows(),
    "pipeline_parallel": Shows(),
    "context_parallel": Shows(),
    "expert_parallel": Shows(),
    "sequence_parallel": Shows(),
    "expert_padding": Shows(),
    "sharding": Shows(),
    "compile": Shows(env=("TORCHINDUCTOR_*", "TORCHDYNAMO_*", "TORCH_COMPILE_*")),
    "cuda_graphs": Shows(env=("TORCHINDUCTOR_*CUDAGRAPH*",)),
    # DeepEP/HybridEP read NVSHMEM's and their own variables (buffer sizes, SM counts)
    "token_dispatcher": Shows(env=("NVSHMEM_*", "DEEPEP_*", "DEEP_EP_*", "HYBRID_EP_*")),
    "workers": Shows(),
    "pin_memory": Shows(),
    "prefetch": Shows(),
    "fused_kernels": Shows(),
    "attention_backend": Shows(),
    # the harness reads which input dimension is the batch; the setting shows as its own option only
    "batch_first": Shows(),
    "activation_checkpointing": Shows(),
    "memory_format": Shows(),
    # torch reads OMP_NUM_THREADS (and MKL's) at import: the variable and torch's count change together
    "threads": Shows(
        fingerprint=("OMP_NUM_THREADS", "MKL_NUM_THREADS", "num_threads", "interop_threads"),
        env=("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"),
        options=("interop_threads", "num_interop_threads"),
    ),
    "cudnn_benchmark": Shows(fingerprint=("cudnn_benchmark",)),
    # Megatron's comm/compute overlap needs one hardware queue per device
    "overlap": Shows(env=("CUDA_DEVICE_MAX_CONNECTIONS",)),
    # semantic: exempt only where a training_change declares it (the classification gate holds the rest)
    "precision": Shows(
        fingerprint=("allow_tf32", "cudnn_allow_tf32", "matmul_precision"),
        env=("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"),
    ),
}
"""Vocabulary entry -> where its setting shows. Every execution entry has a row (a test holds this);
a fingerprint field in no row (device, versions, ``deterministic_algorithms``) no declaration exempts."""

EXECUTION_KEYS: tuple[str, ...] = tuple(
    dict.fromkeys(t.name for t in VOCABULARY.values() if t.cls == "execution")
)
"""The vocabulary's execution entries, in its order."""

_OPTIONS: dict[str, str] = {
    **{spelling: term.name for spelling, term in VOCABULARY.items() if term.name in WHERE_SHOWN},
    **{option: entry for entry, shows in WHERE_SHOWN.items() for option in shows.options},
}
"""Command-line option name -> the entry it sets."""


def option_name(flag: str) -> str:
    """A command-line option as compared: leading dashes dropped, the last dotted segment (``--train.
    num-workers`` is ``num_workers``), spelled as `canonical_key` spells it."""
    return canonical_key(flag.lstrip("-").rsplit(".", 1)[-1])


def entries_showing(place: Place, name: str) -> tuple[str, ...]:
    """The entries whose setting shows at ``name`` (a fingerprint field, an environment variable, or an
    option named as `option_name` names it), in table order."""
    if place == "option":
        entry = _OPTIONS.get(option_name(name))
        return (entry,) if entry is not None else ()
    return tuple(
        entry
        for entry, shows in WHERE_SHOWN.items()
        if (name in shows.fingerprint if place == "fingerprint" else _matches(name, shows.env))
        or (place == "fingerprint" and name in ENV_VARS and _matches(name, shows.env))
    )


def _matches(variable: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(variable, p) for p in patterns)


def explains(declared: Iterable[str], place: Place, name: str) -> str | None:
    """The declared change that explains a difference at ``name``, or None.

    A vocabulary name (any spelling) explains where its entry shows (`WHERE_SHOWN`). ``env:VAR``
    explains the variable itself (set for the run, or as the process saw it) and the fingerprint fields
    of the entries ``VAR`` sets (``env:OMP_NUM_THREADS``: torch's ``num_threads``). A name outside the
    vocabulary (a key the caller classified) explains only a variable or an option spelled as it is,
    never another fingerprint field.
    """
    entries = set(entries_showing(place, name))
    variable = place == "env" or (place == "fingerprint" and name in ENV_VARS)
    for d in declared:
        if d.lower().startswith("env:"):
            var = d[4:]
            if variable and var == name:
                return d
            if place == "fingerprint" and not variable and entries & set(entries_showing("env", var)):
                return d
            continue
        term = VOCABULARY.get(canonical_key(d))
        if term is not None:
            if term.name in entries:
                return d
        elif (variable or place == "option") and canonical_key(d) == option_name(name):
            return d
    return None
