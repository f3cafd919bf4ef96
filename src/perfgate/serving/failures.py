"""Words for what went wrong in a call: argument errors one line per field, crashes as a sentence.

The SDK reports argument errors as pydantic's raw text (with a documentation URL) and any other
exception as a bare "Error executing tool X". `argument_message` and `crash_message` replace both with
text an agent can act on; `PerfgateTool` (in `perfgate.serving.adapter`) applies them to every registered tool.
"""

from __future__ import annotations

import errno
import gzip
import lzma
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from perfgate.helpers.safeopen import UnsafeFileError

__all__ = ["argument_message", "crash_message", "field_errors"]

_SHOWN_INPUT_CHARS = 60


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved = root.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if isinstance(resolved, Mapping):
            return _resolve(resolved, root)  # pyright: ignore[reportUnknownArgumentType]
    return node


def _branches(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A schema node and, for unions, each of its alternatives (resolved)."""
    node = _resolve(node, root)
    out = [node]
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key, ()):
            out.extend(_branches(sub, root))
    return out


def _walk(loc: Sequence[int | str], schema: Mapping[str, Any]) -> tuple[str, list[Mapping[str, Any]]]:
    """The field path an agent reads (``buckets[0].step_time_s``) and the schema nodes found there.

    Location parts that name no property or index (pydantic's union-member tags such as ``str`` or
    ``function-after[...]``) are dropped.
    """
    path = ""
    nodes: list[Mapping[str, Any]] = [schema]
    for part in loc:
        step: list[Mapping[str, Any]] = []
        for node in nodes:
            for branch in _branches(node, schema):
                if isinstance(part, int) and "items" in branch:
                    step.append(branch["items"])
                elif isinstance(part, str) and part in branch.get("properties", {}):
                    step.append(branch["properties"][part])
                elif isinstance(part, str) and isinstance(branch.get("additionalProperties"), Mapping):
                    step.append(branch["additionalProperties"])
        if not step:
            continue  # a union tag, not a field
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
        nodes = step
    return path, nodes


def _allowed_fields(nodes: list[Mapping[str, Any]], schema: Mapping[str, Any]) -> list[str]:
    return sorted(
        {name for node in nodes for b in _branches(node, schema) for name in b.get("properties", {})}
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_INPUT_CHARS else text[: _SHOWN_INPUT_CHARS - 3] + "..."


def _phrase(err: ErrorDetails) -> str:
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg.removeprefix(prefix)
    if err["type"] == "missing":
        return "required, but missing"
    msg = msg.replace("Input should be", "must be").replace("Input should have", "must have")
    return msg[0].lower() + msg[1:] if msg else msg


_DESCRIBED_CHARS = 400


def _described(nodes: list[Mapping[str, Any]], schema: Mapping[str, Any]) -> str:
    """The documentation of the field at ``nodes`` (its own, else its type's), on one line."""
    for node in nodes:
        for candidate in (node, *_branches(node, schema)):
            text = candidate.get("description")
            if isinstance(text, str) and text.strip():
                line = " ".join(text.split())
                return line if len(line) <= _DESCRIBED_CHARS else line[: _DESCRIBED_CHARS - 3] + "..."
    return ""


def field_errors(exc: ValidationError, schema: Mapping[str, Any]) -> list[str]:
    """One line per field: the path, what is wrong in words, allowed values or fields, what was sent, and
    the field's documentation from ``schema`` (tools/list carries none)."""
    grouped: dict[str, list[str]] = {}
    got: dict[str, Any] = {}
    about: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        if err["type"] == "extra_forbidden" and err["loc"]:
            # The unknown key names no property: report it under its holder, with the holder's fields.
            holder, nodes = _walk(err["loc"][:-1], schema)
            key = str(err["loc"][-1])
            allowed = _allowed_fields(nodes, schema)
            phrase = "unknown field" + (f"; allowed here: {', '.join(allowed)}" if allowed else "")
            grouped.setdefault(f"{holder}.{key}" if holder else key, []).append(phrase)
            continue
        path, nodes = _walk(err["loc"], schema)
        where = path or "input"
        if path and where not in about:
            about[where] = _described(nodes, schema)
        phrase = _phrase(err)
        if phrase not in grouped.setdefault(where, []):
            grouped[where].append(phrase)
        if err["type"] != "missing" and where != "input":
            got.setdefault(where, err["input"])
    lines: list[str] = []
    for where, phrases in grouped.items():
        line = f"{where}: {' or '.join(phrases)}"
        if where in got:
            line += f" (got {_shown(got[where])})"
        if about.get(where):
            line += f". {where.rsplit('.', 1)[-1]}: {about[where]}"
        lines.append(line)
    return lines


def argument_message(tool: str, lines: Iterable[str]) -> str:
    """The argument error an agent reads: what is wrong per field, then what to do (and, for a shipped
    tool, where every field of it is documented)."""
    from perfgate.skills.catalog import tool_reference

    body = list(lines)
    head = f"{tool}: {len(body)} invalid argument{'s' if len(body) != 1 else ''}"
    ref = tool_reference(tool)
    fields = f" (every field: {ref.uri})" if ref is not None else ""
    return "\n".join([head, *(f"- {line}" for line in body), f"Fix these and call {tool} again{fields}."])


_ERRNO_ADVICE = {
    errno.ENAMETOOLONG: "a path or one of its names is too long for the file system; use a shorter path",
    errno.ELOOP: "too many symbolic links (or a link where none is allowed); pass the real file",
    errno.EACCES: "permission denied; make the file readable by the server's user",
    errno.EPERM: "operation not permitted; make the file readable by the server's user",
    errno.ENOSPC: "the disk is full; free space in the workspace and retry",
    errno.EMFILE: "the server has too many open files; retry after other calls finish",
    errno.EISDIR: "a directory was given where a file is needed; pass a file",
    errno.ENOTDIR: "a file was given where a directory is needed; pass a directory",
    errno.ENOENT: "a file vanished while it was read; make sure nothing deletes or renames it during the call",
    errno.EIO: "the storage reported an I/O error; check the disk",
}


def crash_message(tool: str, exc: BaseException) -> str:
    """A sentence for an exception no reader anticipated, by class: what happened and what to do."""
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    if isinstance(exc, RecursionError):
        what = (
            "the input is nested too deeply to read (Python's recursion limit); check the file is not "
            "corrupt, or flatten its structure"
        )
    elif isinstance(exc, MemoryError):
        what = "the server ran out of memory on this input; pass a smaller file or a subset of it"
    elif isinstance(exc, OverflowError):
        what = f"a number in the input is too large to handle ({detail}); check the file is not corrupt"
    elif isinstance(exc, (zlib.error, gzip.BadGzipFile, EOFError, lzma.LZMAError, zipfile.BadZipFile)):
        what = f"compressed input is corrupt or truncated ({detail}); re-create the file and retry"
    elif isinstance(exc, UnicodeError):
        what = f"the input is not valid text ({detail}); pass UTF-8 text"
    elif isinstance(exc, UnsafeFileError):
        what = exc.strerror or detail
    elif isinstance(exc, OSError):
        advice = _ERRNO_ADVICE.get(exc.errno or -1, f"the operating system refused: {exc.strerror or detail}")
        name = f" ({_shown(str(exc.filename))})" if exc.filename else ""
        what = f"{advice}{name}"
    else:
        suffix = f": {detail}" if detail else ""
        what = (
            f"an unexpected {type(exc).__name__}{suffix}. This is a perfgate bug: the server log has the "
            "traceback; report it with the arguments of this call"
        )
    return f"{tool} failed: {what}."
