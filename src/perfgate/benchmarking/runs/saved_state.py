"""What a run's checkpoint saves held, from its harness records (`perfgate.harness.saved_state`).

Each distinct state a checkpoint writer was handed (``torch.save``, DCP ``save``, safetensors ``save_file``)
is listed once per window record with its digest, its keys with their shapes and dtypes, and how many saves
wrote it. The keep's ``checkpoint_resume`` gate compares the baseline's with the candidate's
(`perfgate.decisions.saved_state`): a change that leaves what is saved as it was needs no resume on that
account; one that changes it must still load a checkpoint the baseline saved.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from perfgate.benchmarking.reading.records import RankRecord

__all__ = ["SavedState", "saved_states"]


class SavedState(BaseModel):
    """One distinct state the run's checkpoint writers were handed (rank 0)."""

    digest: str = Field(
        description="Digest of every key with its shape and dtype (sorted): equal means equal."
    )
    keys: int = Field(description="Keys walked (entries lists the first of them).")
    entries: list[tuple[str, list[int] | None, str]] = Field(
        description="[key, shape, dtype] sorted by key; shape null and dtype 'value' for a non-tensor value, "
        "dtype 'values' for a list of them (shape [length])."
    )
    complete: bool = Field(
        description="False: the object was larger than the harness walks; keys counts what it read."
    )
    saves: int = Field(description="Saves of this state that named a file, over the launches.")


def saved_states(records: Sequence[RankRecord]) -> list[SavedState]:
    """The distinct saved states of rank 0's records (one per launch), in the order first seen."""
    found: dict[str, SavedState] = {}
    for record in records:
        job = record.job
        if job is None:
            continue
        for digest, state in job.saved_states.items():
            if digest not in found:
                entries = [(k, list(s) if s is not None else None, d) for k, s, d in state.entries]
                found[digest] = SavedState(
                    digest=digest, keys=state.keys, entries=entries, complete=state.complete, saves=0
                )
        for f in job.checkpoint_files:
            if f.op == "save" and f.state in found:
                found[f.state].saves += 1
    return list(found.values())
