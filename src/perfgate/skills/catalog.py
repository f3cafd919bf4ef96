"""The skill's files and their MCP addresses: SKILL.md plus one reference per topic.

The markdown ships as package data next to this module; the server serves each file as a listed
resource and ``perfgate skill install`` copies the same files into an agent's skill folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfgate._toolnames import TOOL_MODULES

__all__ = [
    "REFERENCES",
    "SKILL_DIR",
    "SKILL_FILE",
    "SKILL_NAME",
    "SKILL_URI",
    "TOOL_REFERENCE_PREFIX",
    "URI_PREFIX",
    "Reference",
    "reference",
    "skill_files",
    "tool_reference",
]

SKILL_NAME = "perfgate"
SKILL_DIR = Path(__file__).resolve().parent
SKILL_FILE = "SKILL.md"
URI_PREFIX = f"skill://{SKILL_NAME}/"
SKILL_URI = URI_PREFIX + SKILL_FILE


@dataclass(frozen=True)
class Reference:
    """One topic of the skill, a markdown file under ``references/``."""

    name: str
    title: str
    summary: str

    @property
    def relative_path(self) -> str:
        """Path inside the skill folder, as SKILL.md links it."""
        return f"references/{self.name}.md"

    @property
    def uri(self) -> str:
        return URI_PREFIX + self.relative_path

    @property
    def path(self) -> Path:
        return SKILL_DIR / self.relative_path


_TOPICS: tuple[Reference, ...] = (
    Reference(
        "measurement",
        "Measurement and timing windows",
        "Steady-state windows, warm-up, synchronization, repeats, noise and the measurement contract.",
    ),
    Reference(
        "profiling",
        "Profiling layers",
        "Framework trace, system timeline (nsys/msys), kernel counters (ncu/mcu) and what each may prove.",
    ),
    Reference(
        "mfu-and-flops",
        "MFU, HFU and FLOP conventions",
        "Model vs hardware vs profiler FLOPs, per-device per-step units, sourced peaks, mixed shapes.",
    ),
    Reference(
        "correctness",
        "Correctness and tolerances",
        "Change classification, reference captures, tensor parity with declared tolerances, task quality.",
    ),
    Reference(
        "vocabulary",
        "The contract vocabulary",
        "Every contract key, semantic or execution, with its meaning and synonyms (generated from the code).",
    ),
    Reference(
        "data-pipeline",
        "Data pipeline and sample audits",
        "Loader stalls, host-to-device copies, sharding, set_epoch, padding, resume, and sample-id audits.",
    ),
    Reference(
        "distributed-memory",
        "Distributed training and memory",
        "DDP/FSDP, communication overlap, rank skew, recompute, memory budgets and layout planning.",
    ),
    Reference(
        "compile-and-launch",
        "Compilation and launch overhead",
        "torch.compile warm-up, graph breaks, recompiles, host synchronization, launch-bound steps.",
    ),
    Reference(
        "musa",
        "Moore Threads MUSA",
        "torch_musa, MUSA environment variables, MCCL, mthreads-gmi, msys/mcu, CUDA-to-MUSA pitfalls.",
    ),
    Reference(
        "moe",
        "Mixture-of-experts tuning",
        "Fit, scale, profile, retune, validate; the attention and expert meshes; dispatchers; 50-step runs.",
    ),
    Reference(
        "checkpoint-conversion",
        "Checkpoint conversion and resume",
        "Why strict loading proves nothing, value parity, key mapping for compiled/wrapped/converted "
        "weights, resume state.",
    ),
    Reference(
        "casebook",
        "Casebook: from evidence to a candidate",
        "Which candidate each finding suggests, its guard, and the evidence level behind each lesson.",
    ),
)


TOOL_REFERENCE_PREFIX = "tool-"


def _tool_references() -> tuple[Reference, ...]:
    return tuple(
        Reference(
            f"{TOOL_REFERENCE_PREFIX}{name}",
            f"Tool {name}",
            f"Every input of {name} (type, default, bounds, meaning), what it is for, and its answer's fields.",
        )
        for name in TOOL_MODULES
    )


REFERENCES: tuple[Reference, ...] = (*_TOPICS, *_tool_references())
"""The topics above, then one generated page per tool (``perfgate schemas`` writes them from the code):
tools/list carries no field descriptions, these pages carry them all."""


def tool_reference(tool: str) -> Reference | None:
    """The generated page of the shipped tool ``tool`` (None for a tool perfgate does not ship)."""
    for ref in REFERENCES:
        if ref.name == f"{TOOL_REFERENCE_PREFIX}{tool}":
            return ref
    return None


def reference(name: str) -> Reference:
    """The reference called ``name`` (file stem, e.g. ``'musa'``).

    Raises:
        KeyError: no reference has that name.
    """
    for ref in REFERENCES:
        if ref.name == name:
            return ref
    raise KeyError(name)


def skill_files() -> dict[str, Path]:
    """Every file of the skill folder: relative path -> packaged file, SKILL.md first."""
    files = {SKILL_FILE: SKILL_DIR / SKILL_FILE}
    files.update({ref.relative_path: ref.path for ref in REFERENCES})
    return files
