"""A utilization bucket's figures read from evidence: the step time of a window record, the per-device FLOPs
of an estimate_flops record, checked against each other (devices, tokens per step)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from perfgate.evidence import EvidenceState
from perfgate.evidence.access import as_dict
from perfgate.flops.utilization import BucketInput, FlopsKind

if TYPE_CHECKING:
    from perfgate.evidence import EvidenceRecord

__all__ = ["WINDOW_TOOLS", "BucketEvidenceError", "resolve_bucket"]

WINDOW_TOOLS = ("run_benchmark_window", "import_benchmark")
_OK = (EvidenceState.EXECUTED, EvidenceState.PASSED)


class BucketEvidenceError(ValueError):
    """An evidence id that cannot give a bucket's figures; the message says which and what to pass."""


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def resolve_bucket(
    *,
    name: str,
    weight: float,
    flops_per_step: float | None,
    flops_id: str | None,
    step_time_s: float | None,
    window_id: str | None,
    flops_kind: FlopsKind,
    load: Callable[[str], Awaitable[EvidenceRecord]],
) -> tuple[BucketInput, list[str]]:
    """The bucket's FLOPs and step time: as given, or read from the records ``load`` returns for
    ``window_id`` (step time = 1 / its step rate) and ``flops_id`` (per-device FLOPs of ``flops_kind``).
    Exactly one of each pair is given. Returns the bucket and notes on how its figures were taken.

    Raises:
        BucketEvidenceError: an id of the wrong tool, unusable evidence, or records that contradict each other.
    """
    warnings: list[str] = []
    step_time = step_time_s
    world: int | None = None
    window_tokens: float | None = None
    if window_id is not None:
        w = await load(window_id)
        if w.tool not in WINDOW_TOOLS:
            raise BucketEvidenceError(
                f"window_id {window_id} is a {w.tool} record; pass run_benchmark_window or import_benchmark ids"
            )
        if w.profiled:
            raise BucketEvidenceError(
                f"window {window_id} was profiled: profiled step times are never MFU evidence"
            )
        if w.state not in _OK:
            raise BucketEvidenceError(
                f"window {window_id} is {w.state.value}: measure a window that executed"
            )
        throughput = as_dict(w.result.get("throughput"))
        steps_per_s = _number(throughput.get("steps_per_s"))
        if steps_per_s is None or steps_per_s <= 0:
            raise BucketEvidenceError(f"window {window_id} has no step rate to take a step time from")
        step_time = 1.0 / steps_per_s
        tokens_per_s = _number(throughput.get("tokens_per_s"))
        window_tokens = None if tokens_per_s is None else tokens_per_s / steps_per_s
        world_value = w.result.get("world_size")
        world = world_value if isinstance(world_value, int) else None
        if w.tool == "import_benchmark":
            warnings.append(
                f"bucket {name!r}: the step time is imported from a log ({window_id}), not measured by perfgate"
            )
    flops = flops_per_step
    if flops_id is not None:
        f = await load(flops_id)
        if f.tool != "estimate_flops":
            raise BucketEvidenceError(f"flops_id {flops_id} is a {f.tool} record; pass an estimate_flops id")
        if flops_kind == "profiler_attributed":
            raise BucketEvidenceError(
                "estimate_flops counts model/hardware FLOPs: flops_kind 'profiler_attributed' needs flops_per_step"
            )
        key = "model" if flops_kind == "model" else "hardware"
        per_device = _number(f.result.get(f"{key}_flops_per_step_per_device"))
        whole = _number(f.result.get(f"{key}_flops_per_step"))
        devices = f.result.get("devices")
        if per_device is None:
            if whole is None or world is None:
                raise BucketEvidenceError(
                    f"estimate_flops {flops_id} gives whole-batch FLOPs and no device count, and no window "
                    "world size is known: call estimate_flops with devices=<world size>"
                )
            per_device = whole / world
            warnings.append(f"bucket {name!r}: whole-batch FLOPs divided by the window's world size {world}")
        elif isinstance(devices, int) and world is not None and devices != world:
            raise BucketEvidenceError(
                f"bucket {name!r}: estimate_flops {flops_id} spreads a step over {devices} devices but window "
                f"{window_id} ran {world} ranks: estimate with devices={world}"
            )
        est_tokens = _number(as_dict(f.inputs).get("tokens_per_step"))
        if (
            est_tokens is not None
            and window_tokens is not None
            and not math.isclose(est_tokens, window_tokens, rel_tol=0.01)
        ):
            raise BucketEvidenceError(
                f"bucket {name!r}: estimate_flops {flops_id} counts {est_tokens:g} tokens per step but window "
                f"{window_id} processed {window_tokens:g}: the FLOPs and the step time describe different steps"
            )
        flops = per_device
    assert flops is not None and step_time is not None
    return BucketInput(name, flops, step_time, weight, flops_id, window_id), warnings
