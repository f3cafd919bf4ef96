"""Generated JSON Schemas of every tool (checked in; `perfgate schemas --check` fails on drift).

Files: ``<tool>.input.json``, ``<tool>.output.json``, ``tools_list.json`` (the exact ``tools/list``
answer of a default server: names, order, descriptions, schemas, annotations) and ``tools_index.json``
(each tool's module, and whether it runs commands or writes), from which a server lists its tools
without importing them (`perfgate.serving.catalog`). `perfgate.generated` writes and checks them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SCHEMA_DIR"]

SCHEMA_DIR = Path(__file__).resolve().parent
