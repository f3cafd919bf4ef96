"""A measurement window over training steps, timed from inside the training process.

A *step* is the interval between two consecutive step boundaries: optimizer updates (the
zero-code-change launcher calls :meth:`Window.optimizer_step` from a global optimizer hook), gradients a
manual update consumed (`perfgate.harness.steps`), a ``perfgate.harness.step()`` call, or the end of each
``with window.step():`` block (:meth:`Window.boundary` says which source counts). Boundaries are host timestamps from ``time.perf_counter_ns``;
the device is synchronised only at window edges, so the sum of a window's step times equals its
synchronised elapsed time. Where the device has timing events, one is recorded per boundary (no
synchronisation) and read back once the window has ended.

The first ``warmup_steps`` steps are kept in the record (for plots) but belong to no window; then
``windows`` consecutive windows of ``measure_steps`` steps each follow. The losses and skipped updates of
steps outside every window (the warm-up, a discarded window, steps after the last window) are kept too, in
the record's ``outside_windows``: the whole job's health reads them. They are read back at the next window's
start edge or when the record is written, never inside a window.

Nothing perfgate itself does runs inside a measured window: the modules its in-process helpers need
are imported when the window object is built; sample records written while a window is open are held
and written at its end edge; and a tensor dump that lands inside an open window discards that window,
which restarts after a fresh warm-up of ``warmup_steps`` steps (the record's notes say so). Work of the
training script's own that distorts a window (modules first imported inside it, ``torch.save``) is
kept, and named in the record's notes.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import math
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from perfgate.harness import _state, computed, hooks, steps
from perfgate.harness._host import host_peak_rss_bytes, host_rss_bytes
from perfgate.harness._rank import RankInfo, rank_from_env
from perfgate.harness.config import ENV_PREFIX, HarnessConfig, ProfileConfig
from perfgate.harness.device import DeviceBackend, detect_backend
from perfgate.harness.record import RECORD_SCHEMA, RECORD_VERSION, record_path, stream_record, write_record
from perfgate.harness.ticks import TickWriter

__all__ = ["NoStepFound", "Window", "WindowComplete", "phase", "report_metric", "step"]

_now = time.perf_counter_ns

STREAM_ROWS = 64
"""Input rows (samples) of the first training forwards of the warm-up that make up a launch's sample stream
digest: the data path a comparison's sides share when their digests agree."""

MAX_PHASES = 10_000
"""Phases (evaluation passes, checkpoints, marked phases) a record lists; later ones are counted only."""
MAX_CHECKPOINT_FILES = 1_000
MAX_SAVED_STATES = 16
"""Distinct saved states (`perfgate.harness.saved_state`) a record lists; a save of another one is listed by
its digest only."""
"""Checkpoint files saved or loaded that a record names (the step and path of each); later ones are dropped."""
_JOB_LOSS_BATCH = 4096
"""Losses a job run keeps on the device after its windows before reading them back in one transfer."""
NO_STEP_GRACE_S = 10.0
"""After the no-step limit, how long the script has to reach a forward, batch or checkpoint (where it is stopped
cleanly) before the harness writes the record and ends the process itself."""
NO_STEP_EXIT = 3
"""Exit status of a launch stopped because no step was found."""
_STEP_SOURCES = ("gradients", "optimizer", "explicit")
"""Step boundary sources, weakest first: a source counts unless a stronger one has counted."""
_NEVER = 1 << 62
_PHASE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,40}")

# One tuple per step: (end_ns, data_wait_ns, backward_ns, samples, tokens).
_Step = tuple[int, int, int, "int | None", "int | None"]


def _per_step(losses: list[tuple[int, Any]]) -> dict[int, list[float]] | None:
    """Each step's losses (its micro-steps'), read back in one transfer; None without torch."""
    torch = sys.modules.get("torch")
    if not losses or torch is None:
        return None
    values = torch.stack([v.detach().float().reshape(()) for _, v in losses]).cpu().tolist()
    per_step: dict[int, list[float]] = {}
    for (step, _), value in zip(losses, values, strict=True):
        per_step.setdefault(step, []).append(float(value))
    return per_step


def _stop_startup() -> None:
    """Start-up ends at the first training forward or step: the launcher's sampler stops there."""
    sampler = _state.startup()
    if sampler is not None:
        sampler.stop()


class WindowComplete(SystemExit):
    """Ends the training script once every window is measured (stop mode).

    A ``SystemExit`` with status 0: a script's ``except Exception`` does not swallow it, ``finally``
    blocks still run, and uncaught it ends the process quietly and successfully. The launcher catches
    it to close the record first.
    """

    def __init__(self) -> None:
        super().__init__(0)


class NoStepFound(SystemExit):
    """Ends a launch that trained for `HarnessConfig.no_step_s` without a step boundary (exit status
    `NO_STEP_EXIT`); the message says what the harness looked for and the line to add."""

    def __init__(self, message: str) -> None:
        super().__init__(NO_STEP_EXIT)
        self.message = message


class _StepScope:
    """The reusable context manager that ``Window.step`` returns (one per window, not per step)."""

    __slots__ = ("samples", "tokens", "window")

    def __init__(self, window: Window) -> None:
        self.window = window
        self.samples: int | None = None
        self.tokens: int | None = None

    def __enter__(self) -> _StepScope:
        w = self.window
        if not w._begun:  # pyright: ignore[reportPrivateUsage] -- the scope is part of Window
            w.begin()
        w.work_starts()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            start = _now()
            w = self.window
            w.mark_step(self.samples, self.tokens)
            w.own_ns += _now() - start


class Window:
    """Time ``warmup_steps`` + ``windows`` x ``measure_steps`` training steps on this rank.

    Arguments left as ``None`` come from ``config`` (default: the launcher's settings, else the
    ``PERFGATE_*`` environment). ``synchronize`` is an extra callable run at window edges for device
    work torch does not know about. ``stop`` raises :class:`WindowComplete` after the last window, where
    the script starts its next step's work (so the last step's log line still prints; default: under
    ``python -m perfgate.harness`` or when ``PERFGATE_STOP`` is set).

    Use as ``with window.step(samples=32, tokens=32 * 512): ...`` per step, or call
    :meth:`mark_step` at the end of each step. Records go to ``record_dir/rank<N>.json``.
    """

    def __init__(
        self,
        warmup_steps: int | None = None,
        measure_steps: int | None = None,
        *,
        windows: int | None = None,
        record_dir: str | Path | None = None,
        samples_per_step: int | None = None,
        tokens_per_step: int | None = None,
        stop: bool | None = None,
        synchronize: Callable[[], object] | None = None,
        label: str | None = None,
        config: HarnessConfig | None = None,
        instrument: bool = True,
        _optimizer_mode: bool = False,
    ) -> None:
        base = config if config is not None else _state.current_config()
        self.config = base.with_overrides(
            warmup_steps=warmup_steps,
            measure_steps=measure_steps,
            windows=windows,
            record_dir=None if record_dir is None else str(record_dir),
            samples_per_step=samples_per_step,
            tokens_per_step=tokens_per_step,
            label=label,
        )
        cfg = self.config
        # Stopping a script is only the default when someone asked for it: the launcher, or a tool
        # that set PERFGATE_STOP for an explicitly timed script.
        asked = _state.launcher_active() or os.environ.get(ENV_PREFIX + "STOP") is not None
        self.stop = stop if stop is not None else (cfg.stop and asked)
        self.job = cfg.job
        if self.job:
            self.stop = False  # the whole job is measured: it runs to its own end
        self.rank: RankInfo = rank_from_env()
        self._ticks = TickWriter(self.rank.rank)
        from perfgate.harness._node import node_facts

        self._node = node_facts()
        self._stream = os.environ.get(ENV_PREFIX + "RECORD_STREAM") == "1"
        self.timing = "optimizer" if _optimizer_mode else "explicit"
        self._user_sync = synchronize
        self._backend: DeviceBackend | None = None
        self._origin_ns = _now()
        self._origin_unix_ns = time.time_ns()
        self._begun = False
        self._first_start_ns = self._origin_ns
        self._count = 0
        self._steps: list[_Step] = []
        self.own_ns = 0
        """perfgate's own time in the step in progress (the probes add to it; each boundary moves it on)."""
        self._own_steps: list[int] = []
        """Per step: the time perfgate's own code took inside it (`own_ns` at its boundary)."""
        self._window_starts: dict[int, int] = {}
        self._cur_wait = 0
        self._cur_backward = 0
        self._cur_samples: int | None = None
        self._cur_model_samples: int | None = None
        self._model_samples: list[int | None] = []
        """Per step: samples that reached the top-level module's forward (every micro-batch)."""
        self._cur_second: int | None = None
        self._second_dim: list[int | None] = []
        """Per step: the second dimension of those inputs, summed the same way (a sequence-first reading)."""
        self._batch_layout: dict[str, Any] | None = None
        self._autocast: set[str] = set()
        self._inputs = hashlib.blake2b(digest_size=16)
        self._inputs_read = 0
        self._inputs_known = True
        self._inputs_header: str = ""
        self._model: dict[str, Any] | None = None
        """The top-level training module's class, parameter counts and structure digest (hooks.model_facts)."""
        # training health: scalar losses of the steps since the last edge, kept on the device until the next
        self._losses: list[tuple[int, Any]] = []
        self._outside_loss: list[tuple[int, float]] = []
        self._outside_bad: list[int] = []
        self._outside_skipped: list[list[int]] = []
        self._scaled_id: int | None = None
        self._scaler: Any = None
        self._scaler_steps = 0
        self._scaler_marks: list[int] = []
        self._step_loss_start = 0
        self._skipped: list[list[int]] = []
        self._fixed_samples = cfg.samples_per_step
        self._fixed_tokens = cfg.tokens_per_step
        self._events: list[Any] | None = None
        self._event_base = 0
        self._open: dict[str, Any] | None = None
        self._windows: list[dict[str, Any]] = []
        self._total = cfg.total_steps
        self._edges = {cfg.warmup_steps + k * cfg.measure_steps for k in range(cfg.windows + 1)}
        self._next_special = 0
        self._done = False
        self._closed = False
        self._stop_reason: str | None = None
        self._error: str | None = None
        self._first_optimizer: int | None = None
        self._step_source: str | None = None
        """Which source delimits steps (`boundary`); None until the first boundary."""
        self._no_step: str | None = None
        """Why the launch is being stopped for want of a step (set by the watch thread)."""
        self._trained = threading.Event()
        self._stepped = threading.Event()
        self._closed_event = threading.Event()
        self._other_optimizer_steps = 0
        self._notes: list[str] = []
        self._written: Path | None = None
        self._scope = _StepScope(self)
        self._pid = os.getpid()
        self._deferred: list[Callable[[], object]] = []
        self._modules_at_start: frozenset[str] = frozenset()
        self._user_work: dict[str, list[int]] = {}
        self._restarts = 0
        self._runtime_env: dict[str, str | None] | None = None
        self._stop_pending = False
        self._backward_calls = 0
        self._dumps: list[dict[str, Any]] = []
        self._metrics: dict[str, float] = {}
        self._collecting = True
        """Losses and skipped updates are kept: until the last window closes, or to the end in a job run."""
        self._phases: list[list[Any]] = []
        """[kind, step, start_ns, end_ns, calls, training forwards before it]: evaluation passes, checkpoints,
        marked phases (`phase_ran`); ``step`` is the step in progress when the phase began."""
        self._phases_dropped = 0
        self._checkpoint_files: list[tuple[str, int, str, str | None]] = []
        """(save or load, step in progress, absolute path, digest of the state saved) of each checkpoint call
        that named a file."""
        self._saved_states: dict[str, dict[str, Any]] = {}
        """Digest -> the schema of a state a checkpoint writer was handed (`perfgate.harness.saved_state`)."""
        self._train_forwards = 0
        self._train_start_ns: int | None = None
        _preload_own_modules()
        self._profiler: Any = None
        if cfg.profile is not None:
            self._profiler = _start_profiler(cfg.profile, self.rank.rank)
        self._instrument = instrument
        self._activate_probes()
        if cfg.record_dir is not None:
            atexit.register(self._close_at_exit)
            from perfgate.harness import stacks

            stacks.install(cfg.record_dir, self.rank.rank)
        self._schedule_next()
        if _optimizer_mode:
            self.begin()
            if cfg.no_step_s > 0:
                threading.Thread(
                    target=self._watch_for_steps, args=(cfg.no_step_s,), name="perfgate-no-step", daemon=True
                ).start()

    # ------------------------------------------------------------------ public API

    @property
    def done(self) -> bool:
        """True once every window (and the profile schedule, if any) is complete."""
        return self._done

    @property
    def steps_completed(self) -> int:
        return self._count

    @property
    def record_file(self) -> Path | None:
        """The record path once written, else ``None``."""
        return self._written

    @property
    def measuring(self) -> bool:
        """True while a measured window is open, in the process that owns it (not in forked workers)."""
        return self._open is not None and os.getpid() == self._pid

    def defer(self, write: Callable[[], object]) -> None:
        """Run ``write`` once the open window has ended (at its end edge, or on close): perfgate's own
        bookkeeping (sample records) never runs inside a measured window."""
        self._deferred.append(write)

    def own_work_ran(self, what: str, elapsed_ns: int) -> None:
        """perfgate's own heavy work (``what``, e.g. a tensor dump) just ran inside the open window.

        The window is discarded and restarts after a fresh warm-up of ``warmup_steps`` steps, counted
        from the end of the current step, so no measured window contains the work or its after-effects
        (loader workers that prefetched meanwhile, a drained device queue). The script then needs that
        many more steps; the record's notes say where it happened.
        """
        win = self._open
        if win is None or self._done:
            return
        step = self._count  # the step in progress
        self._open = None
        self._events = None
        self._restarts += 1
        cfg = self.config
        restart = step + 1 + cfg.warmup_steps
        remaining = cfg.windows - len(self._windows)
        self._edges = {e for e in self._edges if e <= step} | {
            restart + k * cfg.measure_steps for k in range(remaining + 1)
        }
        self._total = max(
            restart + remaining * cfg.measure_steps + (cfg.guard_steps if cfg.profile is None else 0),
            cfg.profile.total_steps if cfg.profile is not None else 0,
        )
        self._notes.append(
            f"{what} ran inside window {win['index']} at step {step} ({elapsed_ns / 1e6:.0f} ms): that window "
            f"was discarded and restarts at step {restart} after a fresh warm-up; dump before step "
            f"{cfg.warmup_steps}"
            # a stopping harness ends the script as the last window closes: nothing after it runs
            + ("" if self.stop else " or after the last window")
            + " to keep the planned schedule"
        )
        self._schedule_next()

    def tensors_dumped(
        self, path: str, digest: str, size_bytes: int, computed: dict[str, int] | None = None
    ) -> None:
        """``dump_tensors`` wrote ``path`` in this process: named in the record as this run's output, so the
        file is bound to the launch that produced it (``digest``: ``"blake3:<hex>"``; ``computed``: how many of
        its tensors are each kind the training computes, `perfgate.harness.computed`). A dump after the record
        was written rewrites it."""
        if os.getpid() != self._pid:
            return
        entry: dict[str, Any] = {
            "path": path,
            "digest": digest,
            "size_bytes": size_bytes,
            "step": self._count,
        }
        if computed is not None:
            entry["computed"] = computed
        self._dumps.append(entry)
        if self._written is not None and not self._closed:
            self._write()

    @property
    def origin_unix_ns(self) -> int:
        """Wall clock (ns) when this window was created, before the process trained (or dumped) anything."""
        return self._origin_unix_ns

    def note(self, text: str) -> None:
        """A line for the record's notes (the run's answer shows them as warnings)."""
        if os.getpid() == self._pid:
            self._notes.append(text)

    def metric_reported(self, name: str, value: float) -> None:
        """A task-quality metric of this run (the last value reported wins), named in the record."""
        if os.getpid() != self._pid:
            return
        self._metrics[name] = value
        if self._written is not None and not self._closed:
            self._write()

    def user_work_ran(self, what: str, elapsed_ns: int) -> None:
        """The training script's own ``what`` (e.g. ``torch.save``) ran inside the open window: kept in
        the measurement (it is the script's work) and named in the record's notes at the window's end."""
        entry = self._user_work.setdefault(what, [0, 0, self._count])
        entry[0] += 1
        entry[1] += elapsed_ns

    def phase_ran(self, kind: str, start_ns: int, end_ns: int) -> None:
        """An evaluation pass, a checkpoint or a marked phase (``kind``) ran from ``start_ns`` to ``end_ns``
        (``perf_counter_ns``). Consecutive calls of one kind with no training forward and no step boundary
        between them are one phase (the forwards of an evaluation pass, the files of a checkpoint)."""
        if os.getpid() != self._pid:
            return
        phases = self._phases
        if phases:
            last = phases[-1]
            if last[0] == kind and last[1] == self._count and last[5] == self._train_forwards:
                last[3] = end_ns
                last[4] += 1
                return
        if len(phases) >= MAX_PHASES:
            self._phases_dropped += 1
            return
        phases.append([kind, self._count, start_ns, end_ns, 1, self._train_forwards])

    def checkpoint_file(self, op: str, path: str, state: str | None = None) -> None:
        """A checkpoint writer (``op`` "save") or reader ("load") named ``path`` (absolute) while step
        ``steps_completed`` was in progress: the server aligns a resumed run's steps on it. ``state``: the
        digest `saved_state` gave what the writer was handed."""
        if os.getpid() != self._pid or len(self._checkpoint_files) >= MAX_CHECKPOINT_FILES:
            return
        self._checkpoint_files.append((op, self._count, path[:4096], state))

    def saved_state(self, schema: dict[str, Any]) -> str | None:
        """A checkpoint writer was handed a state of this schema (`perfgate.harness.saved_state.state_schema`):
        kept once per digest (up to `MAX_SAVED_STATES`); its digest, or None in a forked child."""
        if os.getpid() != self._pid:
            return None
        digest = str(schema["digest"])
        if digest not in self._saved_states and len(self._saved_states) < MAX_SAVED_STATES:
            self._saved_states[digest] = {k: v for k, v in schema.items() if k != "digest"}
        return digest

    def begin(self) -> None:
        """Mark the start of step 0 (done implicitly by the first ``step()`` block)."""
        if not self._begun:
            self._begin(_now())

    def _activate_probes(self) -> None:
        if self._instrument:
            hooks.activate(self, data_wait=self.config.data_wait, backward=self.config.backward)

    def _begin(self, start_ns: int) -> None:
        # Again at the first step: a script may import torch after creating its window.
        self._activate_probes()
        self._begun = True
        self._first_start_ns = start_ns
        if start_ns != self._origin_ns:  # a backdated start was not seen as it happened: no tick for it
            self._ticks.tick(0)
        if self.config.warmup_steps == 0:
            self._first_start_ns = self._start_window(0, synced=False, start_ns=start_ns)
        self._schedule_next()

    def step(self, samples: int | None = None, tokens: int | None = None) -> _StepScope:
        """Context manager around one training step; ``samples``/``tokens`` it processed (this rank)."""
        scope = self._scope
        scope.samples = samples
        scope.tokens = tokens
        return scope

    def mark_step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Record a step boundary: the step that began at the previous boundary ends now."""
        n = self._count + 1
        if n >= self._next_special:
            self._special_boundary(n, samples, tokens)
            return
        t = _now()
        self._ticks.tick(n)
        self._count = n
        events = self._events
        if events is not None:
            events[n - self._event_base].record()
        if samples is None:
            samples = self._fixed_samples if self._fixed_samples is not None else self._cur_samples
        self._steps.append(
            (t, self._cur_wait, self._cur_backward, samples, self._fixed_tokens if tokens is None else tokens)
        )
        self._cur_wait = 0
        self._cur_backward = 0
        self._cur_samples = None
        self._model_samples.append(None if self._cur_model_samples == -1 else self._cur_model_samples)
        self._cur_model_samples = None
        self._second_dim.append(None if self._cur_second == -1 else self._cur_second)
        self._cur_second = None
        self._own_steps.append(self.own_ns)
        self.own_ns = 0
        if self._scaler_steps:
            self._count_skips(n)

    def optimizer_step(self, optimizer: object) -> None:
        """Global optimizer post-hook target: the first optimizer that steps delimits steps."""
        key = id(optimizer)
        if self._first_optimizer != key:
            if self._first_optimizer is not None:
                self._other_optimizer_steps += 1
                return
            self._first_optimizer = key
        self.boundary("optimizer")

    def boundary(self, source: str, samples: int | None = None, tokens: int | None = None) -> None:
        """A step boundary found by ``source``: "gradients" (a manual update consumed them,
        `perfgate.harness.steps`), "optimizer" (a torch optimizer stepped) or "explicit"
        (``perfgate.harness.step()``). A source counts unless a stronger one (later in that list) has counted:
        once a torch optimizer steps the gradient rule stands down, and once the script marks its own steps
        the marker alone delimits them, so no update is counted twice."""
        current = self._step_source
        if source == current:  # the common case, every step: no ranking to do
            self.mark_step(samples, tokens)
            return
        if current is not None and _STEP_SOURCES.index(source) < _STEP_SOURCES.index(current):
            return
        if (
            current is not None
            and current != source
            and self._cur_backward == 0
            and self._cur_model_samples is None
        ):
            # the weaker source already ended this iteration (an optimizer step just before the first
            # step() call): the stronger one takes over from here without counting the iteration twice
            self._step_source = source
            return
        if current != source:
            if current is not None:
                self._notes.append(
                    f"steps 1..{self._count} were delimited by {current}, later steps by {source}: the earlier "
                    "ones stay in the warm-up"
                    if self._count <= self.config.warmup_steps
                    else f"steps 1..{self._count} were delimited by {current}, later steps by {source}"
                )
            self._step_source = source
        self.mark_step(samples, tokens)

    def add_data_wait(self, wait_ns: int, samples: int | None) -> None:
        """Called by the DataLoader hook with the time one ``next()`` blocked and its batch size."""
        self._cur_wait += wait_ns
        if not self._trained.is_set():
            self._trained.set()
        if samples is not None:
            self._cur_samples = samples if self._cur_samples is None else self._cur_samples + samples

    def add_model_samples(self, samples: int | None, second_dim: int | None = None) -> None:
        """Called by the forward hook with the batch of one top-level forward's input (its batch dimension)
        and that input's second dimension; a call whose input has none makes the step's count unknown (-1
        until the step ends)."""
        if self._train_start_ns is None:
            self._train_start_ns = _now()
            self._trained.set()
            _stop_startup()
        self._train_forwards += 1
        if samples is None or self._cur_model_samples == -1:
            self._cur_model_samples = -1
        else:
            self._cur_model_samples = (self._cur_model_samples or 0) + samples
        if second_dim is None or self._cur_second == -1:
            self._cur_second = -1
        else:
            self._cur_second = (self._cur_second or 0) + second_dim

    def correct_model_samples(self, counted: int, actual: int) -> None:
        """The forward in progress was counted as ``counted`` samples before its layout was known; it held
        ``actual``."""
        if self._cur_model_samples is not None and self._cur_model_samples != -1:
            self._cur_model_samples += actual - counted

    def note_batch_layout(self, dim: int, layer: str, batch: int) -> None:
        """The sequence-first ``layer`` inside the model saw ``batch`` samples, dimension ``dim`` of the
        model's input."""
        self._batch_layout = {"dim": dim, "layer": layer[:200], "layer_batch": batch}

    def note_autocast(self, dtype: str | None) -> None:
        """A training forward before the first window ran under autocast to ``dtype`` (None: without)."""
        self._autocast.add(dtype or "none")

    @property
    def windows_done(self) -> int:
        """Measured windows closed so far in this process."""
        return len(self._windows)

    def stream_rows_wanted(self) -> int:
        """How many more input rows (samples) the forward hook should digest: the first ``STREAM_ROWS`` of
        training, before any window is measured (reading the input back to the host costs a sync)."""
        if self._open is not None or self._windows or not self._inputs_known:
            return 0
        return max(0, STREAM_ROWS - self._inputs_read)

    def note_model(self, facts: dict[str, Any]) -> None:
        """Called once by the forward hook with the top-level training module's facts."""
        self._model = facts

    def add_stream(self, header: str, data: bytes | None, rows: int) -> None:
        """The next ``rows`` input rows' bytes, in order; ``header`` (dtype and per-row shape) is digested
        when it changes, so the digest does not depend on how the rows were split into micro-batches."""
        if data is None:
            self._inputs_known = False
            return
        if header != self._inputs_header:
            self._inputs.update(header.encode())
            self._inputs_header = header
        self._inputs.update(data)
        self._inputs_read += rows

    def add_backward(self, elapsed_ns: int) -> None:
        """Called by the backward hook with the host time one ``backward()`` call took."""
        self._cur_backward += elapsed_ns
        self._backward_calls += 1
        if self._backward_calls == 1:
            self._trained.set()

    def add_loss(self, tensor: Any) -> None:
        """Called by the backward hook: a scalar it runs on is a loss of the current step.

        Kept as a detached device tensor (no synchronisation) and read once at the next edge (a window's,
        or the record's). The scaled loss of a GradScaler is skipped: its unscaled value was noted by
        ``note_scaled_loss``.
        """
        if not self._collecting or id(tensor) == self._scaled_id:
            return
        numel = getattr(tensor, "numel", None)
        if numel is not None and numel() == 1:
            loss = tensor.detach()
            self._losses.append((self._count, loss))
            computed.saw_loss(loss)
            if self._done and len(self._losses) >= _JOB_LOSS_BATCH:
                self._read_outside()  # a job run after its windows: bounded device memory, one read per batch

    def note_scaled_loss(self, scaler: Any, loss: Any, scaled: Any) -> None:
        """Called by the GradScaler.scale hook: ``loss`` is the step's loss, ``scaled`` goes to backward."""
        self._scaler = scaler
        self._scaled_id = id(scaled)
        numel = getattr(loss, "numel", None)
        if self._collecting and numel is not None and numel() == 1:
            self._losses.append((self._count, loss.detach()))
            computed.saw_loss(self._losses[-1][1])

    def add_scaler_step(self, scaler: Any) -> None:
        """Called by the GradScaler.step hook (before the optimizer, which it skips on an overflow)."""
        self._scaler = scaler
        self._scaler_steps += 1
        self._scaler_marks.append(len(self._losses))

    def _count_skips(self, n: int) -> None:
        # Optimizer timing: this boundary is the one scaler step that reached the optimizer; any other
        # scaler step since the previous boundary was skipped (an inf/NaN gradient under AMP).
        skipped = self._scaler_steps - 1 if self.timing == "optimizer" else 0
        if skipped > 0 and self._collecting:
            self._skipped.append([n - 1, skipped])
            # the skipped iterations' losses belong to no update: keep the last iteration's only
            del self._losses[self._step_loss_start : self._scaler_marks[-2]]
        self._scaler_steps = 0
        self._scaler_marks = []
        self._step_loss_start = len(self._losses)

    def close(self, reason: str = "closed", error: str | None = None) -> Path | None:
        """Finish: stop a running profile, write the record (complete or not), detach hooks."""
        if self._closed:
            return self._written
        self._closed = True
        self._closed_event.set()
        self._stepped.set()
        self._trained.set()
        if self._profiler is not None:
            self._profiler.stop()
        if self._stop_reason is None:
            self._stop_reason = reason
        if error is not None:
            self._error = error
        hooks.deactivate(self)
        self._run_deferred()
        self._ticks.close()
        if not self._done or self.job:
            self._read_outside()  # an unfinished run's open window, or a job run's steps after its windows
        return self._write()

    def __enter__(self) -> Window:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        error = None if exc is None or isinstance(exc, WindowComplete) else f"{type(exc).__name__}: {exc}"
        self.close("window_complete" if self._done else "closed", error)

    def to_record(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (schema ``perfgate.harness.record`` version 1).

        Times ending in ``_ns`` are integers relative to the window's origin (``origin_unix_ns`` on
        the wall clock); ``steps`` holds one column per field, warm-up steps included
        (``steps.warmup`` counts them); ``windows`` lists the measured windows, each with its step
        range (``first_step``..``last_step`` inclusive), synchronised ``elapsed_ns``, optional device
        times in milliseconds and peak memory in bytes.
        """
        origin = self._origin_ns
        ends = [s[0] - origin for s in self._steps]
        starts: list[int] = []
        prev = self._first_start_ns - origin
        for i, end in enumerate(ends):
            start = self._window_starts.get(i)
            starts.append(prev if start is None else start)
            prev = end
        backend = self._backend
        profile = None if self._profiler is None else self._profiler.describe()
        return {
            "schema": RECORD_SCHEMA,
            "version": RECORD_VERSION,
            "label": self.config.label,
            "rank": self.rank.rank,
            "local_rank": self.rank.local_rank,
            "world_size": self.rank.world_size,
            "hostname": self.rank.hostname,
            "node": self._node,
            "pid": self.rank.pid,
            "timing": self.timing,
            "step_source": self._step_source,
            "warmup_steps": self.config.warmup_steps,
            "measure_steps": self.config.measure_steps,
            "windows_requested": self.config.windows,
            "complete": len(self._windows) == self.config.windows,
            "stop_reason": self._stop_reason,
            "error": self._error,
            "profiled": self._profiler is not None,
            "profile": profile,
            "device": asdict(backend.info) if backend is not None else None,
            "origin_unix_ns": self._origin_unix_ns,
            "steps": {
                "count": len(ends),
                "warmup": min(self.config.warmup_steps, len(ends)),
                "start_ns": starts,
                "end_ns": ends,
                "step_time_ns": [e - s for s, e in zip(starts, ends, strict=True)],
                "data_wait_ns": [s[1] for s in self._steps],
                "backward_ns": [s[2] for s in self._steps],
                "samples": [s[3] for s in self._steps],
                "tokens": [s[4] for s in self._steps],
                "model_samples": list(self._model_samples),
                "model_second_dim": list(self._second_dim),
            },
            "batch_layout": self._batch_layout,
            "autocast": sorted(self._autocast),
            "windows": list(self._windows),
            "other_optimizer_steps": self._other_optimizer_steps,
            "notes": list(self._notes),
            "python": sys.version.split()[0],
            "torch_version": getattr(sys.modules.get("torch"), "__version__", None),
            "runtime_env": self._runtime_env,
            "tensor_dumps": list(self._dumps),
            "metrics": dict(self._metrics),
            "sample_stream": self._inputs.hexdigest() if self._inputs_read and self._inputs_known else None,
            "model": self._model,
            "startup": None if (sampler := _state.startup()) is None else sampler.describe(),
            "harness_own": self._own_time(),
            "job": {
                "measured": self.job,
                "train_start_ns": None if self._train_start_ns is None else self._train_start_ns - origin,
                "phases": [
                    {"kind": k, "step": step, "start_ns": a - origin, "end_ns": b - origin, "calls": calls}
                    for k, step, a, b, calls, _ in self._phases
                ],
                "phases_dropped": self._phases_dropped,
                "checkpoint_files": [
                    {"op": op, "step": step, "path": path, "state": state}
                    for op, step, path, state in self._checkpoint_files
                ],
                "saved_states": dict(self._saved_states),
            },
            "outside_windows": {
                "loss": [list(p) for p in self._outside_loss],
                "nonfinite_loss_steps": list(self._outside_bad),
                "skipped_steps": list(self._outside_skipped),
            },
        }

    # ------------------------------------------------------------------ internals

    def _own_time(self) -> dict[str, Any]:
        """What perfgate's own code took of this process, as the harness timed itself: the median over the
        steps after warm-up (all steps where there are none) of each step's share, and the launcher's
        start-up (importing the harness to the script's first line; None without the launcher). Its probes'
        dispatch by torch, and the time a hook keeps the script from running on another core, are not in it."""
        steady = self._own_steps[self.config.warmup_steps :] or self._own_steps
        return {
            "median_step_ns": int(statistics.median(steady)) if steady else None,
            "max_step_ns": max(steady, default=None),
            "steps": len(steady),
            "startup_ns": _state.startup_own_ns(),
        }

    def _schedule_next(self) -> None:
        """Set the step count at which the next boundary leaves the fast path."""
        if self._done:
            self._next_special = 0
            return
        if not self._begun:
            self._next_special = 1
            return
        n = self._count
        if self._profiler is not None or self.config.progress_every:
            self._next_special = n + 1
            return
        upcoming = [e for e in self._edges if e > n]
        self._next_special = min(upcoming) if upcoming else self._total
        if self._runtime_env is None and n < 1:
            self._next_special = 1  # the fingerprint is read there (see _check_runtime_env)

    def _special_boundary(self, n: int, samples: int | None, tokens: int | None) -> None:
        if n == 1:
            _stop_startup()
        if self._done:
            self.work_starts()
            return
        if not self._begun:
            # mark_step() without begin(): step 0 started when the window was created.
            self._begin(self._origin_ns)
        self._stepped.set()
        t = _now()
        is_edge = n in self._edges
        events = self._events
        if is_edge:
            if events is not None:
                events[n - self._event_base].record()
            self._sync()
            t = _now()
        elif events is not None:
            events[n - self._event_base].record()
        self._ticks.tick(n)
        self._count = n
        if samples is None:
            samples = self._fixed_samples if self._fixed_samples is not None else self._cur_samples
        self._steps.append(
            (t, self._cur_wait, self._cur_backward, samples, self._fixed_tokens if tokens is None else tokens)
        )
        self._cur_wait = 0
        self._cur_backward = 0
        self._cur_samples = None
        self._model_samples.append(None if self._cur_model_samples == -1 else self._cur_model_samples)
        self._cur_model_samples = None
        self._second_dim.append(None if self._cur_second == -1 else self._cur_second)
        self._cur_second = None
        self._own_steps.append(self.own_ns)
        self.own_ns = 0
        if self._scaler_steps:
            self._count_skips(n)
        if self._runtime_env is None:
            if self._instrument:
                hooks.patch_savers()  # checkpoint modules the script imported since the window was made
            self._check_runtime_env(len(self._windows), first_boundary=True)
        if is_edge:
            if self._open is not None:
                self._end_window(t)
            if len(self._windows) < self.config.windows:
                self._start_window(n, synced=True)
        if self._profiler is not None:
            self._profiler.step()
        every = self.config.progress_every
        if every and (n % every == 0 or n == self._total) and self.rank.rank == 0:
            print(f"[perfgate] progress step={n} total={self._total}", file=sys.stderr, flush=True)
        if n >= self._total and self._open is None and (self._profiler is None or self._profiler.finished):
            self._finish()
            return
        self._schedule_next()

    def _device(self) -> DeviceBackend:
        # Re-detected while no accelerator was found: the script may initialise one after the first edge.
        if self._backend is None or self._backend.kind in ("cpu", "custom"):
            self._backend = detect_backend(self._user_sync, self.config.device_events)
        return self._backend

    def _sync(self) -> None:
        self._device().synchronize()

    def _start_window(self, n: int, synced: bool, start_ns: int | None = None) -> int:
        """Open a window whose first step is step ``n``; returns its start (perf_counter ns).

        ``start_ns`` backdates the start (a window opened at creation time): no synchronisation then.
        """
        if not synced and start_ns is None:
            self._sync()
        self._user_work = {}
        self._check_runtime_env(len(self._windows))
        self._read_outside()  # the losses since the previous edge (the warm-up's), before the window's start
        backend = self._device()
        backend.reset_peak_memory()
        events: list[Any] | None = None
        if backend.events:
            events = [backend.new_event() for _ in range(self.config.measure_steps + 1)]
        self._modules_at_start = frozenset(sys.modules)  # after this edge's own work
        start = _now() if start_ns is None else start_ns
        if events is not None:
            events[0].record()
        self._events = events
        self._event_base = n
        self._window_starts[n] = start - self._origin_ns
        self._open = {
            "index": len(self._windows),
            "first_step": n,
            "start_ns": start - self._origin_ns,
            "start_unix_ns": time.time_ns(),
            "loss_scale_start": self._loss_scale(),
            "backward_calls": self._backward_calls,  # the count at the start edge; the window's own at its end
        }
        return start

    def _replica_digest(self) -> str | None:
        """The parameters' digest after the last window's last update, where several ranks may hold replicas
        (`perfgate.harness.capture.replica_digest`); None in a single process. Taken after the edge's
        timestamp and before the next step starts: its cost lands on the first guard step, never on a
        window, and the step boundaries the server stamps still frame every window exactly."""
        if self.rank.world_size < 2:
            return None
        from perfgate.harness.capture import replica_digest

        return replica_digest()

    def _end_window(self, t: int) -> None:
        imported = self._imported_inside()  # first: the edge work below may import modules of its own
        win = self._open
        backend = self._backend
        assert win is not None and backend is not None
        events = self._events
        device_step_ms: list[float] | None = None
        device_elapsed_ms: float | None = None
        if events is not None:
            # The edge synchronisation has run, so every event has completed.
            device_step_ms = [float(a.elapsed_time(b)) for a, b in itertools.pairwise(events)]
            device_elapsed_ms = float(events[0].elapsed_time(events[-1]))
        allocated, reserved = backend.peak_memory_bytes()
        end_ns = t - self._origin_ns
        win.update(self._read_health(win["first_step"], self._count - 1))
        win.update(
            {
                "last_step": self._count - 1,
                "steps": self._count - win["first_step"],
                "end_ns": end_ns,
                "end_unix_ns": time.time_ns(),
                "elapsed_ns": end_ns - win["start_ns"],
                "device_elapsed_ms": device_elapsed_ms,
                "device_step_ms": device_step_ms,
                "peak_allocated_bytes": allocated,
                "peak_reserved_bytes": reserved,
                "host_rss_bytes": host_rss_bytes(),
                "host_peak_rss_bytes": host_peak_rss_bytes(),
                "backward_calls": self._backward_calls - win["backward_calls"],
            }
        )
        if len(self._windows) + 1 == self.config.windows:
            win["replica_digest"] = self._replica_digest()
        self._windows.append(win)
        self._open = None
        self._events = None
        self._note_user_work(win["index"], imported)
        self._run_deferred()

    def _check_runtime_env(self, index: int, first_boundary: bool = False) -> None:
        """The process's thread/precision/device settings: read into the record at the first step boundary
        (after the script's own set-up, the same point for a profiled run and a timed one), then again at each
        window's start edge (before its timestamp), where settings that changed since are noted."""
        from perfgate.harness.runtime_env import measure_runtime_env

        if self._runtime_env is None and not first_boundary:
            return  # a window opened at step 0, before the script's set-up: read at the first boundary
        now = measure_runtime_env()
        if self._runtime_env is None:
            self._runtime_env = now
            return
        changed = [
            f"{k} {self._runtime_env.get(k)}->{v}" for k, v in now.items() if self._runtime_env.get(k) != v
        ]
        if changed:
            self._notes.append(
                f"window {index}: the process's settings changed since the first step ({', '.join(changed)}): "
                "set them before the training loop"
            )

    def _imported_inside(self) -> list[str]:
        """Modules first imported since the open window started (cheap when there are none)."""
        if len(sys.modules) == len(self._modules_at_start):
            return []
        return sorted(m for m in list(sys.modules) if m not in self._modules_at_start)

    def _note_user_work(self, index: int, imported: list[str]) -> None:
        """Notes on the script's own work inside window ``index`` (after its end timestamp)."""
        if imported:
            shown = ", ".join(imported[:5]) + (", ..." if len(imported) > 5 else "")
            self._notes.append(
                f"window {index}: the script first imported {shown} inside it (import time counted as step "
                "time): import them before the training loop"
            )
        for what, (calls, elapsed, step) in self._user_work.items():
            self._notes.append(
                f"window {index}: the script's {what} ran {calls} time(s) inside it from step {step} "
                f"({elapsed / 1e6:.0f} ms counted as step time): move it outside the measured steps"
            )
        self._user_work = {}

    def _run_deferred(self) -> None:
        pending, self._deferred = self._deferred, []
        for write in pending:
            write()

    def _loss_scale(self) -> float | None:
        """The GradScaler's current scale (called at window edges only, after the synchronisation)."""
        scaler = self._scaler
        if scaler is None:
            return None
        try:
            value = float(scaler.get_scale())
            return value if math.isfinite(value) else None
        except (RuntimeError, TypeError, ValueError, AttributeError):  # an unusual scaler reports nothing
            return None

    def _read_health(self, first: int, last: int) -> dict[str, Any]:
        """Per-step losses of the window, read in one transfer at the edge.

        A step's loss is the sum over its micro-steps (loops that accumulate gradients divide each
        micro-loss by the accumulation count, so the sum is the step's loss).
        """
        losses, self._losses = self._losses, []
        skipped, self._skipped = self._skipped, []
        self._step_loss_start = 0
        out: dict[str, Any] = {
            "loss": None,
            "nonfinite_loss_steps": None,
            "skipped_steps": skipped,
            "loss_scale_end": self._loss_scale(),
        }
        per_step = _per_step(losses)
        if per_step is None:
            return out
        loss: list[float | None] = []
        bad: list[int] = []
        for step in range(first, last + 1):
            vals = per_step.get(step)
            if not vals:
                loss.append(None)
            elif all(math.isfinite(v) for v in vals):
                loss.append(math.fsum(vals))
            else:
                loss.append(None)
                bad.append(step)
        out["loss"] = loss
        out["nonfinite_loss_steps"] = bad
        return out

    def _read_outside(self) -> None:
        """Read the losses and skips gathered since the previous edge, outside every window, into the
        record's ``outside_windows`` (one transfer; at an edge, or before the record is written)."""
        losses, self._losses = self._losses, []
        self._step_loss_start = 0
        self._outside_skipped += self._skipped
        self._skipped = []
        if not losses:
            return
        try:
            per_step = _per_step(losses)
        except (RuntimeError, TypeError, ValueError) as exc:  # a device already torn down at exit
            self._notes.append(
                f"the losses of {len(losses)} step(s) outside the windows could not be read: {exc}"
            )
            return
        for step, vals in sorted((per_step or {}).items()):
            if all(math.isfinite(v) for v in vals):
                self._outside_loss.append((step, math.fsum(vals)))
            else:
                self._outside_bad.append(step)

    def _finish(self) -> None:
        self._read_outside()  # the steps after the last window: no window is open
        self._done = True
        self._next_special = 0
        self._stop_reason = "window_complete"
        if self._profiler is not None:
            self._profiler.stop()
        if self._other_optimizer_steps:
            self._notes.append(
                f"{self._other_optimizer_steps} steps of other optimizers were not counted as steps"
            )
        self._write()
        # Stopping is left to the start of the next step's work (`work_starts`): the script's own output of
        # the last step (its log line) still runs, and nothing after the record is measured.
        self._stop_pending = self.stop
        self._collecting = self.job
        if self.job:
            # every later boundary takes mark_step's fast path: recorded and sent to the server, nothing more
            self._next_special = _NEVER

    def work_starts(self) -> None:
        """The script starts new work: a step scope, a training forward, a batch fetch, a checkpoint, or a
        step boundary. After the last window, a stopping window ends the script here.

        Raises:
            WindowComplete: every window is measured and this window stops its script.
        """
        if self._stop_pending and os.getpid() == self._pid:
            self._stop_pending = False
            raise WindowComplete
        if (
            self._no_step is not None
            and os.getpid() == self._pid
            and threading.current_thread() is threading.main_thread()
        ):
            message, self._no_step = self._no_step, None
            raise NoStepFound(message)

    def _watch_for_steps(self, limit_s: float) -> None:
        """The no-step watch (a daemon thread of the launcher's window): once training began, wait ``limit_s``
        for the first step boundary; without one, stop the script at its next forward, batch or checkpoint
        (`work_starts` raises `NoStepFound`), or after `NO_STEP_GRACE_S` end the process here."""
        self._trained.wait()
        if self._stepped.wait(limit_s):
            return
        message = no_step_message(limit_s, self._train_forwards, self._backward_calls)
        self._no_step = message
        if self._closed_event.wait(NO_STEP_GRACE_S):
            return
        self.close("no_step_found", message)
        print(f"[perfgate] {message}", file=sys.stderr, flush=True)
        os._exit(NO_STEP_EXIT)

    def _write(self) -> Path | None:
        record_dir = self.config.record_dir
        if record_dir is None:
            return None
        if self._stream:
            # The server gathers it from this rank's stdout (its launcher forwards it): the record
            # folder is the server's and may not exist on this node.
            stream_record(self.to_record())
            return None
        self._written = write_record(record_path(record_dir, self.rank.rank), self.to_record())
        return self._written

    def _close_at_exit(self) -> None:
        if not self._closed:
            self.close("process_exit")


def no_step_message(limit_s: float, forwards: int, backwards: int) -> str:
    """Why a launch that trained without a step boundary was stopped, and the line that fixes it."""
    return (
        f"no training step found in the {limit_s:g} s after training began ({forwards} training forward(s) of "
        f"the model, {backwards} backward() call(s) seen); looked for {steps.LOOKED_FOR}. Add the line "
        "`perfgate.harness.step()` (with `import perfgate.harness`) at the end of each training iteration and "
        "measure again"
    )


def step(samples: int | None = None, tokens: int | None = None) -> bool:
    """Mark a step boundary in one line, at the end of each training iteration: the step that began at the
    previous one ends now (``samples``/``tokens``: what it processed on this rank, else what the harness
    counted). From the first call on, these calls alone delimit steps. For loops whose steps the harness does
    not find by itself (`perfgate.harness.steps` says which it finds).

    Returns False, doing nothing, when no harness window is active (the script run without perfgate).
    """
    window = _state.active_window()
    if window is None:
        return False
    start = _now()
    window.boundary("explicit", samples, tokens)
    window.own_ns += _now() - start
    return True


def report_metric(name: str, value: float) -> bool:
    """Report a task-quality metric of this run (e.g. ``report_metric("eval_accuracy", 0.91)`` after an
    evaluation), recorded in the run's harness record: the window evidence shows it, and
    ``check_training_health`` offers it as ``eval:<name>`` for a training change's quality criterion. Bound to
    the launch by construction, unlike a number copied into a file. Call it outside measured windows (after
    the last one, or before the first): it is cheap, but evaluation is not.

    Returns False when no harness window exists in this process (the metric is then not recorded).

    Raises:
        ValueError: an empty or over-long name, or a value that is not a finite number.
    """
    if not isinstance(name, str) or not 0 < len(name) <= 100:  # pyright: ignore[reportUnnecessaryIsInstance]  # caller input
        raise ValueError("a metric name is a non-empty string of at most 100 characters")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"metric {name!r} is {value!r}: report a finite number")
    window = _state.active_window()
    if window is None:
        return False
    window.metric_reported(name, number)
    return True


class phase:
    """Mark a phase of the job in one line: ``with perfgate.harness.phase("eval"): evaluate()``.

    A run measured with ``job=true`` reports each kind's time (``eval``, ``checkpoint``, or a name of your
    own: 1-40 letters, digits, ``_.:-``) beside its steps. Evaluation forwards under ``no_grad`` and
    ``torch.save`` are found without a marker; mark what the harness cannot see (an evaluation on another
    module, a sharded checkpoint writer). Outside a harness window it does nothing.

    Raises:
        ValueError: a name outside that alphabet or length.
    """

    __slots__ = ("_name", "_start", "_window")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or _PHASE_NAME.fullmatch(name) is None:  # pyright: ignore[reportUnnecessaryIsInstance]  # caller input
            raise ValueError(
                f"phase name {name!r}: use 1-40 letters, digits or _.:- (e.g. 'eval', 'checkpoint')"
            )
        self._name = name
        self._start = 0
        self._window: Any = None

    def __enter__(self) -> phase:
        window = _state.active_window()
        if window is not None:
            window.work_starts()
        self._window = window
        self._start = _now()
        return self

    def __exit__(self, *exc: object) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.phase_ran(self._name, self._start, _now())


def _preload_own_modules() -> None:
    """Import what perfgate's in-process helpers need now, before any window: an import inside a
    window would be counted as step time. Neither module imports torch or mcp."""
    import importlib

    for name in ("perfgate.harness.dump", "perfgate.harness.samples", "perfgate.harness.runtime_env"):
        importlib.import_module(name)
    host_rss_bytes()  # its first call imports a codec


def _start_profiler(cfg: ProfileConfig, rank: int) -> Any:
    from perfgate.harness.profiling import ProfilerDriver

    driver = ProfilerDriver(cfg, rank)
    driver.start()
    return driver
