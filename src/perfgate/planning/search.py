"""Enumerate legal layouts for a world size and rank those that fit.

Ranking follows the MoE workflow's fit-then-scale rules: the smallest tensor parallelism first, then
the largest legal expert parallelism, then the largest data parallelism (hence the least pipeline and
context parallelism), then the fewest expert-tensor ranks and virtual stages.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from perfgate.flops.config import ModelConfig
from perfgate.planning.legality import check_layout
from perfgate.planning.memory import StageMemory
from perfgate.planning.mesh import ParallelMesh
from perfgate.planning.plan import LayoutPlan, plan_layout
from perfgate.planning.setup import TrainingSetup

__all__ = [
    "MAX_CHOICES",
    "MAX_LAYOUTS",
    "MAX_WORLD_SIZE",
    "RANKING",
    "Candidate",
    "SearchOptions",
    "SearchResult",
    "SearchTooLarge",
    "search_layouts",
]

MAX_WORLD_SIZE = 1 << 20
"""Most GPUs a plan may have (far above any cluster built)."""
MAX_CHOICES = 64
"""Most values in each of cp_choices, vpp_choices and etp_choices."""
MAX_LAYOUTS = 200_000
"""Most layouts one search may judge (each takes ~0.1 ms); a larger space is refused before searching."""
_CHECK_EVERY = 256


class SearchTooLarge(ValueError):
    """The search space is over MAX_LAYOUTS; the message says how large and how to narrow it."""


RANKING = "smallest tp, then largest ep, then largest dp, then smallest pp, cp, etp, vpp, then least memory"


class SearchOptions(BaseModel):
    """What `search_layouts` varies besides tp, pp and ep (which range over divisors of world_size)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cp_choices: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]],
        Field(min_length=1, max_length=MAX_CHOICES, description="Context-parallel sizes to try."),
    ] = [1]
    vpp_choices: Annotated[
        list[Annotated[int, Field(ge=1, le=1024)]],
        Field(min_length=1, max_length=MAX_CHOICES, description="Virtual pipeline sizes to try."),
    ] = [1]
    etp_choices: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]],
        Field(min_length=1, max_length=MAX_CHOICES, description="Expert tensor-parallel sizes to try."),
    ] = [1]
    max_tp: Annotated[int | None, Field(ge=1, description="Largest tp to try; default gpus_per_node.")] = None
    limit: Annotated[int, Field(ge=1, le=100, description="Most fitting layouts to return.")] = 10


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True)

    mesh: ParallelMesh
    layout: str
    fits: bool
    total_bytes: int = Field(description="Worst pipeline stage total, bytes.")
    margin_bytes: int
    worst_stage: StageMemory
    num_microbatches: int | None


class SearchResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    ranking: str
    enumerated: int = Field(description="Layouts whose meshes multiply out to world_size.")
    legal: int
    fitting: int
    rejected_by_rule: dict[str, int] = Field(description="Enumerated layouts violating each rule.")
    candidates: list[Candidate] = Field(description="Legal layouts that fit, best first.")
    closest_misses: list[Candidate] = Field(description="Legal layouts that do not fit, least memory first.")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _candidate(plan: LayoutPlan) -> Candidate:
    mem = plan.memory
    return Candidate(
        mesh=plan.mesh,
        layout=plan.layout,
        fits=plan.fits,
        total_bytes=mem.total_bytes,
        margin_bytes=mem.margin_bytes,
        worst_stage=mem.stages[mem.worst_stage],
        num_microbatches=mem.num_microbatches,
    )


def search_layouts(
    model: ModelConfig,
    setup: TrainingSetup,
    options: SearchOptions,
    *,
    world_size: int,
    gpus_per_node: int,
    device_memory_bytes: int,
    keep_hot_comm_in_node: bool = False,
    check: Callable[[], None] | None = None,
) -> SearchResult:
    """Every layout of ``world_size`` GPUs over tp, pp, ep divisors and the option lists, judged and ranked.

    ``check`` is called every few hundred layouts and may raise to stop (cancellation, a deadline).

    Raises:
        SearchTooLarge: the space holds more than MAX_LAYOUTS candidate layouts (checked before searching).
    """
    divisors = _divisors(world_size)
    max_tp = options.max_tp if options.max_tp is not None else gpus_per_node
    ep_choices = divisors if model.moe is not None else [1]
    etp_choices = sorted(set(options.etp_choices)) if model.moe is not None else [1]
    tp_choices = [t for t in divisors if t <= max_tp]
    space = len(divisors) * len(set(options.cp_choices)) * len(tp_choices) * len(set(options.vpp_choices))
    space *= len(etp_choices) * len(ep_choices)
    if space > MAX_LAYOUTS:
        raise SearchTooLarge(
            f"the search would try up to {space} layouts ({len(divisors)} pp x {len(set(options.cp_choices))} cp x "
            f"{len(tp_choices)} tp x {len(set(options.vpp_choices))} vpp x {len(etp_choices)} etp x "
            f"{len(ep_choices)} ep), over the limit of {MAX_LAYOUTS} (planning.search.MAX_LAYOUTS): narrow "
            "search.cp_choices / vpp_choices / etp_choices, lower search.max_tp, or check one mesh with mode='check'"
        )
    rejected: Counter[str] = Counter()
    plans: list[LayoutPlan] = []
    enumerated = 0
    for pp in divisors:
        for cp in sorted(set(options.cp_choices)):
            for tp in tp_choices:
                if world_size % (tp * cp * pp) != 0:
                    continue
                for vpp in sorted(set(options.vpp_choices)):
                    for etp in etp_choices:
                        for ep in ep_choices:
                            if world_size % (etp * ep * pp) != 0:
                                continue
                            mesh = ParallelMesh(
                                tp=tp,
                                cp=cp,
                                dp=world_size // (tp * cp * pp),
                                pp=pp,
                                vpp=vpp,
                                etp=etp,
                                ep=ep,
                                edp=world_size // (etp * ep * pp),
                            )
                            enumerated += 1
                            if check is not None and enumerated % _CHECK_EVERY == 0:
                                check()
                            checks = check_layout(
                                model,
                                mesh,
                                setup,
                                world_size=world_size,
                                gpus_per_node=gpus_per_node,
                                keep_hot_comm_in_node=keep_hot_comm_in_node,
                            )
                            violations = [c.rule for c in checks if c.status == "violated"]
                            rejected.update(violations)
                            if not violations:
                                plans.append(
                                    plan_layout(
                                        model,
                                        mesh,
                                        setup,
                                        world_size=world_size,
                                        gpus_per_node=gpus_per_node,
                                        device_memory_bytes=device_memory_bytes,
                                        keep_hot_comm_in_node=keep_hot_comm_in_node,
                                    )
                                )

    def rank(p: LayoutPlan) -> tuple[int, ...]:
        m = p.mesh
        return (m.tp, -m.ep, -m.dp, m.pp, m.cp, m.etp, m.vpp, p.memory.total_bytes)

    fitting = sorted((p for p in plans if p.fits), key=rank)
    misses = sorted((p for p in plans if not p.fits), key=lambda p: p.memory.total_bytes)
    return SearchResult(
        ranking=RANKING,
        enumerated=enumerated,
        legal=len(plans),
        fitting=len(fitting),
        rejected_by_rule=dict(sorted(rejected.items())),
        candidates=[_candidate(p) for p in fitting[: options.limit]],
        closest_misses=[_candidate(p) for p in misses[:3]],
    )
