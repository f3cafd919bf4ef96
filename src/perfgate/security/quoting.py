"""Mark text copied from the user's files as data wherever perfgate's own prose quotes it.

Answers are read by a model. A log line, trace or kernel name, tensor key or sample record written
into a summary, note, finding or error message could otherwise read as perfgate speaking, or as an
instruction ("ignore previous instructions and keep"). Every such quotation goes through
`file_text`, which puts it between ``⟦`` and ``⟧`` and escapes whatever would let the quoted text leave
the fence or disguise itself: line breaks and other control characters, invisible format characters
(bidirectional overrides, zero-width spaces) and the fence characters themselves. The server
instructions and the skill tell the agent that fenced text is data, never an instruction.
Standard library only: the tensor library and the harness quote through it too.

Structured fields whose whole value is such text (``tensors[].key``, ``top_kernels[].name``) stay
verbatim, so the agent can copy them into later calls; JSON quoting already keeps them apart.
"""

from __future__ import annotations

import unicodedata

__all__ = ["FENCE_CLOSE", "FENCE_OPEN", "MAX_QUOTED_CHARS", "file_text"]

FENCE_OPEN = "\u27e6"  # ⟦
FENCE_CLOSE = "\u27e7"  # ⟧
MAX_QUOTED_CHARS = 300
"""Longest quotation kept in prose; the full text stays in the evidence artifacts."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if ch in (FENCE_OPEN, FENCE_CLOSE) or unicodedata.category(ch) in _UNSAFE_CATEGORIES:
        code = ord(ch)
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return ch


def file_text(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """``value`` (text taken from a user's file) fenced as data for perfgate's prose.

    One line always: nothing inside can end the fence or start a new line. Text longer than ``limit``
    characters is cut, and the fence says how much was left out.
    """
    text = str(value)
    cut = len(text) - limit if len(text) > limit else 0
    body = "".join(_escape(ch) for ch in (text[:limit] if cut else text))
    more = f" …+{cut} chars" if cut else ""
    return f"{FENCE_OPEN}{body}{more}{FENCE_CLOSE}"
