"""How the model is trained: batch shape, precisions, optimizer, recomputation, reserve."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GRAD_BYTES", "PARAM_BYTES", "TrainingSetup", "optimizer_bytes_per_param"]

ParamPrecision = Literal["bf16", "fp16", "fp8", "fp32"]
GradPrecision = Literal["fp32", "bf16", "fp16"]

PARAM_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
GRAD_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}


class TrainingSetup(BaseModel):
    """Everything besides the model and the mesh that decides memory per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: Annotated[int, Field(ge=1, description="Sequence length in tokens.")]
    micro_batch_size: Annotated[
        int, Field(ge=1, description="Sequences per micro-batch per data-parallel rank.")
    ]
    global_batch_size: Annotated[
        int | None,
        Field(
            ge=1, description="Sequences per optimizer step; checked against micro-batch x accumulation x dp."
        ),
    ] = None
    param_precision: Annotated[
        ParamPrecision,
        Field(description="Dtype of the model weights held on the GPU (fp8 = FP8 primary weights)."),
    ] = "bf16"
    grad_precision: Annotated[
        GradPrecision,
        Field(description="Dtype of the gradient buffer (Megatron-LM accumulates in fp32 by default)."),
    ] = "fp32"
    optimizer: Annotated[
        Literal["adam"],
        Field(description="Adam/AdamW: fp32 first and second moments (8 bytes per parameter)."),
    ] = "adam"
    distributed_optimizer: Annotated[
        bool,
        Field(
            description="Shard optimizer states (and fp32 master weights) over data-parallel ranks: dp x cp for "
            "dense parameters, edp for expert parameters (ZeRO-1 style, as Megatron-LM's distributed optimizer)."
        ),
    ] = True
    optimizer_offload_fraction: Annotated[
        float, Field(ge=0.0, le=1.0, description="Fraction of optimizer states offloaded to host memory.")
    ] = 0.0
    recompute: Annotated[
        Literal["none", "selective", "full"],
        Field(
            description="Activation recomputation: none, selective (core attention) or full (every layer)."
        ),
    ] = "none"
    attention_kernel: Annotated[
        Literal["flash", "unfused"],
        Field(description="flash: fused attention keeps no s x s matrices; unfused stores softmax per head."),
    ] = "flash"
    dropout: Annotated[bool, Field(description="Dropout layers are active (adds 1-byte masks).")] = False
    reserve_fraction: Annotated[
        float,
        Field(
            ge=0.0,
            lt=1.0,
            description="Fraction of device memory kept free for the CUDA context, communication buffers and "
            "allocator fragmentation.",
        ),
    ] = 0.10

    @property
    def activation_bytes(self) -> int:
        """Bytes per stored activation element: 4 for fp32 training, else 2 (bf16/fp16 activations)."""
        return 4 if self.param_precision == "fp32" else 2


def optimizer_bytes_per_param(setup: TrainingSetup) -> int:
    """Optimizer-state bytes per parameter before sharding.

    Adam's two fp32 moments (8), plus an fp32 master copy when weights are not fp32 (4), plus an fp32
    gradient copy when the gradient buffer is not fp32 (4): bf16 weights with fp32 grads give 12, fp16
    weights with fp16 grads 16, fp32 weights with fp32 grads 8 (the figures of Megatron-LM's distributed
    optimizer documentation).
    """
    assert setup.optimizer == "adam"
    extra_master = 4 if PARAM_BYTES[setup.param_precision] != 4 else 0
    extra_grad = 4 if GRAD_BYTES[setup.grad_precision] != 4 else 0
    return 8 + extra_master + extra_grad
