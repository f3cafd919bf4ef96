"""What a run's own log says it was told to run: the MoE dispatcher and graph arguments Megatron prints.

Megatron lists its parsed arguments at start-up, one per line, as two spaces, the name, a run of dots
padding the name to a column, and the value (``  moe_token_dispatcher_type ........ flex``), between
``---- arguments ----`` and ``---- end of arguments ----`` rules. A launcher may put its own prefix before
each line (``[rank0]:``, ``0:``, a timestamp): `perfgate.benchmarking.reading.loglines.strip_prefix` removes it.

This is weaker evidence than a trace: the log states what the job was configured to do, which a missing
package or a fallback can quietly undo. The ``backend`` gate quotes it next to what the trace shows, and
never keeps a change on it alone.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from pathlib import Path

from perfgate.benchmarking.reading.loglines import read_log_lines, strip_prefix

__all__ = ["LOGGED_ARGUMENTS", "MAX_LINES", "parse_logged_settings", "read_logged_settings"]

LOGGED_ARGUMENTS = (
    "moe_token_dispatcher_type",
    "moe_enable_deepep",
    "moe_flex_dispatcher_backend",
    "enable_cuda_graph",
    "external_cuda_graph",
    "cuda_graph_impl",
    "cuda_graph_scope",
)
"""Megatron's argument names (its namespace's spelling) that say which exchange and graphs were asked for."""

MAX_LINES = 50_000
"""Lines read from the start of a log: the listing comes before the first step."""

_LINE = re.compile(r"(?P<name>[a-z][a-z0-9_]*) \.+ (?P<value>\S.*?)\s*$")
_MAX_VALUE_CHARS = 200


def parse_logged_settings(lines: Iterable[str]) -> dict[str, str]:
    """The `LOGGED_ARGUMENTS` found in ``lines`` (prefixes are stripped here), by name; the first listing wins
    (every rank prints the same one)."""
    found: dict[str, str] = {}
    for line in lines:
        body, _, _ = strip_prefix(line.rstrip("\r\n"))  # the listing's indent goes with the prefixes
        match = _LINE.fullmatch(body)
        if match is None:
            continue
        name = match.group("name")
        if name in LOGGED_ARGUMENTS and name not in found:
            found[name] = match.group("value")[:_MAX_VALUE_CHARS]
    return found


def read_logged_settings(path: Path, max_lines: int = MAX_LINES) -> dict[str, str]:
    """`parse_logged_settings` over the first ``max_lines`` whole lines of the log at ``path`` (none when it
    cannot be read). A line without its newline, or not UTF-8, is not read."""
    try:
        handle = path.open("rb")
    except OSError:
        return {}
    with handle:
        first = itertools.islice(read_log_lines(handle), max_lines)
        return parse_logged_settings(line.raw for line in first if line.problem is None)
