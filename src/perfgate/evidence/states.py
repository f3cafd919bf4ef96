"""Evidence states. Tools set them from what they observed; no tool lets the agent choose one."""

from __future__ import annotations

from enum import Enum

__all__ = ["EvidenceState"]


class EvidenceState(str, Enum):
    """What a piece of evidence is worth.

    - ``planned``: a plan or estimate; nothing was measured.
    - ``scaffolded``: the exact command to capture it was prepared, but it has not been run.
    - ``executed``: something ran (or was computed) and produced data; no pass/fail judgement applies.
    - ``passed``: a check ran and its criterion held.
    - ``failed``: a check ran and its criterion did not hold, or the run itself failed.
    - ``unavailable``: it could not be observed here (missing hardware, tool or input).
    """

    PLANNED = "planned"
    SCAFFOLDED = "scaffolded"
    EXECUTED = "executed"
    PASSED = "passed"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"
