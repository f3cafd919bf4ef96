"""What a checkpoint save holds: the keys of the object handed to the saver, each with its shape and dtype.

Read from the object passed to ``torch.save``, ``torch.distributed.checkpoint.save`` or safetensors'
``save_file``, as the call begins: mappings, lists and tuples are walked (keys joined with ``.``); a tensor
or array is a leaf with its shape and dtype (metadata: no data is read, the device is not synchronized); a
torch module or optimizer, or a DCP ``Stateful`` (``state_dict`` and ``load_state_dict``), stands for its
``state_dict()``, which is what the saver keeps of it; any other value is a leaf of kind ``value`` whose
value is not recorded (a learning rate or a flag changes nothing a checkpoint can load into), and a list of
such values is one leaf of shape ``[length]`` (an optimizer's parameter ids). The server compares two runs'
saved states key by key (`perfgate.decisions.saved_state`).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any, cast

__all__ = ["MAX_STATE_KEYS", "MAX_WALKED", "state_schema"]

MAX_WALKED = 100_000
"""Values visited in one saved object; a larger one is summarized from its first this many (``complete``
false)."""
MAX_STATE_KEYS = 1_000
"""Keys listed per saved state (in sorted order); its digest and count cover every key walked."""
_MAX_DEPTH = 32
_MAX_KEY_CHARS = 300
_MAX_DIMS = 64

Entry = tuple[str, list[int] | None, str]


def _stands_for(value: Any) -> Any:
    """The state dict a module, an optimizer or a DCP Stateful saves; None when ``value`` is none of these."""
    torch = sys.modules.get("torch")
    module = getattr(getattr(torch, "nn", None), "Module", None)
    optimizer = getattr(getattr(torch, "optim", None), "Optimizer", None)
    known = tuple(t for t in (module, optimizer) if isinstance(t, type))
    stateful = callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )
    if (known and isinstance(value, known)) or stateful:
        return value.state_dict()
    return None


def _tensor(value: Any) -> Entry | None:
    """(``''``, shape, dtype) of a tensor or array, read from its metadata; None for anything else."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or isinstance(value, type):
        return None
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        return None
    return "", dims[:_MAX_DIMS], str(dtype).removeprefix("torch.")[:40]


def _walk(obj: Any, found: list[Entry]) -> bool:
    """Append the leaves of ``obj`` to ``found``; False when `MAX_WALKED` or the depth ended the walk early."""
    stack: list[tuple[str, Any, int]] = [("", obj, 0)]
    visited = 0
    complete = True
    while stack:
        key, value, depth = stack.pop()
        visited += 1
        if visited > MAX_WALKED:
            return False
        leaf = _tensor(value)
        if leaf is not None:
            found.append((key, leaf[1], leaf[2]))
            continue
        if not isinstance(value, (Mapping, list, tuple)) and (state := _stands_for(value)) is not None:
            value = state
        prefix = f"{key}." if key else ""
        if isinstance(value, Mapping):
            items = [
                (f"{prefix}{k}"[:_MAX_KEY_CHARS], v) for k, v in cast("Mapping[Any, Any]", value).items()
            ]
        elif isinstance(value, (list, tuple)):
            seq = cast("list[Any] | tuple[Any, ...]", value)
            if all(_tensor(v) is None and not isinstance(v, (Mapping, list, tuple)) for v in seq):
                found.append((key, [len(seq)], "values"))
                continue
            items = [(f"{prefix}{i}", v) for i, v in enumerate(seq)]
        else:
            found.append((key, None, "value"))
            continue
        if depth >= _MAX_DEPTH:
            complete = False
            continue
        stack.extend((k, v, depth + 1) for k, v in reversed(items))
    return complete


def state_schema(obj: Any) -> dict[str, Any]:
    """The schema of what a saver was handed: ``digest`` (of every key walked, with its shape and dtype,
    sorted), ``keys`` (their number), ``entries`` (the first `MAX_STATE_KEYS` as ``[key, shape, dtype]``;
    shape None for a non-tensor value) and ``complete`` (False: the walk stopped at `MAX_WALKED` values)."""
    found: list[Entry] = []
    complete = _walk(obj, found)
    found.sort(key=lambda e: e[0])
    digest = hashlib.blake2b(digest_size=16)
    for key, shape, dtype in found:
        digest.update(f"{key}\t{shape}\t{dtype}\n".encode())
    return {
        "digest": digest.hexdigest(),
        "keys": len(found),
        "entries": [[k, s, d] for k, s, d in found[:MAX_STATE_KEYS]],
        "complete": complete,
    }
