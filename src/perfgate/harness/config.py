"""Harness settings, read from ``PERFGATE_*`` environment variables and overridable by CLI flags.

The environment is the channel a launcher (perfgate's run tools, torchrun children) uses to pass the
same settings to every rank; :meth:`HarnessConfig.to_env` is its exact inverse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = [
    "CAPTURE_KINDS",
    "DEFAULT_CAPTURE_PATH",
    "ENV_PREFIX",
    "NO_STEP_LIMIT_S",
    "ConfigError",
    "HarnessConfig",
    "ProfileConfig",
    "TimingMode",
]

ENV_PREFIX = "PERFGATE_"
CAPTURE_KINDS = ("parameters", "gradients", "optimizer_state")
DEFAULT_CAPTURE_PATH = "captures/{label}-{launch}.safetensors"
NO_STEP_LIMIT_S = 60.0
"""Seconds after the training's first forward, backward() or batch within which the zero-code-change launcher
must find a step boundary; past it the launch stops and says what it looked for (``PERFGATE_NO_STEP_S``; 0:
never stop)."""
TimingMode = Literal["optimizer", "explicit"]
_TIMING_MODES: tuple[TimingMode, ...] = ("optimizer", "explicit")


class ConfigError(ValueError):
    """A harness setting has an invalid value; the message names the variable or flag to fix."""


@dataclass(frozen=True)
class ProfileConfig:
    """A ``torch.profiler`` schedule (in optimizer steps) and what to record; one trace per rank."""

    trace_dir: str
    skip_first: int = 1
    wait: int = 0
    warmup: int = 1
    active: int = 2
    record_shapes: bool = False
    with_flops: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_modules: bool = False

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ConfigError("profile warmup must be >= 1: the first profiled steps carry start-up skew")
        if self.active < 1:
            raise ConfigError("profile active must be >= 1")
        if self.skip_first < 0 or self.wait < 0:
            raise ConfigError("profile skip_first and wait must be >= 0")

    @property
    def total_steps(self) -> int:
        """Steps the schedule needs before its single trace is complete."""
        return self.skip_first + self.wait + self.warmup + self.active


@dataclass(frozen=True)
class HarnessConfig:
    """What the harness measures and where it writes. Step counts are optimizer updates."""

    record_dir: str | None = None
    warmup_steps: int = 5
    measure_steps: int = 20
    windows: int = 1
    stop: bool = True
    timing: TimingMode = "optimizer"
    samples_per_step: int | None = None
    tokens_per_step: int | None = None
    data_wait: bool = True
    backward: bool = True
    device_events: bool | None = None
    progress_every: int = 0
    guard_steps: int = 0
    """Steps timed after the last window: steady-state steps the server compares the windows with, so work the
    script does differently while it is measured shows (`perfgate.benchmarking.windows.corroborate`; the server asks
    for them, see `default_guard_steps`). None under a profile."""
    label: str | None = None
    profile: ProfileConfig | None = field(default=None)
    capture_step: int | None = None
    """Write the model's tensors (``capture_what``) to ``capture_path`` once this many optimizer steps are done
    (see `perfgate.harness.capture`); None: no capture."""
    capture_what: tuple[str, ...] = ("parameters",)
    capture_path: str = DEFAULT_CAPTURE_PATH
    no_step_s: float = NO_STEP_LIMIT_S
    """Stop the launch when no step boundary is found this many seconds after training began (optimizer timing;
    0: never), see `NO_STEP_LIMIT_S`."""
    job: bool = False
    """Measure the whole job beside the windows: the script runs to its own end (never stopped), every step
    boundary after the windows is still recorded, and its evaluation and checkpoint phases are timed."""

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps must be >= 0")
        if self.measure_steps < 1:
            raise ConfigError("measure_steps must be >= 1")
        if self.windows < 1:
            raise ConfigError("windows must be >= 1")
        if self.timing not in _TIMING_MODES:
            raise ConfigError(f"timing must be one of {_TIMING_MODES}, got {self.timing!r}")
        for name in ("samples_per_step", "tokens_per_step"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.progress_every < 0:
            raise ConfigError("progress_every must be >= 0")
        if self.guard_steps < 0:
            raise ConfigError("guard_steps must be >= 0")
        if not self.no_step_s >= 0:
            raise ConfigError("no_step_s must be >= 0 (0: never stop for want of a step)")
        if self.capture_step is not None and self.capture_step < 1:
            raise ConfigError("capture_step must be >= 1 (optimizer steps completed)")
        unknown = [w for w in self.capture_what if w not in CAPTURE_KINDS]
        if unknown or not self.capture_what:
            raise ConfigError(
                f"capture_what must name some of {', '.join(CAPTURE_KINDS)}, got {self.capture_what!r}"
            )

    @property
    def total_steps(self) -> int:
        """Optimizer steps after which every requested window, its guard steps (and profile) are complete."""
        steps = self.warmup_steps + self.measure_steps * self.windows
        if self.profile is None:
            steps += self.guard_steps
        else:
            steps = max(steps, self.profile.total_steps)
        return steps

    def with_overrides(self, **changes: object) -> HarnessConfig:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        kept = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **kept)  # pyright: ignore[reportArgumentType] -- names checked by replace()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HarnessConfig:
        """Build a config from ``PERFGATE_*`` variables; unset ones keep their defaults.

        Raises:
            ConfigError: a variable holds a value of the wrong kind.
        """
        src = os.environ if env is None else env
        reader = _EnvReader(src)
        profile: ProfileConfig | None = None
        trace_dir = reader.text("PROFILE_DIR")
        if trace_dir is not None:
            profile = ProfileConfig(
                trace_dir=trace_dir,
                skip_first=reader.integer("PROFILE_SKIP_FIRST", 1),
                wait=reader.integer("PROFILE_WAIT", 0),
                warmup=reader.integer("PROFILE_WARMUP", 1),
                active=reader.integer("PROFILE_ACTIVE", 2),
                record_shapes=reader.flag("PROFILE_RECORD_SHAPES", False),
                with_flops=reader.flag("PROFILE_WITH_FLOPS", False),
                profile_memory=reader.flag("PROFILE_MEMORY", False),
                with_stack=reader.flag("PROFILE_WITH_STACK", False),
                with_modules=reader.flag("PROFILE_WITH_MODULES", False),
            )
        timing = reader.text("TIMING") or "optimizer"
        if timing not in _TIMING_MODES:
            raise ConfigError(f"{ENV_PREFIX}TIMING must be one of {_TIMING_MODES}, got {timing!r}")
        events = reader.text("DEVICE_EVENTS")
        return cls(
            record_dir=reader.text("RECORD_DIR"),
            warmup_steps=reader.integer("WARMUP_STEPS", 5),
            measure_steps=reader.integer("MEASURE_STEPS", 20),
            windows=reader.integer("WINDOWS", 1),
            stop=reader.flag("STOP", True),
            timing=timing,  # pyright: ignore[reportArgumentType] -- membership checked above
            samples_per_step=reader.optional_integer("SAMPLES_PER_STEP"),
            tokens_per_step=reader.optional_integer("TOKENS_PER_STEP"),
            data_wait=reader.flag("DATA_WAIT", True),
            backward=reader.flag("BACKWARD", True),
            device_events=None if events is None or events == "auto" else reader.flag("DEVICE_EVENTS", True),
            progress_every=reader.integer("PROGRESS_EVERY", 0),
            guard_steps=reader.integer("GUARD_STEPS", 0),
            label=reader.text("LABEL"),
            profile=profile,
            capture_step=reader.optional_integer("CAPTURE_STEP"),
            capture_what=tuple((reader.text("CAPTURE_WHAT") or "parameters").split(",")),
            capture_path=reader.text("CAPTURE_PATH") or DEFAULT_CAPTURE_PATH,
            job=reader.flag("JOB", False),
            no_step_s=reader.number("NO_STEP_S", NO_STEP_LIMIT_S),
        )

    def to_env(self) -> dict[str, str]:
        """The ``PERFGATE_*`` variables that make :meth:`from_env` return this config."""
        out: dict[str, str] = {
            "WARMUP_STEPS": str(self.warmup_steps),
            "MEASURE_STEPS": str(self.measure_steps),
            "WINDOWS": str(self.windows),
            "STOP": _flag(self.stop),
            "TIMING": self.timing,
            "DATA_WAIT": _flag(self.data_wait),
            "BACKWARD": _flag(self.backward),
            "DEVICE_EVENTS": "auto" if self.device_events is None else _flag(self.device_events),
            "PROGRESS_EVERY": str(self.progress_every),
            "GUARD_STEPS": str(self.guard_steps),
        }
        if self.record_dir is not None:
            out["RECORD_DIR"] = self.record_dir
        if self.samples_per_step is not None:
            out["SAMPLES_PER_STEP"] = str(self.samples_per_step)
        if self.tokens_per_step is not None:
            out["TOKENS_PER_STEP"] = str(self.tokens_per_step)
        if self.label is not None:
            out["LABEL"] = self.label
        if self.job:
            out["JOB"] = "1"
        if self.no_step_s != NO_STEP_LIMIT_S:
            out["NO_STEP_S"] = f"{self.no_step_s:g}"
        if self.capture_step is not None:
            out["CAPTURE_STEP"] = str(self.capture_step)
            out["CAPTURE_WHAT"] = ",".join(self.capture_what)
            out["CAPTURE_PATH"] = self.capture_path
        p = self.profile
        if p is not None:
            out.update(
                {
                    "PROFILE_DIR": p.trace_dir,
                    "PROFILE_SKIP_FIRST": str(p.skip_first),
                    "PROFILE_WAIT": str(p.wait),
                    "PROFILE_WARMUP": str(p.warmup),
                    "PROFILE_ACTIVE": str(p.active),
                    "PROFILE_RECORD_SHAPES": _flag(p.record_shapes),
                    "PROFILE_WITH_FLOPS": _flag(p.with_flops),
                    "PROFILE_MEMORY": _flag(p.profile_memory),
                    "PROFILE_WITH_STACK": _flag(p.with_stack),
                    "PROFILE_WITH_MODULES": _flag(p.with_modules),
                }
            )
        return {ENV_PREFIX + k: v for k, v in out.items()}


def default_guard_steps(measure_steps: int) -> int:
    """Guard steps the server asks for: a quarter of a window, at least 3 (the fewest a median compares)."""
    return max(3, -(-measure_steps // 4))


def _flag(value: bool) -> str:
    return "1" if value else "0"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class _EnvReader:
    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def text(self, name: str) -> str | None:
        value = self._env.get(ENV_PREFIX + name)
        return value if value else None

    def integer(self, name: str, default: int) -> int:
        value = self.optional_integer(name)
        return default if value is None else value

    def optional_integer(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name} must be an integer, got {value!r}") from None

    def number(self, name: str, default: float) -> float:
        value = self.text(name)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name} must be a number, got {value!r}") from None

    def flag(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{ENV_PREFIX}{name} must be 1 or 0, got {value!r}")
