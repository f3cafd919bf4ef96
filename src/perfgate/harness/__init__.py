# ruff: noqa: E402
"""In-process harness: times training steps from inside the user's training process.

Importing this package is cheap: it never imports mcp, and imports torch only where a function needs
it. ``dump_tensors`` (tensor dumps for parity checks) and the DataLoader sample recorder are loaded on
first attribute access.

Zero code change::

    python -m perfgate.harness --warmup-steps 5 --measure-steps 20 -- train.py ARGS
    torchrun --nproc-per-node 2 -m perfgate.harness -- train.py ARGS

A step boundary the harness does not find by itself (see `perfgate.harness.steps`), in one line at the end
of each training iteration::

    perfgate.harness.step()

Explicit, with the script's own window::

    window = perfgate.harness.Window(warmup_steps=5, measure_steps=20, record_dir="records")
    for batch in loader:
        with window.step(samples=len(batch)):
            train_step(batch)

A phase of the job the harness cannot find by itself, in one line (reported with ``job=true``)::

    with perfgate.harness.phase("eval"):
        evaluate(ema_model)
"""

from __future__ import annotations

import time

IMPORT_STARTED_NS = time.perf_counter_ns()
"""When this package's import began: the launcher's own start-up is counted from here (the imports below
come after it on purpose)."""

from typing import TYPE_CHECKING

from perfgate.harness.config import ConfigError, HarnessConfig, ProfileConfig
from perfgate.harness.record import RECORD_SCHEMA, RECORD_VERSION, record_path
from perfgate.harness.window import NoStepFound, Window, WindowComplete, phase, report_metric, step
from perfgate.helpers.lazy import lazy_exports

if TYPE_CHECKING:
    from perfgate.harness.dump import dump_tensors
    from perfgate.harness.samples import (
        RecordingDataset,
        RecordingSampler,
        SampleLog,
        launch_id,
        record_iterable,
        sample_log_path,
    )

__all__ = [
    "RECORD_SCHEMA",
    "RECORD_VERSION",
    "ConfigError",
    "HarnessConfig",
    "NoStepFound",
    "ProfileConfig",
    "RecordingDataset",
    "RecordingSampler",
    "SampleLog",
    "Window",
    "WindowComplete",
    "dump_tensors",
    "launch_id",
    "phase",
    "record_iterable",
    "record_path",
    "report_metric",
    "sample_log_path",
    "step",
]

# Names served lazily: attribute -> module that defines it.
_LAZY: dict[str, str] = {
    "dump_tensors": "perfgate.harness.dump",
    "RecordingDataset": "perfgate.harness.samples",
    "RecordingSampler": "perfgate.harness.samples",
    "SampleLog": "perfgate.harness.samples",
    "launch_id": "perfgate.harness.samples",
    "record_iterable": "perfgate.harness.samples",
    "sample_log_path": "perfgate.harness.samples",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
