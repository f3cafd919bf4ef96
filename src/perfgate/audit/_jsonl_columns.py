"""Columns of a block of uniform JSONL records, decoded with numpy instead of one object per record.

Record writers (the harness's ``SampleLog``, ``json.dumps`` loops) write every line of a file with
the same keys in the same order and only the integers changing. Such a block is decoded here as
bytes: the first line, read by msgspec, is the template; every line must equal it once each run of
number characters is replaced by one placeholder byte (its "skeleton"), and then the numbers are
read column by column with a few vector operations over the block.

Anything else (another key order, a string id, a bad number, a blank line, a line that msgspec would
refuse) makes ``uniform_columns`` return None and the caller decodes the block with msgspec, which
gives the same columns more slowly and reports bad lines by number. So this path can only be
faster, never different: it declines whenever it could disagree.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

__all__ = ["ABSENT", "Columns", "uniform_columns"]

ABSENT = -(2**63)
"""Stands for an optional field the line leaves out (or writes as null)."""

_MAX_DIGITS = 19
"""Digits of the longest number read here (int64 holds 18 in full, 19 up to 9223372036854775807);
a longer one in a record field sends the block to msgspec, which reports it as too large."""

_PLACEHOLDER = 0xFF
"""Stands for a number in a skeleton; the byte never occurs in UTF-8 text, so not in a template."""

_MINUS, _ZERO, _NEWLINE = ord("-"), ord("0"), ord("\n")
_NUMBER_RUN = re.compile(rb"[-0-9]+")
_POW10: NDArray[np.uint64] = np.array([10**k for k in range(_MAX_DIGITS)], dtype=np.uint64)
_INT64_MAX, _INT64_MIN_MAGNITUDE = np.uint64(2**63 - 1), np.uint64(2**63)

_INT_FIELDS = ("sample_id", "epoch", "rank", "worker", "step", "session", "pass")
_REQUIRED = ("sample_id", "epoch", "rank", "worker")


@dataclass(frozen=True)
class Columns:
    """One block's records as columns; optional columns hold ABSENT where a record lacks the field, and
    are None when no record of the block has it."""

    sample_id: NDArray[np.int64]
    epoch: NDArray[np.int64]
    rank: NDArray[np.int64]
    worker: NDArray[np.int64]
    step: NDArray[np.int64] | None
    session: NDArray[np.int64] | None
    restart: NDArray[np.bool_] | None
    pass_index: NDArray[np.int64] | None


@dataclass(frozen=True)
class _Template:
    skeleton: NDArray[np.uint8]  # the first line (with its newline), each number one placeholder byte
    runs: int  # numbers per line
    where: dict[str, int]  # record field -> index of its number in the line
    restart: bool  # the template writes "restart": true


def uniform_columns(block: bytes, n_lines: int, schema: msgspec.json.Decoder[Any]) -> Columns | None:
    """The records of `block` (`n_lines` whole lines, each ending in a newline) as columns, or None
    when the lines are not all one template with integer values (then decode them with msgspec).

    `schema` decodes one record line the way the caller's msgspec path does; a first line it refuses
    is no template."""
    template = _template(block, schema)
    if template is None:
        return None
    data: NDArray[np.uint8] = np.frombuffer(block, dtype=np.uint8)
    minus = data == _MINUS
    number = data - np.uint8(_ZERO) < 10  # uint8 wraps below '0': one compare finds the digits
    number |= minus
    first = np.empty_like(number)  # a number's first byte
    first[0] = number[0]
    np.greater(number[1:], number[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    if starts.shape[0] != n_lines * template.runs:
        return None
    # the skeleton: number runs collapse to one placeholder, everything else stays
    keep = np.less_equal(number, first)  # not a number, or a number's first byte
    marked = np.copy(data)
    marked[starts] = _PLACEHOLDER
    skeleton = np.compress(keep, marked)
    del marked, keep
    width = template.skeleton.shape[0]
    if skeleton.shape[0] != n_lines * width:
        return None
    if not np.array_equal(
        np.reshape(skeleton, (n_lines, width)), np.broadcast_to(template.skeleton, (n_lines, width))
    ):
        return None
    # Each line now equals the template: its own placeholders sit where the template's are, and a
    # line holds at most as many numbers as placeholders; with n_lines * runs numbers in all, line i
    # holds numbers i*runs .. i*runs + runs - 1, in the template's order.
    del skeleton
    stops = np.flatnonzero(np.greater(number[:-1], number[1:])) + 1  # one past each number's last byte
    negative = minus[starts]
    if int(np.count_nonzero(minus)) != int(np.count_nonzero(negative)):
        return None  # a minus inside a number ("1-2", "--1") is no JSON number
    digits_at = starts + negative
    sizes = stops - digits_at
    if sizes.shape[0] and int(sizes.min()) < 1:
        return None  # a lone minus
    if bool(np.any((data[digits_at] == _ZERO) & (sizes > 1))):
        return None  # a leading zero: JSON has none, msgspec refuses the line
    shape = (n_lines, template.runs)
    stops2, sizes2, negative2 = (
        np.reshape(stops, shape),
        np.reshape(sizes, shape),
        np.reshape(negative, shape),
    )
    columns: dict[str, NDArray[np.int64]] = {}
    for name, k in template.where.items():
        value = _integers(data, stops2[:, k], sizes2[:, k], negative2[:, k])
        if value is None:
            return None
        columns[name] = value
    # an optional field left out of the template, or null in it, is absent from every line
    return Columns(
        sample_id=columns["sample_id"],
        epoch=columns["epoch"],
        rank=columns["rank"],
        worker=columns["worker"],
        step=columns.get("step"),
        session=columns.get("session"),
        restart=np.ones(n_lines, dtype=np.bool_) if template.restart else None,
        pass_index=columns.get("pass"),
    )


def _integers(
    data: NDArray[np.uint8], stops: NDArray[np.intp], sizes: NDArray[np.intp], negative: NDArray[np.bool_]
) -> NDArray[np.int64] | None:
    """The numbers that end before `stops` with `sizes` digits, or None when one exceeds int64."""
    longest = int(sizes.max()) if sizes.shape[0] else 0
    if longest > _MAX_DIGITS:
        return None
    value = np.zeros(stops.shape[0], dtype=np.uint64)  # 19 digits fit below 2**64
    digit = np.empty_like(value)
    for k in range(longest):  # the k-th digit from the right of every number at once
        np.subtract(data[stops - (k + 1)], _ZERO, out=digit, dtype=np.uint64)
        if k:
            digit[sizes <= k] = 0  # shorter numbers have no k-th digit
        np.multiply(digit, _POW10[k], out=digit)
        np.add(value, digit, out=value)
    if longest == _MAX_DIGITS:
        limit = np.where(negative, _INT64_MIN_MAGNITUDE, _INT64_MAX)
        if bool(np.any(value > limit)):
            return None  # beyond int64: msgspec's path says so
    np.negative(value, out=value, where=negative)  # wraps to the two's complement of -value
    return value.view(np.int64)  # pyright: ignore[reportUnknownMemberType]  # numpy's view overloads


def _template(block: bytes, schema: msgspec.json.Decoder[Any]) -> _Template | None:
    """The block's first line as a template, when it is a flat record that msgspec reads, holds only
    integers, true, false and null, and is written the way an encoder writes it (compact, or with
    ``json.dumps``'s default separators) so that each number is exactly one run of number bytes."""
    end = block.find(b"\n")
    line = block[:end]
    text = line[:-1] if line.endswith(b"\r") else line
    if not text or b"\xff" in text:
        return None
    try:
        record = msgspec.json.decode(text, type=dict[str, object])
    except (msgspec.DecodeError, RecursionError):  # ValidationError too: not an object
        return None
    if text != msgspec.json.encode(record) and text != json.dumps(record).encode():
        return None
    ints = [name for name, value in record.items() if type(value) is int]
    if not all(value is None or type(value) in (int, bool) for value in record.values()):
        return None
    if len(_NUMBER_RUN.findall(text)) != len(ints):
        return None  # a key holds digits or a minus: the runs would not be the values
    try:
        schema.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    where = {name: k for k, name in enumerate(ints) if name in _INT_FIELDS}
    if any(name not in where for name in _REQUIRED):
        return None
    skeleton = bytearray()
    last = 0
    for run in _NUMBER_RUN.finditer(line):
        skeleton += line[last : run.start()]
        skeleton.append(_PLACEHOLDER)
        last = run.end()
    skeleton += line[last:] + b"\n"
    return _Template(
        skeleton=np.frombuffer(bytes(skeleton), dtype=np.uint8),
        runs=len(ints),
        where=where,
        restart=record.get("restart") is True,
    )
