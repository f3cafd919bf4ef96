"""Typed reads of the JSON stored in evidence records (inputs and results are plain JSON)."""

from __future__ import annotations

from typing import Any, cast

__all__ = ["as_dict", "as_list", "str_list"]


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty dict."""
    return cast(dict[str, Any], value) if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else an empty list."""
    return cast(list[Any], value) if isinstance(value, list) else []


def str_list(value: Any) -> list[str]:
    """A JSON array as strings (ids), else an empty list."""
    return [str(v) for v in as_list(value)]
