"""Tensor dumps a launched script asks for but the harness never let it reach.

In stop mode the harness ends the training script as the last measured window closes (a ``SystemExit``
from the optimizer step), so a ``dump_tensors`` call placed after the training loop never runs and the
run's ``tensor_dumps`` is empty. The call sites are found in the source of the Python files the command
names (a syntax tree, so comments and strings do not count). The dumps a run did write are listed
from its rank records (`tensor_dumps`).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from perfgate.benchmarking.workload.provenance import workspace_relative

if TYPE_CHECKING:
    from perfgate.benchmarking.reading.records import RankRecord

__all__ = ["MAX_SOURCE_BYTES", "TensorDump", "dump_call_lines", "tensor_dumps", "unreached_dump_warning"]

MAX_SOURCE_BYTES = 4 << 20
"""Larger scripts are not read for call sites (a generated file, not a training script)."""


class TensorDump(BaseModel):
    path: str = Field(description="The file dump_tensors wrote, relative to the workspace when inside it.")
    digest: str = Field(
        description="Its content digest with the algorithm's name (hashed as it was written): 'blake3:<hex>', or "
        "'sha256:<hex>' in a run record written before BLAKE3."
    )
    size_bytes: int
    launch: int = Field(description="The launch (0-based, in this call) whose process wrote it.")
    launch_id: int | None = Field(
        default=None,
        description="That launch's number in the workspace (launch_ids[launch]): what {launch} in the path "
        "became, so a name written with it carries this number. Null: not numbered by the server.",
    )
    rank: int
    step: int = Field(description="Steps completed in that process when it was written.")
    computed: dict[str, int] | None = Field(
        default=None,
        description="How many of its tensors the training computes, by kind (parameter after an update, gradient, "
        "optimizer_state, loss, autograd), matched by value whatever their names; 'none': inputs, labels, frozen "
        "or stale tensors. A tensor check of a file with nothing computed cannot carry a keep. Null: not told "
        "(no training module seen).",
    )


def tensor_dumps(
    workspace: Path, launch: int, records: Sequence[RankRecord], launch_id: int | None = None
) -> list[TensorDump]:
    """The dumps each rank's record of ``launch`` (the workspace's launch ``launch_id``) names, with paths
    relative to the workspace where inside it."""
    return [
        TensorDump(
            path=workspace_relative(Path(d.path), workspace),
            digest=digest,
            size_bytes=d.size_bytes,
            launch=launch,
            launch_id=launch_id,
            rank=r.rank,
            step=d.step,
            computed=d.computed,
        )
        for r in records
        for d in r.tensor_dumps
        if (digest := d.named_digest) is not None
    ]


def dump_call_lines(source: str) -> list[int]:
    """Lines of ``source`` that call ``dump_tensors`` (by name or as an attribute); empty when it does not
    parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if name == "dump_tensors":
                lines.append(node.lineno)
    return sorted(lines)


def unreached_dump_warning(scripts: dict[str, Path], warmup_steps: int) -> str | None:
    """The warning for a run that wrote no dump although a script it ran calls ``dump_tensors``, or None.

    ``scripts``: workspace-relative name -> path of each file the command names.
    """
    sites: list[str] = []
    for name, path in scripts.items():
        if path.suffix != ".py":
            continue
        try:
            if path.stat().st_size > MAX_SOURCE_BYTES:
                continue
            source = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        sites += [f"{name}:{line}" for line in dump_call_lines(source)]
    if not sites:
        return None
    return (
        f"tensor_dumps is empty although {', '.join(sites[:5])} calls dump_tensors: the harness ends the script "
        "as the last measured window closes, so a call after the training loop never runs; move the dump into "
        f"the warm-up (before optimizer step {warmup_steps}, e.g. after the first step), where it is recorded "
        "and costs no window"
    )
