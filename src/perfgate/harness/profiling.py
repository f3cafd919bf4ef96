"""Drive ``torch.profiler`` on a step schedule and write one Kineto trace per rank.

Used by profile_segment's run mode. A profiled run's step times are inflated by the profiler, so the
record is flagged ``profiled`` and can never serve as throughput evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfgate.harness.config import ProfileConfig
from perfgate.harness.line_ranges import LineRanges
from perfgate.harness.module_ranges import ModuleRanges

__all__ = ["ProfilerDriver", "available_activities", "trace_path"]


def trace_path(trace_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its trace inside ``trace_dir``."""
    return Path(trace_dir) / f"rank{rank}.pt.trace.json"


def available_activities() -> list[Any]:
    """CPU plus every device activity this torch build supports *and* this host can run."""
    import torch
    from torch.profiler import ProfilerActivity

    supported = set(torch.profiler.supported_activities())
    wanted = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        wanted.append(ProfilerActivity.CUDA)
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        wanted.append(ProfilerActivity.XPU)
    mtia = getattr(torch, "mtia", None)
    if mtia is not None and mtia.is_available():
        wanted.append(ProfilerActivity.MTIA)
    # A PrivateUse1 backend (MUSA via torch_musa, ...) renames itself; ask the renamed module.
    custom = torch._C._get_privateuse1_backend_name()  # pyright: ignore[reportPrivateUsage] -- the public way to learn the renamed backend
    module = getattr(torch, custom, None) if custom != "privateuseone" else None
    is_available = getattr(module, "is_available", None)
    if is_available is not None and is_available():
        wanted.append(ProfilerActivity.PrivateUse1)
    return [a for a in wanted if a in supported]


class ProfilerDriver:
    """One ``torch.profiler.profile`` with ``schedule(skip_first, wait, warmup, active, repeat=1)``."""

    def __init__(self, config: ProfileConfig, rank: int) -> None:
        import torch

        self.config = config
        self.rank = rank
        self.path = trace_path(config.trace_dir, rank)
        self.activities = available_activities()
        self.steps = 0
        self.finished = False
        self.saved = False
        self._running = False
        profiler: Any = torch.profiler
        self._profile: Any = profiler.profile(
            activities=self.activities,
            schedule=profiler.schedule(
                skip_first=config.skip_first,
                wait=config.wait,
                warmup=config.warmup,
                active=config.active,
                repeat=1,
            ),
            on_trace_ready=self._save,
            record_shapes=config.record_shapes,
            with_flops=config.with_flops,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
            with_modules=config.with_modules,
        )
        # Eager modules are named only by these ranges (torch's with_modules covers TorchScript).
        self._modules: ModuleRanges | None = ModuleRanges() if config.with_modules else None
        # With stacks, the loop's own line for every op (its frame is named by the line tracing began at).
        self._lines: LineRanges | None = LineRanges() if config.with_stack else None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._profile.start()
        if self._modules is not None:
            self._modules.install()
        self._running = True

    def step(self) -> None:
        """Advance the schedule by one training step; stops the profiler once the trace is saved."""
        if not self._running:
            return
        self.steps += 1
        if self._lines is not None and not self._lines.installed:
            # The first step runs inside the loop's optimizer step: the loop is on the stack.
            self._lines.install()
        self._profile.step()
        if self.steps >= self.config.total_steps:
            self.stop()

    def stop(self) -> None:
        """Stop profiling (idempotent); a trace cut short by the run ending is still saved."""
        if not self._running:
            return
        self._running = False
        if self._modules is not None:
            self._modules.remove()
        if self._lines is not None:
            self._lines.remove()
        self._profile.stop()
        self.finished = True

    def describe(self) -> dict[str, Any]:
        """The record's ``profile`` entry: where the trace is and which steps it covers."""
        c = self.config
        first_active = c.skip_first + c.wait + c.warmup
        return {
            "trace_path": str(self.path) if self.saved else None,
            "complete": self.saved and self.steps >= c.total_steps,
            "activities": [str(a).rsplit(".", 1)[-1] for a in self.activities],
            "schedule": {"skip_first": c.skip_first, "wait": c.wait, "warmup": c.warmup, "active": c.active},
            "active_steps": [first_active, first_active + c.active - 1],
            "steps_seen": self.steps,
            "record_shapes": c.record_shapes,
            "with_flops": c.with_flops,
            "profile_memory": c.profile_memory,
            "with_stack": c.with_stack,
            "with_modules": c.with_modules,
        }

    def _save(self, prof: Any) -> None:
        prof.export_chrome_trace(str(self.path))
        self.saved = True
