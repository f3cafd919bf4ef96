"""The vocabulary of contract keys: which settings define the workload and which only change how it runs.

A *semantic* key changes what the model learns or computes (model, data, precision policy, global
batch, shapes, loss, optimizer and its hyper-parameters, sampling, seed, ...): it belongs in
``contract.invariants``, and changing it is a ``training_change``. An *execution* key changes only how
the same computation is carried out (microbatch with accumulation, parallel degrees, compile, loader
workers, fused kernels, attention backend, ...): it may go in ``contract.execution`` and be declared as
a change.

Keys are matched case-insensitively with ``-`` and spaces read as ``_``; synonyms name one entry, and a
contract is stored and compared under the entries' names (`canonical_section`). A key outside the
vocabulary must be classified by the caller in ``contract.classes``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "NOT_KEYS",
    "REQUIRED_INVARIANTS",
    "VOCABULARY",
    "VOCABULARY_URI",
    "KeyClass",
    "Term",
    "canonical_key",
    "canonical_section",
    "classify",
    "nearest_entries",
    "render_vocabulary",
    "vocabulary_name",
    "vocabulary_problems",
]

KeyClass = Literal["semantic", "execution"]


@dataclass(frozen=True)
class Term:
    """One entry. A synonym is another spelling of the entry itself (stored under ``name``); a member is a
    distinct setting of the same kind (``lr`` of ``optimizer_hparams``), classified by the entry but kept
    under its own name, so two members in one contract stay two keys."""

    name: str
    cls: KeyClass
    meaning: str
    synonyms: tuple[str, ...] = ()
    members: tuple[str, ...] = ()


_TERMS: tuple[Term, ...] = (
    # semantic: what is computed and learned
    Term(
        "model",
        "semantic",
        "model architecture and its configuration",
        ("model_config", "architecture", "arch", "model_name", "model_name_or_path", "model_type"),
    ),
    Term(
        "dataset",
        "semantic",
        "dataset, its version and split",
        ("data", "corpus", "dataset_name", "data_path", "train_data"),
        ("split", "dataset_split"),
    ),
    Term(
        "tokenizer",
        "semantic",
        "tokenizer / preprocessing of inputs",
        ("tokenizer_name",),
        ("preprocessing", "transforms"),
    ),
    Term(
        "precision",
        "semantic",
        "numeric precision policy: dtypes of parameters, activations and math (amp, bf16, fp8, tf32)",
        ("dtype", "torch_dtype"),
        (
            "param_dtype",
            "compute_dtype",
            "amp",
            "autocast",
            "mixed_precision",
            "bf16",
            "fp16",
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
        # A bare batch size means the samples one optimizer step sees; the frameworks' per-device
        # spellings are microbatch synonyms below.
        (
            "global_batch_size",
            "batch_size",
            "batch",
            "gbs",
            "train_batch_size",
            "total_batch_size",
            "effective_batch_size",
        ),
    ),
    Term(
        "batch_first",
        "execution",
        "layout of the model's inputs: true when the batch is their first dimension, false when it is the second "
        "(sequence-first, (sequence, batch, ...)); the measured batch is read from that dimension",
        ("batch_layout",),
    ),
    Term(
        "seq_len",
        "semantic",
        "sequence length / input shape",
        (
            "sequence_length",
            "seq_length",
            "max_seq_len",
            "max_seq_length",
            "max_length",
            "context_length",
            "block_size",
        ),
        ("input_shape", "image_size", "shapes"),
    ),
    Term("loss", "semantic", "loss function and its scaling", ("loss_fn", "criterion"), ("label_smoothing",)),
    Term("optimizer", "semantic", "optimizer algorithm", ("optim",)),
    Term(
        "optimizer_hparams",
        "semantic",
        "optimizer hyper-parameters and schedule",
        (),
        (
            "lr",
            "min_lr",
            "lr_schedule",
            "scheduler",
            "warmup",
            "weight_decay",
            "betas",
            "momentum",
            "eps",
            "grad_clip",
        ),
    ),
    Term(
        "sampling",
        "semantic",
        "sample order and sampler",
        (),
        ("sampler", "shuffle", "data_order", "drop_last", "replacement"),
    ),
    Term("seed", "semantic", "seed policy", ("seed_policy", "random_seed")),
    Term(
        "regularization", "semantic", "dropout and other regularization", (), ("dropout", "stochastic_depth")
    ),
    Term("steps", "semantic", "training length", ("train_steps", "max_steps", "train_iters"), ("epochs",)),
    Term("vocab_size", "semantic", "output vocabulary", ()),
    Term(
        "layers",
        "semantic",
        "model depth/width and layer types",
        ("num_layers", "n_layer", "num_hidden_layers"),
        (
            "hidden_size",
            "num_attention_heads",
            "ffn_hidden_size",
            "moe_ffn_hidden_size",
            "num_shared_experts",
            "moe_shared_expert_intermediate_size",
            "moe_layer_freq",
        ),
    ),
    # Routing decides which experts see each token and how the router learns: a change of any of these is
    # a training change (dropping tokens over capacity changes the outputs; the balancing loss changes the
    # gradients), never a way to run the same computation faster.
    Term(
        "moe_routing",
        "semantic",
        "mixture-of-experts routing: expert count, experts per token, capacity and token dropping, "
        "balancing losses, router scoring",
        ("routing",),
        (
            "num_experts",
            "router_topk",
            "capacity_factor",
            "eval_capacity_factor",
            "min_capacity",
            "drop_tokens",
            "dropless",
            "token_drop_policy",
            "aux_loss_coeff",
            "z_loss_coeff",
            "load_balancing_type",
            "router_score_function",
            "router_pre_softmax",
            "router_topk_scaling_factor",
            "router_num_groups",
            "router_group_topk",
            "router_expert_bias",
            "router_bias_update_rate",
            "router_dtype",
            "noisy_gate_policy",
        ),
    ),
    Term(
        "init",
        "semantic",
        "parameter initialization / starting checkpoint",
        ("checkpoint", "init_checkpoint"),
    ),
    Term("workload", "semantic", "a name for the whole workload", ("task",)),
    Term("hardware", "semantic", "the hardware it must run on", ("device", "device_type", "gpu")),
    Term("software", "semantic", "the software stack", (), ("torch_version", "framework")),
    Term(
        "objective",
        "semantic",
        "what the experiment is judged on, the same on both sides: 'step_time' (the steady state, the default) "
        "or 'time_to_train' (the whole job: start-up, compile, evaluation and checkpoints too; measure with "
        "job=true, and a keep whose job got slower is refused)",
        ("optimization_objective", "target_metric"),
    ),
    # execution: how the same computation runs
    Term(
        "microbatch",
        "execution",
        "per-rank micro-batch size",
        (
            "micro_batch_size",
            "micro_batch",
            "mbs",
            "per_device_batch",
            "per_device_batch_size",
            "per_device_train_batch_size",
            "per_gpu_train_batch_size",
            "train_micro_batch_size_per_gpu",
            "local_batch_size",
        ),
    ),
    Term(
        "accumulation",
        "execution",
        "gradient accumulation steps",
        (
            "gradient_accumulation",
            "gradient_accumulation_steps",
            "grad_accum",
            "grad_accum_steps",
            "accumulation_steps",
            "accumulate_grad_batches",
        ),
    ),
    Term("world_size", "execution", "number of ranks", ("nproc", "num_gpus", "devices")),
    Term(
        "data_parallel",
        "execution",
        "data-parallel degree",
        ("dp", "dp_size", "dp_degree", "data_parallel_size", "data_parallel_degree"),
    ),
    Term(
        "tensor_parallel",
        "execution",
        "tensor-parallel degree",
        (
            "tp",
            "tp_size",
            "tp_degree",
            "tensor_parallel_size",
            "tensor_parallel_degree",
            "tensor_model_parallel_size",
        ),
    ),
    Term(
        "pipeline_parallel",
        "execution",
        "pipeline-parallel degree",
        (
            "pp",
            "pp_size",
            "pp_degree",
            "pipeline_parallel_size",
            "pipeline_parallel_degree",
            "pipeline_model_parallel_size",
        ),
    ),
    Term(
        "context_parallel",
        "execution",
        "context-parallel degree",
        ("cp", "cp_size", "cp_degree", "context_parallel_size", "context_parallel_degree"),
    ),
    Term(
        "expert_parallel",
        "execution",
        "expert-parallel degree",
        (
            "ep",
            "ep_size",
            "ep_degree",
            "expert_parallel_size",
            "expert_parallel_degree",
            "expert_model_parallel_size",
        ),
    ),
    Term("sequence_parallel", "execution", "sequence parallelism", ()),
    Term(
        "expert_padding",
        "execution",
        "each expert's input padded to its capacity: the same tokens are kept and dropped, in fixed shapes "
        "(the capacity itself is moe_routing's capacity_factor)",
        ("moe_pad_expert_input_to_capacity", "pad_expert_input_to_capacity"),
    ),
    Term(
        "sharding",
        "execution",
        "FSDP/ZeRO sharding strategy",
        ("sharding_strategy", "fsdp_sharding_strategy"),
        ("fsdp", "zero_stage"),
    ),
    Term("compile", "execution", "torch.compile and its mode", ("torch_compile",), ("compile_mode",)),
    # Megatron's --enable-cuda-graph / --external-cuda-graph switch graphs on; --cuda-graph-impl picks who
    # captures (local, transformer_engine; none is off) and --cuda-graph-scope which layers' parts
    Term(
        "cuda_graphs",
        "execution",
        "CUDA/MUSA graph capture and replay, and its scope",
        ("graphs", "cuda_graph", "enable_cuda_graph", "enable_cuda_graphs", "use_cuda_graph", "cudagraphs"),
        ("cuda_graph_impl", "external_cuda_graph", "cuda_graph_scope", "musa_graph", "enable_musa_graph"),
    ),
    # Megatron-Core's --moe-token-dispatcher-type {allgather, alltoall, flex}; flex runs DeepEP or HybridEP
    # (--moe-enable-deepep, --moe-flex-dispatcher-backend); torchtitan's expert_parallel_comm_backend
    # {standard, deepep, hybridep}
    Term(
        "token_dispatcher",
        "execution",
        "mixture-of-experts token dispatcher and its exchange backend (allgather, alltoall, flex with DeepEP "
        "or HybridEP): the same tokens reach the same experts",
        ("moe_token_dispatcher_type", "token_dispatcher_type", "moe_token_dispatcher", "dispatcher_type"),
        (
            "moe_enable_deepep",
            "moe_flex_dispatcher_backend",
            "flex_dispatcher_backend",
            "expert_parallel_comm_backend",
        ),
    ),
    Term(
        "workers",
        "execution",
        "DataLoader worker processes",
        ("num_workers", "loader_workers", "dataloader_num_workers"),
    ),
    Term("pin_memory", "execution", "pinned host memory for copies", ("dataloader_pin_memory",)),
    Term("prefetch", "execution", "loader prefetching", ("prefetch_factor",), ("persistent_workers",)),
    Term(
        "fused_kernels",
        "execution",
        "fused kernels (optimizer, norms, ...)",
        (),
        ("fused_optimizer", "fused_adamw", "foreach", "fused"),
    ),
    Term(
        "attention_backend",
        "execution",
        "attention kernel (sdpa, flash, memory-efficient)",
        ("sdpa_backend", "flash_attention", "attention_impl", "attn_implementation", "use_flash_attn"),
    ),
    Term(
        "activation_checkpointing",
        "execution",
        "recomputation of activations",
        ("recompute", "gradient_checkpointing", "activation_recomputation"),
        ("recompute_granularity",),
    ),
    Term("memory_format", "execution", "tensor memory layout", (), ("channels_last",)),
    Term(
        "threads",
        "execution",
        "host thread counts",
        ("num_threads",),
        ("omp_num_threads", "mkl_num_threads", "intra_op_threads"),
    ),
    Term("cudnn_benchmark", "execution", "cuDNN autotuning", ("cudnn_autotune",)),
    Term(
        "overlap",
        "execution",
        "communication/computation overlap and bucket sizes",
        (),
        ("bucket_size", "bucket_cap_mb", "overlap_comm"),
    ),
)

_MEMBER_SPELLINGS: dict[str, str] = {
    "learning_rate": "lr",
    "lr_scheduler_type": "lr_schedule",
    "lr_warmup_steps": "warmup",
    "warmup_steps": "warmup",
    "warmup_ratio": "warmup",
    "gradient_clipping": "grad_clip",
    "max_grad_norm": "grad_clip",
    "clip_grad": "grad_clip",
    "adam_epsilon": "eps",
    "num_train_epochs": "epochs",
    "num_epochs": "epochs",
    "max_epochs": "epochs",
    "n_embd": "hidden_size",
    "d_model": "hidden_size",
    "n_head": "num_attention_heads",
    "intermediate_size": "ffn_hidden_size",
    "zero": "zero_stage",
    "torch_compile_mode": "compile_mode",
    # Mixture-of-experts spellings: Megatron-Core's options and Megatron-Bridge's config fields (--num-experts
    # is num_moe_experts in its config), Megatron-DeepSpeed's options, DeepSpeed's MoE layer arguments,
    # torchtitan's MoEArgs, Hugging Face MoE configs, MegaBlocks' options.
    "num_moe_experts": "num_experts",
    "moe_num_experts": "num_experts",
    "moe_router_topk": "router_topk",
    "topk": "router_topk",
    "top_k": "router_topk",
    "moe_top_k": "router_topk",
    "num_experts_per_tok": "router_topk",
    "moe_expert_capacity_factor": "capacity_factor",
    "moe_train_capacity_factor": "capacity_factor",
    "moe_capacity_factor": "capacity_factor",
    "moe_eval_capacity_factor": "eval_capacity_factor",
    "moe_min_capacity": "min_capacity",
    "disable_moe_token_dropping": "dropless",
    "moe_token_drop_policy": "token_drop_policy",
    "moe_aux_loss_coeff": "aux_loss_coeff",
    "moe_loss_coeff": "aux_loss_coeff",
    "moe_loss_weight": "aux_loss_coeff",
    "load_balance_coeff": "aux_loss_coeff",
    "router_aux_loss_coef": "aux_loss_coeff",
    "moe_z_loss_coeff": "z_loss_coeff",
    "moe_router_load_balancing_type": "load_balancing_type",
    "moe_router_score_function": "router_score_function",
    "score_func": "router_score_function",
    "moe_router_pre_softmax": "router_pre_softmax",
    "moe_router_topk_scaling_factor": "router_topk_scaling_factor",
    "route_scale": "router_topk_scaling_factor",
    "moe_router_num_groups": "router_num_groups",
    "moe_router_group_topk": "router_group_topk",
    "moe_router_enable_expert_bias": "router_expert_bias",
    "moe_router_bias_update_rate": "router_bias_update_rate",
    "moe_router_dtype": "router_dtype",
}
"""Framework spellings of a member (not of the entry): stored under the member's name."""

VOCABULARY: dict[str, Term] = {}
"""Every spelling (entry, synonym, member, member spelling) -> its entry."""
_STORED_AS: dict[str, str] = {}
"""Every spelling -> the name a contract stores it under."""
for _term in _TERMS:
    for _key, _name in (
        *((k, _term.name) for k in (_term.name, *_term.synonyms)),
        *((k, k) for k in _term.members),
    ):
        assert _key not in VOCABULARY, f"{_key!r} names two vocabulary entries"
        VOCABULARY[_key], _STORED_AS[_key] = _term, _name
for _key, _member in _MEMBER_SPELLINGS.items():
    assert _key not in VOCABULARY and _member in _STORED_AS, _key
    VOCABULARY[_key], _STORED_AS[_key] = VOCABULARY[_member], _member

NOT_KEYS: dict[str, str] = {
    "nproc_per_node": "world_size (nproc_per_node x nodes), or data_parallel and the model-parallel degrees",
    "nnodes": "world_size (nodes x ranks per node)",
    "num_nodes": "world_size (nodes x ranks per node)",
    "nodes": "world_size (nodes x ranks per node)",
    "gpus_per_node": "world_size (nodes x ranks per node)",
    "local_rank": "nothing: a rank's index is not a setting of the run",
    "rank": "nothing: a rank's index is not a setting of the run",
}
"""Framework spellings that name no single entry: refused with what to declare instead."""

VOCABULARY_URI = "skill://perfgate/references/vocabulary.md"
"""Where the server serves `render_vocabulary` (every key, class and synonym); refusals name it."""

REQUIRED_INVARIANTS: tuple[str, ...] = ("model", "dataset", "precision", "global_batch")
"""Semantic entries every window must declare before it can count for a keep."""


def canonical_key(key: str) -> str:
    """``key`` as spelled for lookup: stripped, lower case, ``-`` and spaces as ``_``."""
    return key.strip().lower().replace("-", "_").replace(" ", "_")


def vocabulary_name(key: str) -> str:
    """The name a contract stores ``key`` under: its entry's for a synonym, its member's for a member's
    spelling; a key outside the vocabulary keeps its own name, spelled as `canonical_key` spells it."""
    spelled = canonical_key(key)
    return _STORED_AS.get(spelled, spelled)


def canonical_section(section: Mapping[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """``section`` with every key under its vocabulary name, and the keys that collide: two spellings of one
    entry with different values (equal values merge into one)."""
    out: dict[str, Any] = {}
    spellings: dict[str, list[str]] = {}
    problems: list[str] = []
    for key, value in section.items():
        name = vocabulary_name(key)
        spellings.setdefault(name, []).append(key)
        if name in out and _canon(out[name]) != _canon(value):
            problems.append(
                f"{where} names {name!r} twice with different values ({', '.join(map(repr, spellings[name]))}): "
                f"keep one, as {where}.{name}"
            )
            continue
        out[name] = value
    return out, problems


def _canon(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def nearest_entries(key: str, limit: int = 3) -> list[str]:
    """Vocabulary entries whose name or a synonym is spelled like ``key``, nearest first, as
    ``'name'`` or ``'name (as synonym)'``."""
    out: dict[str, str] = {}
    for match in difflib.get_close_matches(canonical_key(key), VOCABULARY, n=limit * 3, cutoff=0.6):
        name = _STORED_AS[match]
        out.setdefault(name, name if match == name else f"{name} (as {match})")
    return list(out.values())[:limit]


def classify(key: str, classes: Mapping[str, str] | None = None) -> tuple[KeyClass | None, str]:
    """(class, source) of ``key``: from the vocabulary, else the caller's ``classes``, else (None, 'unknown')."""
    term = VOCABULARY.get(canonical_key(key))
    if term is not None:
        return term.cls, f"vocabulary: {term.name}"
    given = (classes or {}).get(key)
    if given is None:
        given = (classes or {}).get(vocabulary_name(key))
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
    for key in sorted({k for k in (*invariants, *execution) if canonical_key(k) in NOT_KEYS}):
        problems.append(f"{key!r} is not a contract key: declare {NOT_KEYS[canonical_key(key)]}")
    unknown = sorted(
        {
            k
            for k in (*invariants, *execution)
            if classify(k, classes)[0] is None and canonical_key(k) not in NOT_KEYS
        }
    )
    if unknown:
        near = {k: n for k in unknown if (n := nearest_entries(k))}
        problems.append(
            f"unknown contract keys {unknown}: use a vocabulary name, or classify each in contract.classes as "
            "'semantic' (changes what is computed or learned) or 'execution' (only how it runs)"
            + (
                "; nearest vocabulary entries: "
                + "; ".join(f"{k!r}: {', '.join(n)}" for k, n in near.items())
                if near
                else ""
            )
        )
    if problems:
        problems.append(f"the vocabulary (every key, class and synonym) is the resource {VOCABULARY_URI}")
    return problems


def render_vocabulary() -> str:
    """The vocabulary as the markdown the server serves at `VOCABULARY_URI`."""
    lines = [
        "# The contract vocabulary",
        "",
        'Every benchmark window declares `contract={"invariants": {...}, "execution": {...}, '
        '"classes": {...}}`. Keys are read case-insensitively, `-` and spaces as `_`, and every synonym is '
        "stored, compared and reported under its entry's name (a baseline declaring `batch_size` and a "
        "candidate declaring `global_batch` declare one key). Two spellings of one entry with different "
        "values are refused. A member is a setting of its entry's kind and class kept under its own name "
        "(`lr` and `weight_decay` are two keys); the spellings in brackets are stored as that member.",
        "",
        "- **semantic** keys change what is computed or learned: they go in `invariants`, and changing one is "
        "a `training_change`.",
        "- **execution** keys change only how the same computation runs: they go in `execution` (or "
        "`invariants`) and may be declared as a change in `compare_benchmarks(declared_changes=[...])`.",
        '- A key outside the vocabulary needs `classes={"my_key": "semantic"|"execution"}`; a class '
        "that contradicts the vocabulary is refused.",
        f"- Required invariants for a keep: {', '.join(f'`{k}`' for k in REQUIRED_INVARIANTS)}.",
        "- Checked: `global_batch` = `microbatch` x `accumulation` x `data_parallel` (or `world_size` / the "
        "model-parallel degrees) whenever `microbatch` is declared. A run checks what it can measure: "
        "`global_batch` against the samples per optimizer step, `accumulation` against the backward() passes, "
        "`world_size` against the ranks; so `global_batch` alone is enough. A single process needs no "
        "`data_parallel` or `world_size`: the data-parallel size is 1 unless declared.",
        "",
        "| key | class | meaning | synonyms (stored as the key) | members (distinct keys of this kind) |",
        "|---|---|---|---|---|",
    ]
    spellings: dict[str, list[str]] = {}
    for spelling, target in _MEMBER_SPELLINGS.items():
        spellings.setdefault(target, []).append(spelling)

    def with_spellings(name: str) -> str:
        return name + (f" [{', '.join(spellings[name])}]" if name in spellings else "")

    lines += [
        f"| `{t.name}` | {t.cls} | {t.meaning} | {', '.join(t.synonyms)} | "
        f"{', '.join(map(with_spellings, t.members))} |"
        for t in sorted(_TERMS, key=lambda t: (t.cls != "semantic", t.name))
    ]
    lines += ["", "Not contract keys (refused, with what to declare instead):", ""]
    lines += [f"- `{k}`: {v}" for k, v in NOT_KEYS.items()]
    return "\n".join(lines) + "\n"
