"""Process-wide harness state: whether the launcher runs this process and with which settings, the
window the probes, tensor dumps and sample records report to, and the top-level training module the
forward probe saw (which the tensor capture, the dump's classification of what the training computes and
the replica digest all read: here, so none of them imports another for it).

`ActiveWindow` is what they may call on that window (`perfgate.harness.window.Window` is the one
implementation): they reach it through here, so none of them imports the window module, which installs
them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from perfgate.harness._rank import RankInfo
from perfgate.harness.config import HarnessConfig
from perfgate.harness.startup import StartupSampler

__all__ = [
    "ActiveWindow",
    "activate",
    "active_window",
    "current_config",
    "current_module",
    "deactivate",
    "launcher_active",
    "saw_module",
    "set_launcher_config",
    "set_startup",
    "set_startup_own",
    "startup",
    "startup_own_ns",
    "unwrap",
]

_launcher_config: HarnessConfig | None = None
_startup: StartupSampler | None = None
_startup_own_ns: int | None = None


def set_startup_own(elapsed_ns: int) -> None:
    """The launcher's own start-up: from the import of ``perfgate.harness`` to the script's first line."""
    global _startup_own_ns
    _startup_own_ns = elapsed_ns


def startup_own_ns() -> int | None:
    return _startup_own_ns


def set_startup(sampler: StartupSampler | None) -> None:
    """The launcher's start-up sampler, which the first training forward or step stops."""
    global _startup
    _startup = sampler


def startup() -> StartupSampler | None:
    return _startup


def set_launcher_config(config: HarnessConfig | None) -> None:
    """Called by ``python -m perfgate.harness`` before it runs the script (``None`` when it ends)."""
    global _launcher_config
    _launcher_config = config


def launcher_active() -> bool:
    return _launcher_config is not None


def current_config() -> HarnessConfig:
    """The launcher's settings when it runs this process, else the ``PERFGATE_*`` environment."""
    return _launcher_config if _launcher_config is not None else HarnessConfig.from_env()


class ActiveWindow(Protocol):
    """What the probes and in-process helpers call on the active window (see `Window` for each)."""

    config: HarnessConfig
    rank: RankInfo
    timing: str
    job: bool
    own_ns: int
    """Time spent in perfgate's own code during the step in progress: each probe adds what it took."""

    @property
    def origin_unix_ns(self) -> int: ...

    @property
    def measuring(self) -> bool: ...
    @property
    def steps_completed(self) -> int: ...
    @property
    def windows_done(self) -> int: ...
    def optimizer_step(self, optimizer: object) -> None: ...
    def boundary(self, source: str, samples: int | None = None, tokens: int | None = None) -> None: ...
    def work_starts(self) -> None: ...
    def add_data_wait(self, wait_ns: int, samples: int | None) -> None: ...
    def add_model_samples(self, samples: int | None, second_dim: int | None = None) -> None: ...
    def correct_model_samples(self, counted: int, actual: int) -> None: ...
    def note_batch_layout(self, dim: int, layer: str, batch: int) -> None: ...
    def note_autocast(self, dtype: str | None) -> None: ...
    def add_backward(self, elapsed_ns: int) -> None: ...
    def add_loss(self, tensor: Any) -> None: ...
    def note_scaled_loss(self, scaler: Any, loss: Any, scaled: Any) -> None: ...
    def add_scaler_step(self, scaler: Any) -> None: ...
    def note_model(self, facts: dict[str, Any]) -> None: ...
    def stream_rows_wanted(self) -> int: ...
    def add_stream(self, header: str, data: bytes | None, rows: int) -> None: ...
    def user_work_ran(self, what: str, elapsed_ns: int) -> None: ...
    def own_work_ran(self, what: str, elapsed_ns: int) -> None: ...
    def phase_ran(self, kind: str, start_ns: int, end_ns: int) -> None: ...
    def checkpoint_file(self, op: str, path: str, state: str | None = None) -> None: ...
    def saved_state(self, schema: dict[str, Any]) -> str | None: ...
    def defer(self, write: Callable[[], object]) -> None: ...
    def note(self, text: str) -> None: ...
    def tensors_dumped(
        self, path: str, digest: str, size_bytes: int, computed: dict[str, int] | None = None
    ) -> None: ...
    def metric_reported(self, name: str, value: float) -> None: ...
    def close(self, reason: str = "closed", error: str | None = None) -> Path | None: ...


_active: ActiveWindow | None = None


def active_window() -> ActiveWindow | None:
    """The window the probes report to now (None: no window is active in this process)."""
    return _active


def activate(window: ActiveWindow) -> None:
    """Route the probes to ``window`` (`perfgate.harness.hooks.activate` installs them)."""
    global _active
    _active = window


def deactivate(window: ActiveWindow) -> None:
    """Stop routing to ``window`` (another window activated since stays active)."""
    global _active
    if _active is window:
        _active = None


_module: weakref.ReferenceType[Any] | None = None


def saw_module(module: Any) -> None:
    """The forward probe's top-level training module (kept weakly: the harness never keeps a model alive)."""
    global _module
    if _module is None or _module() is not module:
        _module = weakref.ref(module)


def current_module() -> Any:
    """The top-level training module the forward probe saw, while it lives; else None."""
    return None if _module is None else _module()


def unwrap(module: Any) -> Any:
    """The module a wrapper trains: torch.compile's ``_orig_mod``, DDP's and DataParallel's ``module``."""
    for _ in range(4):
        name = type(module).__name__
        if name == "OptimizedModule" and hasattr(module, "_orig_mod"):
            module = module._orig_mod
        elif name in ("DistributedDataParallel", "DataParallel") and hasattr(module, "module"):
            module = module.module
        else:
            break
    return module
