"""The measurement contract: what must stay fixed (invariants) and how the run executes (execution).

Invariants name the workload (model, data, precision, shapes, global batch, seed, hardware, software,
...); execution settings are what an optimization may change (microbatch, accumulation, world size,
compile, workers, ...). Keys come from the vocabulary in :mod:`perfgate.benchmarking.workload.vocabulary`; a key
outside it needs a class in ``classes``. A semantic key declared as an execution setting is refused.
`BenchmarkContract` is the form tools take it in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.benchmarking.errors import BenchmarkError, ContractError
from perfgate.benchmarking.workload.vocabulary import (
    VOCABULARY_URI,
    canonical_section,
    vocabulary_name,
    vocabulary_problems,
)

__all__ = [
    "BenchmarkContract",
    "Contract",
    "ContractDiff",
    "check_contract",
    "check_observed",
    "data_parallel_size",
    "declared_dtypes",
    "diff_contracts",
    "precision_problems",
    "same_contract",
]

_MODEL_PARALLEL_KEYS = ("tensor_parallel", "pipeline_parallel", "context_parallel")


@dataclass(frozen=True)
class Contract:
    """A declared contract, every key under its vocabulary name (a synonym is stored as its entry).

    Raises:
        ContractError: two spellings of one entry in a section carry different values.
    """

    invariants: dict[str, Any] = field(default_factory=dict[str, Any])
    execution: dict[str, Any] = field(default_factory=dict[str, Any])
    classes: dict[str, str] = field(default_factory=dict[str, str])
    """The caller's class ('semantic' or 'execution') of keys outside the vocabulary."""

    def __post_init__(self) -> None:
        # Every consumer (cross-checks, comparisons, gates, reports) reads one name per entry, so a
        # baseline declaring a synonym and a candidate declaring the entry's name declare the same key.
        problems: list[str] = []
        for section in ("invariants", "execution", "classes"):
            canonical, collisions = canonical_section(getattr(self, section), f"contract.{section}")
            object.__setattr__(self, section, canonical)
            problems += collisions
        if problems:
            raise ContractError("; ".join(problems) + f" (the vocabulary: {VOCABULARY_URI})")

    @classmethod
    def from_mapping(cls, value: Mapping[str, Any] | None) -> Contract:
        if not value:
            return cls()
        return cls(
            dict(value.get("invariants") or {}),
            dict(value.get("execution") or {}),
            {str(k): str(v) for k, v in dict(value.get("classes") or {}).items()},
        )


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _positive_int(section: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in section:
        return None
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContractError(
            f"contract.{where}.{key} must be a positive integer, got {value!r} (the vocabulary: {VOCABULARY_URI})"
        )
    return value


def data_parallel_size(execution: Mapping[str, Any]) -> int | None:
    """``data_parallel`` if declared, else ``world_size`` divided by the model-parallel degrees.

    Raises:
        ContractError: a size is not a positive integer, or the degrees do not divide the world size.
    """
    dp = _positive_int(execution, "data_parallel", "execution")
    if dp is not None:
        return dp
    world = _positive_int(execution, "world_size", "execution")
    if world is None:
        return None
    model = math.prod(_positive_int(execution, k, "execution") or 1 for k in _MODEL_PARALLEL_KEYS)
    if world % model:
        raise ContractError(
            f"world_size {world} is not divisible by the model-parallel degrees (product {model}); "
            "declare execution.data_parallel explicitly"
        )
    return world // model


def check_contract(contract: Contract) -> list[str]:
    """Contradictions within one contract, as sentences; empty when it is consistent.

    Every key must be in the vocabulary or classified in ``classes``, and no semantic key may be an
    execution setting. ``invariants.global_batch`` must equal ``execution.microbatch x accumulation x data-parallel size``
    whenever ``microbatch`` is declared (accumulation defaults to 1 only when the rest is complete); without
    it, a declared global_batch is checked against the batch the run measures (`check_observed`). A
    single-process run needs no ``data_parallel`` or ``world_size``: the data-parallel size is 1 unless declared.

    Every refusal ends by naming the vocabulary resource, where the keys and their meanings are.

    Raises:
        ContractError: a batch or parallelism entry is not a positive integer.
    """
    problems = _problems(contract)
    if problems and not any(VOCABULARY_URI in p for p in problems):
        problems[-1] += f" (the vocabulary: {VOCABULARY_URI})"
    return problems


def _problems(contract: Contract) -> list[str]:
    problems: list[str] = vocabulary_problems(contract.invariants, contract.execution, contract.classes)
    overlap = sorted(set(contract.invariants) & set(contract.execution))
    if overlap:
        problems.append(f"keys declared both as invariant and as execution setting: {overlap}")
    inv, exe = contract.invariants, contract.execution
    global_batch = _positive_int(inv, "global_batch", "invariants")
    micro = _positive_int(exe, "microbatch", "execution")
    accumulation = _positive_int(exe, "accumulation", "execution")
    dp = data_parallel_size(exe)
    if micro is None:
        # No product to check: a declared global_batch is held to the batch a run measures, accumulation to
        # the backward passes it counts, world_size to its ranks (check_observed); compare_benchmarks
        # compares the sides' measured batches.
        return problems
    missing = [
        name
        for name, value in (
            ("invariants.global_batch", global_batch),
            ("execution.microbatch", micro),
        )
        if value is None
    ]
    if missing:
        problems.append(
            "global batch cannot be cross-checked: declare "
            + ", ".join(missing)
            + " (global_batch = microbatch x accumulation x data_parallel)"
        )
        return problems
    assert global_batch is not None and micro is not None
    # a single process needs no data_parallel: 1 unless declared, and a run with more ranks measures a
    # larger batch than its global_batch (check_observed refuses it)
    dp = dp or 1
    product = micro * (accumulation or 1) * dp
    if product != global_batch:
        problems.append(
            f"global_batch {global_batch} != microbatch {micro} x accumulation {accumulation or 1} x "
            f"data_parallel {dp} = {product}"
        )
    return problems


_DEVICE_KINDS: dict[str, set[str]] = {
    "cpu": {"cpu"},
    "cuda": {"cuda"},
    "gpu": {"cuda", "rocm", "hip", "musa", "xpu", "mps"},
    "rocm": {"rocm", "hip", "cuda"},
    "hip": {"rocm", "hip", "cuda"},
    "musa": {"musa"},
    "mps": {"mps"},
    "xpu": {"xpu"},
}


def check_observed(
    contract: Contract,
    world_size: int,
    samples_per_step: int | None,
    *,
    backward_per_step: int | None = None,
    device_kind: str | None = None,
    device_name: str | None = None,
    param_dtype: str | None = None,
    autocast: Sequence[str] = (),
) -> list[str]:
    """Contradictions between the contract and what the run showed (ranks that wrote records, samples,
    backward passes per optimizer step, the device, the dtype of the model's parameters and the autocast
    dtype of its training forwards, see `precision_problems`)."""
    problems: list[str] = precision_problems(contract, param_dtype, autocast)
    accumulation = contract.execution.get("accumulation")
    if isinstance(accumulation, int) and backward_per_step is not None and backward_per_step != accumulation:
        problems.append(
            f"contract declares accumulation {accumulation} but the harness counted {backward_per_step} backward "
            "pass(es) per optimizer step"
        )
    # hardware's synonyms (device, device_type, gpu) are stored under it
    for declared in (contract.execution.get("hardware"), contract.invariants.get("hardware")):
        if not isinstance(declared, str) or device_kind is None:
            continue
        want = declared.strip().lower()
        kinds = _DEVICE_KINDS.get(want)
        ok = device_kind.lower() in kinds if kinds is not None else want in (device_name or "").lower()
        if not ok:
            problems.append(
                f"contract declares hardware {declared!r} but the ranks ran on {device_kind}"
                + (f" ({device_name})" if device_name else "")
            )
    declared_world = contract.execution.get("world_size")
    if isinstance(declared_world, int) and declared_world != world_size:
        problems.append(f"contract declares world_size {declared_world} but {world_size} rank(s) ran")
    global_batch = contract.invariants.get("global_batch")
    if isinstance(global_batch, int) and samples_per_step is not None and samples_per_step != global_batch:
        problems.append(
            f"contract declares global_batch {global_batch} but the ranks processed {samples_per_step} "
            "samples per optimizer step"
        )
    return problems


_DTYPE_WORDS: dict[str, str] = {
    **dict.fromkeys(("float64", "fp64", "f64", "double", "64"), "float64"),
    **dict.fromkeys(("float32", "fp32", "f32", "float", "single", "tf32", "32"), "float32"),
    **dict.fromkeys(("bfloat16", "bf16"), "bfloat16"),
    **dict.fromkeys(("float16", "fp16", "f16", "half", "16"), "float16"),
}
"""Words of a declared precision that name a parameter or autocast dtype (``bf16-mixed``, ``torch.float32``,
Lightning's ``16-mixed``); tf32 is float32 storage. Other words (``amp``, ``fp8``, ``mixed``) name none."""


def declared_dtypes(value: object) -> set[str]:
    """The dtypes a declared precision names (empty: none it can be checked by)."""
    if not isinstance(value, str):
        return set()
    return {_DTYPE_WORDS[w] for w in re.split(r"[^a-z0-9]+", value.lower()) if w in _DTYPE_WORDS}


def precision_problems(contract: Contract, param_dtype: str | None, autocast: Sequence[str]) -> list[str]:
    """Where the declared ``precision`` (or its members ``param_dtype`` / ``compute_dtype``) names no dtype the
    run used: the dtype holding most of the model's parameters, or the autocast dtype of its training
    forwards (``autocast``: "none" for forwards without it). A declaration naming no dtype is not judged."""
    if param_dtype is None:
        return []
    casts = sorted(a for a in autocast if a != "none")
    compute = set(casts) or {param_dtype}
    ran = f"the model's parameters ran {param_dtype}" + (
        f" under autocast to {', '.join(casts)}" if casts else " without autocast"
    )
    problems: list[str] = []
    for key, seen in (
        ("precision", {param_dtype, *casts}),
        ("param_dtype", {param_dtype}),
        ("compute_dtype", compute),
    ):
        value = contract.invariants.get(key, contract.execution.get(key))
        named = declared_dtypes(value)
        if named and not named & seen:
            problems.append(f"contract declares {key} {value!r} but {ran}")
    return problems


def same_contract(contracts: Sequence[Contract]) -> list[str]:
    """Keys on which repeated windows of one side disagree (they should be one measurement)."""
    problems: list[str] = []
    for section in ("invariants", "execution"):
        keys = sorted({k for c in contracts for k in getattr(c, section)})
        for key in keys:
            values = {_canon(getattr(c, section).get(key, "<absent>")) for c in contracts}
            if len(values) > 1:
                problems.append(f"{section}.{key} differs between windows of the same side")
    return problems


@dataclass(frozen=True)
class ContractDiff:
    """How a candidate's contract differs from the baseline's, against the declared changes."""

    changed_invariants: list[str]
    actual_changes: list[str]
    undeclared_changes: list[str]
    declared_but_absent: list[str]

    @property
    def comparable(self) -> bool:
        return not (self.changed_invariants or self.undeclared_changes or self.declared_but_absent)

    def reasons(self) -> list[str]:
        out = [f"invariant {k!r} changed" for k in self.changed_invariants]
        out += [f"execution setting {k!r} changed but was not declared" for k in self.undeclared_changes]
        out += [
            f"declared change {k!r} did not happen (same value on both sides)"
            for k in self.declared_but_absent
        ]
        return out


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [k for k in keys if k not in a or k not in b or _canon(a[k]) != _canon(b[k])]


def diff_contracts(baseline: Contract, candidate: Contract, declared_changes: Iterable[str]) -> ContractDiff:
    """Changed invariants, and execution changes compared with ``declared_changes`` (setting names)."""
    declared = sorted({vocabulary_name(d) for d in declared_changes})
    actual = _changed(baseline.execution, candidate.execution)
    return ContractDiff(
        changed_invariants=_changed(baseline.invariants, candidate.invariants),
        actual_changes=actual,
        undeclared_changes=[k for k in actual if k not in declared],
        declared_but_absent=[k for k in declared if k not in actual],
    )


class BenchmarkContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invariants: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="Semantic settings that must stay fixed between baseline and candidate: model, dataset, "
        "precision, global_batch (these four are required for a keep), seq_len, loss, optimizer, "
        "optimizer_hparams, sampling, seed, ... (vocabulary keys, JSON values).",
    )
    execution: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="Execution settings an optimization may change: microbatch, accumulation, world_size, "
        "data_parallel, tensor_parallel, pipeline_parallel, compile, workers, pin_memory, fused_kernels, "
        "attention_backend, threads, ... A semantic key here is refused. Checked: global_batch = microbatch "
        "x accumulation x data_parallel.",
    )
    classes: dict[str, Literal["semantic", "execution"]] = Field(
        default_factory=dict[str, Literal["semantic", "execution"]],
        description="Class of each key outside the vocabulary: 'semantic' (changes what is computed or "
        "learned) or 'execution' (only how it runs). Unclassified unknown keys are refused.",
    )

    @model_validator(mode="after")
    def _canonical(self) -> BenchmarkContract:
        """Keys under their vocabulary names from here on: what is recorded, compared and gated."""
        try:
            contract = Contract(self.invariants, self.execution, dict(self.classes))
        except BenchmarkError as exc:
            raise ValueError(str(exc)) from exc
        self.invariants, self.execution = contract.invariants, contract.execution
        self.classes = {k: v for k, v in contract.classes.items() if v in ("semantic", "execution")}  # type: ignore[misc]  # values validated above
        return self

    def contract(self) -> Contract:
        """The declared contract (its keys already canonical)."""
        return Contract(dict(self.invariants), dict(self.execution), dict(self.classes))
