"""One layout judged: legality checks plus the memory estimate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from perfgate.flops.config import ModelConfig
from perfgate.planning.legality import Check, check_layout
from perfgate.planning.memory import MemoryEstimate, estimate_memory
from perfgate.planning.mesh import ParallelMesh
from perfgate.planning.setup import TrainingSetup

__all__ = ["LayoutPlan", "plan_layout"]


class LayoutPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    mesh: ParallelMesh
    layout: str = Field(description="Both meshes in TP x CP x DP x PP / ETP x EP x EDP x PP notation.")
    legal: bool = Field(description="No rule is violated.")
    violations: list[str] = Field(description="Names of the violated rules.")
    checks: list[Check]
    memory: MemoryEstimate
    fits: bool = Field(description="Legal and the worst pipeline stage fits with the reserve.")


def plan_layout(
    model: ModelConfig,
    mesh: ParallelMesh,
    setup: TrainingSetup,
    *,
    world_size: int,
    gpus_per_node: int,
    device_memory_bytes: int,
    keep_hot_comm_in_node: bool = False,
) -> LayoutPlan:
    """Check ``mesh`` and estimate its memory per GPU; ``fits`` needs both."""
    checks = check_layout(
        model,
        mesh,
        setup,
        world_size=world_size,
        gpus_per_node=gpus_per_node,
        keep_hot_comm_in_node=keep_hot_comm_in_node,
    )
    violations = [c.rule for c in checks if c.status == "violated"]
    memory = estimate_memory(model, mesh, setup, device_memory_bytes)
    return LayoutPlan(
        mesh=mesh,
        layout=mesh.describe(),
        legal=not violations,
        violations=violations,
        checks=checks,
        memory=memory,
        fits=not violations and memory.fits,
    )
