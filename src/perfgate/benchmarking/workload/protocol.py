"""The measurement protocol of a benchmark window: where the timed boundary lies and how work is counted.

Two windows measure the same thing only when they were taken the same way: the same warm-up skipped, the
same number of steps timed, the same timer, windows in one process or one per launch, the same source of
samples or tokens per step, the same log pattern. How many windows or launches a call made is not part of
it: that is sample size (the interval and the launch count see it), and windows of one boundary measured
over several calls pool. A window whose warm-up was cut from 5 steps to 0 times
its compile or cache-filling steps; one that counts samples from a declared figure instead of the batches
seen counts other work. So a protocol difference between the sides is part of the comparison: it is named
and refuses the comparison unless the caller declared it as ``protocol.<field>`` in ``declared_changes``
(``warmup_steps`` alone names the learning-rate warm-up of the contract vocabulary).

The protocol is read from what the window evidence recorded: the inputs its run was launched (or its log
imported) with, and the step timer its ranks reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

__all__ = [
    "IMPORTED_FIELDS",
    "LAUNCHED_FIELDS",
    "MEASURED_FIELDS",
    "changed_fields",
    "same_protocol",
    "window_protocol",
]

LAUNCHED_FIELDS: dict[str, str] = {
    "timing": "how steps are timed (harness optimizer steps, the script's own Window, or a log)",
    "warmup_steps": "optimizer steps skipped before each window",
    "measure_steps": "optimizer steps in each window",
    "same_process": "whether the windows share one process",
    "log_pattern": "the pattern step times are read with (timing='log')",
    "samples_per_step": "samples per step as given (null: counted from the batches seen)",
    "tokens_per_step": "tokens per step as given",
}
"""run_benchmark_window inputs that set the measurement boundary (``repeats`` is sample size, not one of
them)."""

IMPORTED_FIELDS: dict[str, str] = {
    "pattern": "the pattern step times are read with (format='regex')",
    "interval_mean": "whether a log line's time is a mean since the previous line",
    "warmup_steps": "steps skipped at the start of the log",
    "measure_steps": "steps per window (null: the usable steps split evenly)",
    "windows": "windows the usable steps are cut into",
    "samples_per_step": "samples per step as given (null: from the log)",
    "tokens_per_step": "tokens per step as given (null: from the log)",
}
"""import_benchmark inputs that set the measurement boundary (a different ``format`` is another way of
measuring altogether, refused by the comparison as such)."""

MEASURED_FIELDS: dict[str, str] = {
    "step_time_source": "the step timer the ranks reported (device events, host clock or log)",
}
"""Protocol facts a launched window's ranks reported, beside its inputs."""


def window_protocol(
    inputs: Mapping[str, Any], result: Mapping[str, Any], *, imported: bool
) -> dict[str, Any]:
    """The protocol of one window record: its boundary inputs and, for a launched window, its step timer.

    A field the record does not hold is absent (never assumed to be a default), so an older record that
    lacks it differs from one that has it.
    """
    fields = IMPORTED_FIELDS if imported else LAUNCHED_FIELDS
    out = {name: inputs[name] for name in fields if name in inputs}
    if not imported:
        ranks = result.get("ranks")
        sources = {
            str(cast("Mapping[str, Any]", r).get("step_time_source"))
            for r in cast("list[Any]", ranks if isinstance(ranks, list) else [])
            if isinstance(r, Mapping)
        }
        if sources:
            out["step_time_source"] = sorted(sources)
    return out


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def changed_fields(baseline: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """Protocol fields whose values differ between the two windows (a field one side lacks differs)."""
    keys = sorted(set(baseline) | set(candidate))
    return [
        k
        for k in keys
        if k not in baseline or k not in candidate or _canon(baseline[k]) != _canon(candidate[k])
    ]


def same_protocol(protocols: Sequence[Mapping[str, Any]]) -> list[str]:
    """Protocol fields on which windows of one side disagree (a side is one measurement)."""
    if not protocols:
        return []
    changed = sorted({k for p in protocols[1:] for k in changed_fields(protocols[0], p)})
    return [f"protocol.{k} differs between windows of the same side" for k in changed]
