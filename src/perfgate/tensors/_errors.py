"""Errors of the tensor readers and the comparison."""

from __future__ import annotations

__all__ = ["ComparisonCancelled", "TensorInputError"]


class TensorInputError(ValueError):
    """A tensor file or a comparison request the caller must fix; the message says what and how."""


class ComparisonCancelled(Exception):
    """The caller asked the comparison to stop (the tool call was cancelled)."""
