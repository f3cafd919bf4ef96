"""Tensor files and their numeric comparison, streamed in bounded memory.

Readers for safetensors (memory-mapped, header validated), NPY and NPZ (never unpickling, zip caps
checked before inflating) and folders of shards; `compare_sources` applies declared tolerances key by
key. Pure library: no MCP, no torch.

    with open_tensor_source(ref_path) as ref, open_tensor_source(cand_path) as cand:
        report = compare_sources(ref, cand, CompareOptions(atol=1e-5, rtol=1.3e-6))
"""

from perfgate.tensors._errors import ComparisonCancelled, TensorInputError
from perfgate.tensors._npz import NpzLimits
from perfgate.tensors.compare import (
    DEFAULT_CHUNK_ELEMENTS,
    CompareOptions,
    ComparisonReport,
    MappedKey,
    OverallStatus,
    TensorComparison,
    TensorStatus,
    ToleranceOverride,
    compare_sources,
)
from perfgate.tensors.entry import TensorEntry
from perfgate.tensors.keymap import KeyMapping
from perfgate.tensors.source import ReaderLimits, SourceKind, TensorSource, open_tensor_source

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "CompareOptions",
    "ComparisonCancelled",
    "ComparisonReport",
    "KeyMapping",
    "MappedKey",
    "NpzLimits",
    "OverallStatus",
    "ReaderLimits",
    "SourceKind",
    "TensorComparison",
    "TensorEntry",
    "TensorInputError",
    "TensorSource",
    "TensorStatus",
    "ToleranceOverride",
    "compare_sources",
    "open_tensor_source",
]
