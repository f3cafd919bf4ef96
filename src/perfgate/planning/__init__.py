"""Parallel-layout planning: legality rules, memory per GPU, and a ranked search of layouts.

Every figure is an estimate from formulas (stated in each result), not a measurement.
"""

from perfgate.planning.activations import ACTIVATION_SOURCE, layer_activation_bytes, local_tokens
from perfgate.planning.device import GIB, DeviceMemoryError, device_memory
from perfgate.planning.legality import Check, check_layout
from perfgate.planning.memory import (
    MAX_PIPELINE_CHUNKS,
    MemoryEstimate,
    PipelineTooDeepError,
    StageMemory,
    estimate_memory,
    stage_spans,
)
from perfgate.planning.mesh import MeshRequest, ParallelMesh
from perfgate.planning.plan import LayoutPlan, plan_layout
from perfgate.planning.search import RANKING, Candidate, SearchOptions, SearchResult, search_layouts
from perfgate.planning.setup import TrainingSetup, optimizer_bytes_per_param

__all__ = [
    "ACTIVATION_SOURCE",
    "GIB",
    "MAX_PIPELINE_CHUNKS",
    "RANKING",
    "Candidate",
    "Check",
    "DeviceMemoryError",
    "LayoutPlan",
    "MemoryEstimate",
    "MeshRequest",
    "ParallelMesh",
    "PipelineTooDeepError",
    "SearchOptions",
    "SearchResult",
    "StageMemory",
    "TrainingSetup",
    "check_layout",
    "device_memory",
    "estimate_memory",
    "layer_activation_bytes",
    "local_tokens",
    "optimizer_bytes_per_param",
    "plan_layout",
    "search_layouts",
    "stage_spans",
]
