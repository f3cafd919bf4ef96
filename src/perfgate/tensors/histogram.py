"""Distribution of |candidate - reference| for one tensor, streamed: what the error histogram plots."""

from __future__ import annotations

import numpy as np

from perfgate.tensors.source import TensorSource

__all__ = ["ERROR_BIN_EDGES", "error_histogram"]

ERROR_BIN_EDGES: tuple[float, ...] = tuple(float(x) for x in np.logspace(-12, 4, 33))
"""Log-spaced edges from 1e-12 to 1e4 (two bins per decade); errors outside land in the end bins."""


def error_histogram(
    reference: TensorSource,
    candidate: TensorSource,
    key: str,
    chunk_elements: int = 1 << 20,
    candidate_key: str | None = None,
) -> tuple[list[float], list[int]]:
    """(edges, counts) of the finite, non-zero absolute errors of tensor ``key``, in float64.

    Both sources must hold the tensor with the same number of elements (the comparison checked that);
    ``candidate_key`` names it on the candidate side when a key mapping renamed it.
    """
    edges = np.asarray(ERROR_BIN_EDGES)
    counts = np.zeros(len(edges) - 1, dtype=np.int64)
    ref_stream = reference.chunks(key, chunk_elements)
    cand_stream = candidate.chunks(candidate_key or key, chunk_elements)
    done = 0
    for ref, cand in zip(ref_stream, cand_stream, strict=True):
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: not a finite error, dropped below
            err = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
        err = err[np.isfinite(err) & (err > 0)]
        clipped = np.minimum(np.maximum(err, edges[0]), edges[-1])
        counts += np.histogram(clipped, bins=edges)[0]
        done += len(ref)
        ref_stream.release(done)
        cand_stream.release(done)
    return [float(e) for e in edges], [int(c) for c in counts]
