"""Errors of the benchmarking library; the tool layer turns them into agent-facing ToolErrors."""

from __future__ import annotations

__all__ = ["BenchmarkError", "ContractError", "RecordError"]


class BenchmarkError(ValueError):
    """Something the caller can fix; the message says what to do next."""


class RecordError(BenchmarkError):
    """A harness record file is missing, unreadable or of an unknown format."""


class ContractError(BenchmarkError):
    """The declared contract contradicts itself (e.g. the global batch does not add up)."""
