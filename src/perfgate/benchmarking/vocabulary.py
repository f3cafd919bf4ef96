"""The vocabulary of contract keys: which settings define the workload and which only change how it runs.

A *semantic* key changes what the model learns or computes (model, data, precision policy, global
batch, shapes, loss, optimizer and its hyper-parameters, sampling, seed, ...): it belongs in
``contract.invariants``, and changing it is a ``training_change``. An *execution* key changes only how
the same computation is carried out (microbatch with accumulation, parallel degrees, compile, loader
workers, fused kernels, attention backend, ...): it may go in ``contract.execution`` and be declared as
a change.

Keys are matched case-insensitively with ``-`` and spaces read as ``_``; synonyms name one entry. A key
outside the vocabulary must be classified by the caller in ``contract.classes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "REQUIRED_INVARIANTS",
    "VOCABULARY",
    "KeyClass",
    "Term",
    "canonical_key",
    "classify",
    "vocabulary_problems",
]

KeyClass = Literal["semantic", "execution"]


@dataclass(frozen=True)
class Term:
    name: str
    cls: KeyClass
    meaning: str
    synonyms: tuple[str, ...] = ()


_TERMS: tuple[Term, ...] = (
    # semantic: what is computed and learned
    Term(
        "model",
        "semantic",
        "model architecture and its configuration",
        ("model_config", "architecture", "arch"),
    ),
    Term(
        "dataset", "semantic", "dataset, its version and split", ("data", "dataset_split", "split", "corpus")
    ),
    Term("tokenizer", "semantic", "tokenizer / preprocessing of inputs", ("preprocessing", "transforms")),
    Term(
        "precision",
        "semantic",
        "numeric precision policy: dtypes of parameters, activations and math (amp, bf16, fp8, tf32)",
        (
            "dtype",
            "param_dtype",
            "compute_dtype",
            "amp",
            "autocast",
            "mixed_precision",
            "fp8",
            "fp8_recipe",
            "tf32",
            "allow_tf32",
            "matmul_precision",
            "quantization",
        ),
    ),
    Term(
        "global_batch",
        "semantic",
        "samples per optimizer step over all ranks",
        ("global_batch_size", "batch_size"),
    ),
    Term(
        "seq_len",
        "semantic",
        "sequence length / input shape",
        (
            "sequence_length",
            "max_seq_len",
            "context_length",
            "block_size",
            "input_shape",
            "image_size",
            "shapes",
        ),
    ),
    Term("loss", "semantic", "loss function and its scaling", ("loss_fn", "criterion", "label_smoothing")),
    Term("optimizer", "semantic", "optimizer algorithm", ("optim",)),
    Term(
        "optimizer_hparams",
        "semantic",
        "optimizer hyper-parameters and schedule",
        (
            "lr",
            "learning_rate",
            "lr_schedule",
            "scheduler",
            "warmup",
            "weight_decay",
            "betas",
            "momentum",
            "eps",
            "grad_clip",
            "gradient_clipping",
            "max_grad_norm",
        ),
    ),
    Term(
        "sampling", "semantic", "sample order and sampler", ("sampler", "shuffle", "data_order", "drop_last")
    ),
    Term("seed", "semantic", "seed policy", ("seed_policy", "random_seed")),
    Term("regularization", "semantic", "dropout and other regularization", ("dropout", "stochastic_depth")),
    Term("steps", "semantic", "training length", ("epochs", "train_steps", "max_steps")),
    Term("vocab_size", "semantic", "output vocabulary", ()),
    Term(
        "layers",
        "semantic",
        "model depth/width and layer types",
        ("num_layers", "hidden_size", "n_layer", "n_embd"),
    ),
    Term(
        "init",
        "semantic",
        "parameter initialization / starting checkpoint",
        ("checkpoint", "init_checkpoint"),
    ),
    Term("workload", "semantic", "a name for the whole workload", ("task",)),
    Term("hardware", "semantic", "the hardware it must run on", ("device", "device_type", "gpu")),
    Term("software", "semantic", "the software stack", ("torch_version", "framework")),
    # execution: how the same computation runs
    Term(
        "microbatch",
        "execution",
        "per-rank micro-batch size",
        ("micro_batch_size", "micro_batch", "per_device_batch"),
    ),
    Term("accumulation", "execution", "gradient accumulation steps", ("gradient_accumulation", "grad_accum")),
    Term("world_size", "execution", "number of ranks", ("nproc", "num_gpus", "devices")),
    Term("data_parallel", "execution", "data-parallel degree", ("dp",)),
    Term("tensor_parallel", "execution", "tensor-parallel degree", ("tp",)),
    Term("pipeline_parallel", "execution", "pipeline-parallel degree", ("pp",)),
    Term("context_parallel", "execution", "context-parallel degree", ("cp",)),
    Term("expert_parallel", "execution", "expert-parallel degree", ("ep",)),
    Term("sequence_parallel", "execution", "sequence parallelism", ()),
    Term("sharding", "execution", "FSDP/ZeRO sharding strategy", ("fsdp", "zero_stage", "zero")),
    Term("compile", "execution", "torch.compile and its mode", ("torch_compile", "compile_mode")),
    Term("cuda_graphs", "execution", "CUDA/MUSA graph capture", ("graphs",)),
    Term("workers", "execution", "DataLoader worker processes", ("num_workers", "loader_workers")),
    Term("pin_memory", "execution", "pinned host memory for copies", ()),
    Term("prefetch", "execution", "loader prefetching", ("prefetch_factor", "persistent_workers")),
    Term(
        "fused_kernels",
        "execution",
        "fused kernels (optimizer, norms, ...)",
        ("fused_optimizer", "fused_adamw", "foreach", "fused"),
    ),
    Term(
        "attention_backend",
        "execution",
        "attention kernel (sdpa, flash, memory-efficient)",
        ("sdpa_backend", "flash_attention", "attention_impl"),
    ),
    Term(
        "activation_checkpointing",
        "execution",
        "recomputation of activations",
        ("recompute", "gradient_checkpointing"),
    ),
    Term("memory_format", "execution", "tensor memory layout", ("channels_last",)),
    Term(
        "threads",
        "execution",
        "host thread counts",
        ("num_threads", "omp_num_threads", "mkl_num_threads", "intra_op_threads"),
    ),
    Term("cudnn_benchmark", "execution", "cuDNN autotuning", ("cudnn_autotune",)),
    Term(
        "overlap",
        "execution",
        "communication/computation overlap and bucket sizes",
        ("bucket_size", "bucket_cap_mb", "overlap_comm"),
    ),
)

VOCABULARY: dict[str, Term] = {}
for _term in _TERMS:
    for _key in (_term.name, *_term.synonyms):
        VOCABULARY[_key] = _term

REQUIRED_INVARIANTS: tuple[str, ...] = ("model", "dataset", "precision", "global_batch")
"""Semantic entries every window must declare before it can count for a keep."""


def canonical_key(key: str) -> str:
    return key.strip().lower().replace("-", "_").replace(" ", "_")


def classify(key: str, classes: Mapping[str, str] | None = None) -> tuple[KeyClass | None, str]:
    """(class, source) of ``key``: from the vocabulary, else the caller's ``classes``, else (None, 'unknown')."""
    term = VOCABULARY.get(canonical_key(key))
    if term is not None:
        return term.cls, f"vocabulary: {term.name}"
    given = (classes or {}).get(key)
    if given in ("semantic", "execution"):
        return given, "caller"  # type: ignore[return-value]  # narrowed by the membership test
    return None, "unknown"


def vocabulary_problems(
    invariants: Mapping[str, object], execution: Mapping[str, object], classes: Mapping[str, str]
) -> list[str]:
    """Keys in the wrong section, unclassified keys, and classes that contradict the vocabulary."""
    problems: list[str] = []
    for key, given in classes.items():
        term = VOCABULARY.get(canonical_key(key))
        if given not in ("semantic", "execution"):
            problems.append(f"contract.classes[{key!r}] must be 'semantic' or 'execution', got {given!r}")
        elif term is not None and term.cls != given:
            problems.append(
                f"contract.classes[{key!r}] says {given}, but {key!r} is {term.cls} ({term.meaning}); the "
                "vocabulary's class cannot be overridden"
            )
    for key in execution:
        cls, _ = classify(key, classes)
        term = VOCABULARY.get(canonical_key(key))
        if cls == "semantic":
            what = f" ({term.meaning})" if term else ""
            problems.append(
                f"execution.{key} is a semantic setting{what}: it changes what the model computes or learns, "
                "so it belongs in contract.invariants, and changing it is a training_change, not an execution "
                "change"
            )
    unknown = [k for k in (*invariants, *execution) if classify(k, classes)[0] is None]
    if unknown:
        problems.append(
            f"unknown contract keys {sorted(set(unknown))}: classify each in contract.classes as 'semantic' "
            "(changes what is computed or learned) or 'execution' (only how it runs), or use a vocabulary "
            "name (see the README's contract vocabulary)"
        )
    return problems
