"""Regular expressions written by the agent, run in linear time.

Python's ``re`` backtracks: a pattern such as ``(a+)+$`` takes seconds at 26 characters and doubles with
each one more, and a tool that runs it freezes the server. Patterns that come from tool arguments are
compiled with RE2 (google-re2) instead, whose matching time is linear in the text. RE2 has no
backreferences and no lookaround; such a pattern is refused with a sentence that says so. Everything
else in the familiar syntax (named groups ``(?P<name>...)``, classes, counted repetition up to 1000)
works.

Use `compile_user_regex` for any pattern an agent supplies (log patterns, log import, filters);
never ``re.compile`` on it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

import re2 as _re2_untyped

_re2: Any = _re2_untyped  # google-re2 ships no type information
_RE2_ERROR: type[Exception] = _re2.error

__all__ = ["MAX_LINE_CHARS", "MAX_PATTERN_CHARS", "LinearPattern", "UserRegexError", "compile_user_regex"]

MAX_PATTERN_CHARS = 2000
"""Longest pattern accepted; a longer one is refused before it is compiled."""
MAX_PROGRAM_BYTES = 8 << 20
"""Memory RE2 may use for one compiled pattern (its own default); bigger programs are refused."""
MAX_LINE_CHARS = 64 << 10
"""Text searched per line: a longer line is searched in its first MAX_LINE_CHARS characters only."""


class UserRegexError(ValueError):
    """The pattern cannot be used; the message says why and what to write instead."""


@dataclass(frozen=True)
class LinearPattern:
    """A compiled agent-supplied pattern: `search` runs in time linear in the text."""

    pattern: str
    _compiled: Any

    @property
    def group_names(self) -> frozenset[str]:
        return frozenset(cast("dict[str, int]", self._compiled.groupindex))

    def search(self, text: str) -> dict[str, str | None] | None:
        """The named groups of the first match in ``text[:MAX_LINE_CHARS]``, or None without a match."""
        m = self._compiled.search(text[:MAX_LINE_CHARS])
        return None if m is None else cast("dict[str, str | None]", m.groupdict())


def _options() -> Any:
    options: Any = _re2.Options()
    options.max_mem = MAX_PROGRAM_BYTES
    options.log_errors = False  # the error reaches the caller as an exception; nothing on stderr
    return options


def compile_user_regex(pattern: str, *, field: str, required_groups: Collection[str] = ()) -> LinearPattern:
    """Compile ``pattern`` (named ``field`` in messages) for linear-time search.

    Raises:
        UserRegexError: too long, not valid RE2 syntax (backreferences and lookaround are not), or
            lacking one of ``required_groups``.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UserRegexError(
            f"{field} is {len(pattern)} characters; the limit is {MAX_PATTERN_CHARS} "
            "(benchmarking.reading.userregex.MAX_PATTERN_CHARS): match less of the line"
        )
    try:
        compiled: Any = _re2.compile(pattern, _options())
    except _RE2_ERROR as exc:
        first: object = exc.args[0] if exc.args else ""
        reason = first.decode(errors="replace") if isinstance(first, bytes) else str(first)
        hint = ""
        if "(?=" in pattern or "(?!" in pattern or "(?<" in pattern.replace("(?P<", ""):
            hint = " Lookaround is not supported: match the surrounding text instead."
        elif "invalid escape" in reason and any(f"\\{d}" in pattern for d in "123456789"):
            hint = " Backreferences (\\1) are not supported: patterns run in linear time (RE2 syntax)."
        elif "pattern too large" in reason:
            hint = " Use fewer or smaller counted repetitions."
        raise UserRegexError(f"{field} is not a usable regular expression: {reason}.{hint}") from None
    out = LinearPattern(pattern, compiled)
    missing = sorted(set(required_groups) - out.group_names)
    if missing:
        raise UserRegexError(f"{field} lacks the named group(s) {missing}")
    return out
