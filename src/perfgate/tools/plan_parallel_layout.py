"""plan_parallel_layout: is a TP/CP/DP/PP + ETP/EP/EDP layout legal, and does it fit in memory?"""

from __future__ import annotations

import functools
import time
from typing import Annotated, Literal

import anyio.from_thread
import anyio.to_thread
from pydantic import BaseModel, Field, model_validator

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.flops import ModelConfig, ParamCounts, count_parameters
from perfgate.planning import (
    GIB,
    RANKING,
    DeviceMemoryError,
    LayoutPlan,
    MeshRequest,
    PipelineTooDeepError,
    SearchOptions,
    SearchResult,
    TrainingSetup,
    device_memory,
    plan_layout,
    search_layouts,
)
from perfgate.planning.search import MAX_WORLD_SIZE, SearchTooLarge
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SEARCH_DEADLINE_S", "SPEC", "PlanParallelLayoutInput", "PlanParallelLayoutOutput", "run"]

SEARCH_DEADLINE_S = 60.0
"""A search still running after this long stops with an error (a safety net behind MAX_LAYOUTS)."""

ASSUMPTIONS = [
    "sequence parallelism is on whenever tp > 1 (required by Megatron-LM for MoE with tp > 1), so all "
    "activations split by tp",
    "MoE routing is balanced: each GPU's experts receive micro-batch tokens x top_k / ep copies on average; "
    "real imbalance raises expert activation memory",
    "activations are stored in 2 bytes (4 for fp32 training); weights have no linear biases; norms are "
    "RMSNorm",
    "the gradient buffer is not sharded (distributed optimizer = ZeRO-1: optimizer states and fp32 master "
    "weights only)",
    "the reserve covers the CUDA context, communication buffers (e.g. all-to-all, NCCL) and allocator "
    "fragmentation",
    "pipeline schedule is 1F1B (interleaved when vpp > 1); without global_batch_size at least pp "
    "micro-batches per step are assumed",
]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


class PlanParallelLayoutInput(TrainingSetup):
    """The model, the cluster, one mesh (check) or search options, and the training setup fields."""

    model: Annotated[ModelConfig, Field(description="The transformer, as for estimate_flops.")]
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE, description="Total GPUs.")]
    gpus_per_node: Annotated[
        int, Field(ge=1, description="GPUs per node (the fast-interconnect domain).")
    ] = 8
    device: Annotated[
        str | None,
        Field(description="Device name from the peak table (e.g. 'H100', 'MI300X'): gives memory."),
    ] = None
    device_memory_gib: Annotated[
        float | None, Field(gt=0, description="Memory per GPU in GiB; overrides the table's value.")
    ] = None
    mode: Annotated[
        Literal["check", "search"],
        Field(description="'check' one mesh; 'search' every legal layout of world_size, ranked, that fits."),
    ] = "check"
    mesh: Annotated[
        MeshRequest | None,
        Field(description="The layout for mode='check' (tp, cp, dp, pp, vpp, etp, ep, edp; dp/edp derived)."),
    ] = None
    keep_hot_comm_in_node: Annotated[
        bool,
        Field(
            description="Require tensor-parallel and expert all-to-all (etp x ep) groups to stay inside one "
            "node (the fastest links). Off by default: large MoE runs often spread ep across nodes."
        ),
    ] = False
    search: Annotated[SearchOptions, Field(description="What mode='search' varies besides tp, pp, ep.")] = (
        SearchOptions()
    )

    @model_validator(mode="after")
    def _mesh_for_check(self) -> PlanParallelLayoutInput:
        if self.mode == "check" and self.mesh is None:
            raise ValueError(
                "mode='check' needs a mesh (e.g. {'tp': 2, 'pp': 2, 'ep': 8}); or use mode='search'"
            )
        if self.device is None and self.device_memory_gib is None:
            raise ValueError("give device (a name from the peak table) or device_memory_gib (GiB per GPU)")
        return self


class PlanParallelLayoutOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    mode: Literal["check", "search"]
    summary: str = Field(description="One-line verdict.")
    device_memory_bytes: int
    device_memory_source: str
    params: ParamCounts
    plan: LayoutPlan | None = Field(description="mode='check': the checks and per-stage memory.")
    search: SearchResult | None = Field(
        description="mode='search': ranked fitting layouts and closest misses."
    )
    assumptions: list[str]
    warnings: list[str]


def _setup(inp: PlanParallelLayoutInput) -> TrainingSetup:
    return TrainingSetup.model_validate(inp.model_dump(include=set(TrainingSetup.model_fields)))


def _check_summary(plan: LayoutPlan) -> str:
    mem = plan.memory
    legal = "legal" if plan.legal else f"ILLEGAL ({', '.join(plan.violations)})"
    verdict = (
        f"fits with {_gib(mem.margin_bytes)} to spare"
        if mem.fits
        else f"does NOT fit: short by {_gib(-mem.margin_bytes)}"
    )
    return (
        f"{plan.layout}: {legal}; stage {mem.worst_stage} needs {_gib(mem.total_bytes)} + reserve "
        f"{_gib(mem.reserve_bytes)} of {_gib(mem.device_memory_bytes)}: {verdict}"
    )


async def run(inp: PlanParallelLayoutInput, rt: ToolRuntime) -> PlanParallelLayoutOutput:
    try:
        memory_bytes, memory_source, warnings = device_memory(inp.device, inp.device_memory_gib)
    except DeviceMemoryError as exc:
        raise ToolError(str(exc)) from exc
    setup = _setup(inp)
    plan: LayoutPlan | None = None
    result: SearchResult | None = None
    if inp.mode == "check":
        assert inp.mesh is not None
        try:
            plan = plan_layout(
                inp.model,
                inp.mesh.resolve(inp.world_size),
                setup,
                world_size=inp.world_size,
                gpus_per_node=inp.gpus_per_node,
                device_memory_bytes=memory_bytes,
                keep_hot_comm_in_node=inp.keep_hot_comm_in_node,
            )
        except PipelineTooDeepError as exc:
            raise ToolError(str(exc)) from exc
        summary = _check_summary(plan)
        mb = plan.memory.num_microbatches
        if plan.mesh.pp > 1 and mb is not None and mb < plan.mesh.pp:
            warnings.append(
                f"{mb} micro-batches per step with pp={plan.mesh.pp}: the pipeline never fills, most of each "
                "step is bubble; raise the global batch or lower pp"
            )
        if plan.legal and not plan.fits:
            warnings.append(
                "does not fit: try selective then full recompute, a larger ep (expert states) or pp, "
                "optimizer offload, or mode='search' for the legal layouts that fit"
            )
    else:
        deadline = time.monotonic() + SEARCH_DEADLINE_S

        def check() -> None:
            anyio.from_thread.check_cancelled()  # the call was cancelled: stop the worker thread too
            if time.monotonic() > deadline:
                raise SearchTooLarge(
                    f"the search ran past {SEARCH_DEADLINE_S:g} s (plan_parallel_layout.SEARCH_DEADLINE_S): "
                    "narrow search.cp_choices / vpp_choices / etp_choices or lower search.max_tp"
                )

        search = functools.partial(
            search_layouts,
            inp.model,
            setup,
            inp.search,
            world_size=inp.world_size,
            gpus_per_node=inp.gpus_per_node,
            device_memory_bytes=memory_bytes,
            keep_hot_comm_in_node=inp.keep_hot_comm_in_node,
            check=check,
        )
        try:
            # CPU-bound: off the event loop, so other calls are served and this one can be cancelled.
            result = await anyio.to_thread.run_sync(search)
        except SearchTooLarge as exc:
            raise ToolError(str(exc)) from exc
        if result.candidates:
            best = result.candidates[0]
            summary = (
                f"{result.fitting} of {result.legal} legal layouts fit ({result.enumerated} enumerated); "
                f"best by '{RANKING}': {best.layout}, {_gib(best.total_bytes)} with {_gib(best.margin_bytes)} "
                "to spare"
            )
        else:
            summary = f"none of {result.legal} legal layouts fits ({result.enumerated} enumerated)"
            if result.closest_misses:
                miss = result.closest_misses[0]
                summary += f"; closest: {miss.layout}, short by {_gib(-miss.margin_bytes)}"
            warnings.append(
                "nothing fits: enable recompute (selective, then full), optimizer offload, more GPUs, or widen "
                "search.cp_choices / etp_choices / max_tp"
            )
    ev = rt.evidence()
    out = PlanParallelLayoutOutput(
        evidence_id=ev.id,
        state=EvidenceState.PLANNED,
        mode=inp.mode,
        summary=summary,
        device_memory_bytes=memory_bytes,
        device_memory_source=memory_source,
        params=count_parameters(inp.model),
        plan=plan,
        search=result,
        assumptions=list(ASSUMPTIONS),
        warnings=warnings,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="plan_parallel_layout",
    title="Plan a parallel layout",
    description=(
        "Check that a TP/CP/DP/PP (MoE ETP/EP/EDP) layout is legal and fits per-GPU memory, or search the "
        "layouts that fit. A plan, not a measurement."
    ),
    details=(
        "Before queueing a multi-GPU job: check that a Megatron-style layout (attention TP x CP x DP x PP, MoE "
        "ETP x EP x EDP x PP) is legal for the model and world size, and estimate memory per GPU (weights, "
        "grads, sharded optimizer states, activations per recompute policy, in-flight pipeline micro-batches, "
        "reserve) with fits / does not fit and the margin. mode='search' lists every legal layout that fits, "
        "ranked smallest TP, largest EP, then largest DP. The result is a plan (state 'planned'), not a "
        "measurement: confirm with a benchmark."
    ),
    input_model=PlanParallelLayoutInput,
    output_model=PlanParallelLayoutOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
