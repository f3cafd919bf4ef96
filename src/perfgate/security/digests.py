"""Content digests that bind a tensor file to the run that dumped it, recorded with their algorithm's name.

A digest is written as ``"<algorithm>:<64 hex digits>"``, e.g. ``"blake3:9f86..."``. New digests use
BLAKE3 (collision-resistant like sha256, about twice its speed on one core); records written before
digests were named hold a bare sha256 under a ``sha256`` field, which reads as ``sha256:<hex>``.

Two digests agree only when both name the same known algorithm and the same hex: a digest under one
algorithm is never compared with one under another, and an unknown or malformed algorithm agrees with
nothing (`parse` returns None for it).

Imported by the harness inside the user's training process: stdlib and ``blake3`` only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol

__all__ = [
    "ALGORITHM",
    "DIGEST_PATTERN",
    "KNOWN_ALGORITHMS",
    "Algorithm",
    "Hasher",
    "entry_digest",
    "format_digest",
    "new_hasher",
    "parse",
]

Algorithm = Literal["blake3", "sha256"]
ALGORITHM: Algorithm = "blake3"
"""What perfgate hashes tensor files with now."""
KNOWN_ALGORITHMS: tuple[Algorithm, ...] = ("blake3", "sha256")
"""Algorithms a recorded digest may name; sha256 only for records written before BLAKE3."""

_HEX = re.compile(r"[0-9a-f]{64}")
DIGEST_PATTERN = r"^(blake3|sha256):[0-9a-f]{64}$"
"""A JSON-schema / msgspec pattern for a recorded digest."""


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def hexdigest(self) -> str: ...


def new_hasher(algorithm: Algorithm = ALGORITHM, *, threads: bool = False) -> Hasher:
    """A fresh hasher; ``threads``: BLAKE3 may split large updates over the CPUs (worth it above ~8 MiB
    per update). Both release the GIL while hashing large buffers."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3(max_threads=blake3.AUTO) if threads else blake3()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")  # pyright: ignore[reportUnreachable]


def format_digest(algorithm: Algorithm, hexdigest: str) -> str:
    """``"<algorithm>:<hex>"``."""
    return f"{algorithm}:{hexdigest}"


def parse(value: object) -> tuple[Algorithm, str] | None:
    """(algorithm, hex) of a ``"<algorithm>:<hex>"`` digest; None for anything else (an unknown
    algorithm, a bare hex string, wrong length or case): such a digest binds nothing."""
    if not isinstance(value, str):
        return None
    algorithm, sep, hexdigest = value.partition(":")
    if not sep or algorithm not in KNOWN_ALGORITHMS or not _HEX.fullmatch(hexdigest):
        return None
    return algorithm, hexdigest  # pyright: ignore[reportReturnType]  # checked against KNOWN_ALGORITHMS


def entry_digest(entry: Mapping[str, Any]) -> tuple[Algorithm, str] | None:
    """The digest a recorded file entry names: its ``digest`` field, or for a record written before digests
    were named (no ``digest`` field), its bare ``sha256``. An entry with a ``digest`` field is judged by
    that field alone, so a legacy ``sha256`` next to it cannot stand in for a digest that does not parse."""
    if "digest" in entry:
        return parse(entry.get("digest"))
    legacy = entry.get("sha256")
    if isinstance(legacy, str) and _HEX.fullmatch(legacy):
        return "sha256", legacy
    return None
