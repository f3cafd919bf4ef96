"""Model descriptions, parameter counts and FLOP conventions for decoder transformers.

`estimate_flops` returns FLOPs per optimizer step for the whole global batch; divide by the number of
devices that share the step to get the per-device figure that MFU needs.
"""

from perfgate.flops.config import ModelConfig, MoEConfig
from perfgate.flops.conventions import (
    RECOMPUTE_ASSUMPTIONS,
    Convention,
    FlopBreakdown,
    FlopEstimate,
    Recompute,
    estimate_flops,
)
from perfgate.flops.params import ParamCounts, count_parameters

__all__ = [
    "RECOMPUTE_ASSUMPTIONS",
    "Convention",
    "FlopBreakdown",
    "FlopEstimate",
    "MoEConfig",
    "ModelConfig",
    "ParamCounts",
    "Recompute",
    "count_parameters",
    "estimate_flops",
]
