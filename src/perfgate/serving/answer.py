"""The text an agent reads from a tool result: a few deciding lines, then compact JSON, under a budget.

Every tool's full result goes to ``structuredContent`` (validated against its output schema) and to the
ledger. The text content is what most agent hosts put into the model's context, and it stays there for
the rest of the session, so it is sized on purpose:

1. lead lines: a result's ``caution`` first when it has one (what must be read before any figure, e.g.
   "training may differ: ..."), then the state and evidence id, every other id or path a next call takes (experiment, detached
   run, decision log, step series), the headline figures (verdict, speedup, step time, the top
   findings, ...) and the next call, from the tool's own ``brief`` when it has one;
2. the result as compact JSON (no indentation, floats to 4 significant digits, empty fields dropped),
   shortened until the whole text fits `TEXT_BUDGET_CHARS`: long lists keep their first items and say
   how many more there are, long strings are cut. The lead lines say when that happened.

The budget is 2,000 tokens (a token is about 4 characters of JSON or English): 8,000 characters.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

from pydantic import BaseModel

__all__ = ["CHARS_PER_TOKEN", "TEXT_BUDGET_CHARS", "TEXT_BUDGET_TOKENS", "answer_text", "compact_json"]

TEXT_BUDGET_TOKENS = 2000
CHARS_PER_TOKEN = 4
TEXT_BUDGET_CHARS = TEXT_BUDGET_TOKENS * CHARS_PER_TOKEN

# Top-level fields that decide the next step, in the order they are shown when a tool has no brief.
_HEADLINE = (
    "status", "verdict", "speedup", "ci_low", "ci_high", "decision", "accepted", "metric", "utilization",
    "achieved_tflops", "median_step_ms", "throughput", "noisy", "slowest_rank", "model_flops_per_step",
    "failure_reason", "failure", "exit_code",
)  # fmt: skip
# (list length kept, string length kept) per shortening round; None keeps everything.
_ROUNDS: tuple[tuple[int | None, int | None], ...] = (
    (None, None), (20, 400), (10, 200), (5, 120), (3, 80), (2, 60), (1, 40), (0, 40),
)  # fmt: skip

Brief = Callable[[Any], list[str]]


def _round(x: float) -> float | int:
    if not math.isfinite(x) or x == 0:
        return x
    if x.is_integer() and abs(x) < 1e15:  # (a finite float equals int(x) exactly when it is integral)
        return int(x)
    return float(f"{x:.4g}")


def _plain(value: Any) -> Any:
    """``value`` as the answer's JSON shows it before any cut: floats rounded (`_round`), keys as strings,
    empty fields (None, [], {}, "") dropped from dicts; new containers all (`_cut` then cuts lists and
    strings per round)."""
    kind: type = type(value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if kind is str or kind is int or kind is bool:  # the most common values first, by exact type
        return value
    if kind is float:
        return _round(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in cast("dict[Any, Any]", value).items():
            name = k if type(k) is str else str(k)
            leaf: type = type(v)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            if leaf is float:  # numbers are never empty: no comparisons with [], {} and ""
                out[name] = _round(v)
            elif leaf is int or leaf is bool:
                out[name] = v
            elif not (v is None or v == [] or v == {} or v == ""):
                out[name] = _plain(v)
        return out
    if isinstance(value, list):
        return [_plain(v) for v in cast("list[Any]", value)]
    if isinstance(value, float):
        return _round(value)
    return value


def _no_default(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_COMPACT: Callable[[Any, int], list[str]] | None = (
    _make_encoder(
        None,
        _no_default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        False,
        False,
        True,  # pyright: ignore[reportAttributeAccessIssue]
    )
    if _make_encoder
    else None
)
"""The C core ``json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)`` builds
on every call, built once, without the circular-reference check: it encodes what `_plain` and `_cut`
return (new containers all, so no cycle)."""


def _dumps(value: Any) -> str:
    if _COMPACT is None or type(value) is not dict:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    return "".join(_COMPACT(value, 0))


def _cut(value: Any, max_list: int | None, max_str: int | None) -> Any:
    """A value `_plain` made, with each list cut to ``max_list`` items (and a note of how many more) and each
    string to ``max_str`` characters."""
    kind: type = type(value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if kind is str or isinstance(value, str):
        return value if max_str is None or len(value) <= max_str else value[: max(max_str - 3, 0)] + "..."
    if kind is dict:
        return {k: _cut(v, max_list, max_str) for k, v in cast("dict[str, Any]", value).items()}
    if kind is list:
        items = cast("list[Any]", value)
        kept = items if max_list is None else items[:max_list]
        shown = [_cut(v, max_list, max_str) for v in kept]
        if len(items) > len(kept):
            shown.append(f"...+{len(items) - len(kept)} more")
        return shown
    return value  # numbers, booleans: as rounded


def _shorten(value: Any, max_list: int | None, max_str: int | None) -> Any:
    """``value`` rounded, emptied (`_plain`) and cut to ``max_list`` items and ``max_str`` characters (`_cut`)."""
    return _cut(_plain(value), max_list, max_str)


def compact_json(value: Any, budget_chars: int) -> tuple[str, bool]:
    """``value`` as compact JSON within ``budget_chars`` when it can be; whether it was shortened.

    The floats are rounded and the empty fields dropped once (`_plain`); the rounds after the first cut
    its lists and strings ever shorter (`_cut`).
    """
    full = _plain(value)
    text = _dumps(full)
    if len(text) <= budget_chars:
        return text, False
    for max_list, max_str in _ROUNDS[1:]:
        text = _dumps(_cut(full, max_list, max_str))
        if len(text) <= budget_chars:
            return text, True
    return text[: max(budget_chars - 3, 0)] + "...", True


def _generic_lead(result: dict[str, Any]) -> list[str]:
    figures: list[str] = []
    for key in _HEADLINE:
        v = result.get(key)
        if v is None or isinstance(v, dict | list):
            continue
        figures.append(f"{key}={_shorten(v, None, 200)}")
    summary = result.get("summary")
    lines = [str(_shorten(summary, None, 400))] if isinstance(summary, str) and summary else []
    if figures:
        lines.append("; ".join(figures))
    reasons = result.get("reasons")
    if isinstance(reasons, list) and reasons:
        lines.extend(f"reason: {r}" for r in _shorten(reasons, 3, 300))  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return lines


_HANDLE = re.compile(r"(_id|_path|_md)$")
"""Top-level fields naming what a next call takes (an experiment, a detached run, a file to read); an
artifact's name inside the record's folder is no argument of any tool."""


def _handles(result: dict[str, Any], lead: str) -> list[str]:
    """``name=value`` of each id or path the lead lines do not already give (the evidence id is in the
    head)."""
    return [
        f"{key}={value}"
        for key, value in result.items()
        if key != "evidence_id"
        and _HANDLE.search(key)
        and isinstance(value, str)
        and value
        and value not in lead
    ]


def answer_text(
    tool: str, output: BaseModel, brief: Brief | None = None, *, result: dict[str, Any] | None = None
) -> str:
    """The text content for ``output`` (see the module docstring); ``result``, when given, is
    ``output.model_dump(mode="json")`` already made."""
    if result is None:
        result = output.model_dump(mode="json")
    head = f"{tool}: {result.get('state', 'done')}"
    if result.get("evidence_id"):
        head += f", evidence {result['evidence_id']}"
    lead = [head, *(brief(output) if brief is not None else _generic_lead(result))]
    caution = result.get("caution")
    if isinstance(caution, str) and caution:  # what must be read before any figure: the first line
        lead.insert(0, caution)
    handles = _handles(result, "\n".join(lead))
    if handles:
        lead.insert(lead.index(head) + 1, "for the next call: " + "; ".join(handles))
    warnings: Sequence[Any] = result.get("warnings") or []
    if warnings:
        lead.append(f"warnings ({len(warnings)}): " + " | ".join(str(w)[:200] for w in warnings[:2]))
    lead_text = "\n".join(lead)
    room = TEXT_BUDGET_CHARS - len(lead_text) - 120
    body, shortened = compact_json(result, max(room, 400))
    note = (
        "result (shortened: lists cut to their first items; the full result is in structuredContent and "
        "the ledger):"
        if shortened
        else "result:"
    )
    return f"{lead_text}\n{note}\n{body}"
