"""Parallel layouts: the attention mesh TP x CP x DP x PP and the MoE mesh ETP x EP x EDP x PP.

Both meshes span the same ranks and share PP (Megatron-LM's parallel folding): attention layers are
split by tensor (tp), context (cp) and data (dp) parallelism, expert layers by expert-tensor (etp),
expert (ep) and expert-data (edp) parallelism.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MeshRequest", "ParallelMesh"]


class MeshRequest(BaseModel):
    """A layout as asked for; ``dp`` and ``edp`` may be left out and are then derived."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: Annotated[int, Field(ge=1, description="Tensor parallelism of attention and dense MLP layers.")] = 1
    cp: Annotated[int, Field(ge=1, description="Context parallelism (sequence split across ranks).")] = 1
    dp: Annotated[
        int | None, Field(ge=1, description="Data parallelism; derived from world_size if omitted.")
    ] = None
    pp: Annotated[int, Field(ge=1, description="Pipeline parallelism (shared by both meshes).")] = 1
    vpp: Annotated[
        int, Field(ge=1, description="Virtual pipeline stages per rank (interleaved schedule).")
    ] = 1
    etp: Annotated[int, Field(ge=1, description="Tensor parallelism inside each expert.")] = 1
    ep: Annotated[int, Field(ge=1, description="Expert parallelism (experts spread across ranks).")] = 1
    edp: Annotated[
        int | None, Field(ge=1, description="Expert data parallelism; derived from world_size if omitted.")
    ] = None

    def resolve(self, world_size: int) -> ParallelMesh:
        """Fill in ``dp`` and ``edp`` from ``world_size`` (rounded down; legality checks catch remainders)."""
        dp = self.dp if self.dp is not None else max(1, world_size // (self.tp * self.cp * self.pp))
        edp = self.edp if self.edp is not None else max(1, world_size // (self.etp * self.ep * self.pp))
        return ParallelMesh(
            tp=self.tp, cp=self.cp, dp=dp, pp=self.pp, vpp=self.vpp, etp=self.etp, ep=self.ep, edp=edp
        )


class ParallelMesh(BaseModel):
    """A fully specified layout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int
    cp: int
    dp: int
    pp: int
    vpp: int
    etp: int
    ep: int
    edp: int

    @property
    def attention_world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_world(self) -> int:
        return self.etp * self.ep * self.edp * self.pp

    def describe(self) -> str:
        """Both meshes in the workflow's notation."""
        pp = f"PP{self.pp}" + (f"(VPP{self.vpp})" if self.vpp > 1 else "")
        return (
            f"attention TP{self.tp} x CP{self.cp} x DP{self.dp} x {pp}; "
            f"MoE ETP{self.etp} x EP{self.ep} x EDP{self.edp} x {pp}"
        )
