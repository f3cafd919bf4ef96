"""Errors of the trace reader and analyses.

Every message says what is wrong with which file and what to do next, so the tool layer can pass it
to the agent verbatim as a ``ToolError``.
"""

from __future__ import annotations

__all__ = ["TraceError", "TraceFormatError", "TraceTooLargeError"]


class TraceError(Exception):
    """A trace could not be read or analyzed; the message is meant for the user."""


class TraceFormatError(TraceError):
    """The file is not a readable Kineto/Chrome trace (bad gzip, invalid or truncated JSON)."""


class TraceTooLargeError(TraceError):
    """A single JSON value in the trace exceeds the configured size limit."""
