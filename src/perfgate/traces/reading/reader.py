"""Streaming reader for Kineto / Chrome trace files (``.json`` or gzip-compressed ``.json.gz``).

The file is never held whole, nor turned into Python dicts: the decompressed bytes are read in blocks,
the top-level object is split into its small keys (decoded as a `Header`) and the ``traceEvents``
array, and the array is cut into runs of complete events that msgspec decodes into `Event` Structs.

Cutting works without a character-level scanner in Python: a candidate cut is a ``}`` followed by
``,`` or ``]``; the run up to it is decoded as a JSON array. A candidate inside a string or a nested
value leaves the run unbalanced, so the decode fails and an earlier candidate is tried. A run that
decodes is therefore a sequence of whole top-level elements, and memory stays bounded by the block
size plus the largest single event. Candidates where an event ends as traces write them (``}`` then
``]``, or ``,`` then ``{``) are tried first: a failed decode runs through the whole run, and C++ kernel
names hold ``}, `` often.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, Protocol, cast

import msgspec

from perfgate.helpers.deadline import checkpoint
from perfgate.helpers.safeopen import open_file
from perfgate.traces.errors import TraceFormatError, TraceTooLargeError
from perfgate.traces.reading._events import ANY_EVENT, OTHER_EVENT, Complete, Event, Header

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_READ_BLOCK",
    "NEW_PART",
    "Decompressor",
    "TraceStream",
    "isal_available",
]

DEFAULT_CHUNK_BYTES = 1 << 20
"""Bytes of JSON decoded per batch: large enough to amortize calls (4 MiB batches cost as many
instructions within 0.4%), small enough to stay cache- and RAM-friendly, and fine enough for two
processes reading parts of one file to end together (`perfgate.traces.pool`: the parts meet between
batches)."""
DEFAULT_MAX_VALUE_BYTES = 64 << 20
"""Largest single event (or header) accepted; real Kineto events are far below 1 MiB."""
DEFAULT_READ_BLOCK = 1 << 20
"""Decompressed bytes read from the file at a time (the buffer grows by these)."""
_MAX_ATTEMPTS = 8

Decompressor = Literal["auto", "isal", "zlib"]

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_AFTER_CLOSE = re.compile(rb"\s*([,\]])")
# After a ``}``: the separator that can end an event as traces write them (``]``, or ``,`` before ``{`` or
# the buffer's end), in group 1 like `_AFTER_CLOSE`.
_ENDS_EVENT = re.compile(rb"\s*(\]|,(?=\s*(?:\{|\Z)))")
_BYTE_POS = re.compile(r"\(byte (\d+)\)")
_WS = b" \t\r\n"

NEW_PART: list[Any] = []
"""Yielded (as the batch, by identity) by a stream that skips on after ``stop_at`` (``resume``): the
batches after it belong to a later part of the file, with another process's part between the two."""

_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_COMPLETE_DECODER: msgspec.json.Decoder[list[Any]] = msgspec.json.Decoder(cast("Any", list)[ANY_EVENT])
"""Decodes a run as `Complete` events and empty Structs for the rest (see `TraceStream.complete_batches`)."""
_HEADER_DECODER = msgspec.json.Decoder(Header)
_ANY_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


def isal_available() -> bool:
    """Whether python-isal (a faster gunzip, optional) can be imported."""
    try:
        from isal import igzip  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        return False
    return True


def _gzip_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    try:
        from isal import isal_zlib
    except ImportError:
        return tuple(errors)
    # The stub declares ``error`` as an instance; at run time it is the exception class.
    errors.append(cast("type[BaseException]", isal_zlib.error))
    return tuple(errors)


class _Owned:
    """A decompressing stream that also closes the file it was given (gzip leaves a given file open)."""

    def __init__(self, stream: _Readable, raw: io.BufferedReader) -> None:
        self._stream, self._raw = stream, raw

    def read(self, size: int = -1, /) -> bytes:
        return self._stream.read(size)

    def close(self) -> None:
        self._stream.close()
        self._raw.close()


def _open(path: Path, decompressor: Decompressor) -> tuple[_Readable, bool, tuple[int, ...]]:
    # Opened once, following no symbolic link (`perfgate.helpers.safeopen`): what is read is what was confined.
    raw = open_file(path)
    try:
        st = os.fstat(raw.fileno())
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        magic = raw.peek(2)[:2]
        if magic != b"\x1f\x8b":
            return raw, False, identity
        if decompressor != "zlib" and isal_available():
            from isal import igzip

            return _Owned(igzip.IGzipFile(fileobj=raw, mode="rb"), raw), True, identity
        if decompressor == "isal":
            raise TraceFormatError("decompressor='isal' was requested but python-isal is not installed")
        return _Owned(gzip.GzipFile(fileobj=raw, mode="rb"), raw), True, identity
    except BaseException:
        raw.close()
        raise


@dataclass
class TraceStream:
    """Iterate the events of one trace file in decoded batches.

    After `batches` is exhausted, `header` holds the top-level keys (some writers put them after
    the events), `decoded_bytes` the JSON size and `lenient_skipped` the events dropped because a
    field had an unusable type.

    A stream can read one part of the events array (`perfgate.traces.pool` reads the two halves of a
    large trace in two processes). With ``stop_at`` (an offset in the decompressed JSON) the stream
    ends before the first batch that starts at or after it (``stopped`` is then True, and neither the
    rest of the file nor the keys after the array are read). With ``skip_before`` the batches that
    start before it are neither decoded nor validated: each is cut where one reader would most likely
    cut it (the last ``}`` followed by ``,`` and ``{``), without decoding. ``meet`` records the state
    where each part begins or ends: (offset of the first batch, offset of the buffer's end, whether the
    file was read to its end). When the two streams' ``meet`` are equal, the skipping stream's guesses
    led it exactly where the whole reading stands at that batch, so the batches it reads from there
    are the ones a single stream reads; when they differ (a guess fell inside a string or a nested
    value), its part must not be used.

    Parts can also end and begin where another process decides while both read: ``halt(at)`` is asked
    before each batch a skipping stream would decode (``at``: its offset); True stops the stream there
    as ``stop_at`` would, recording ``halt_meet``. ``resume(at)``, asked where a stream reaches
    ``stop_at``, may instead return an offset: the stream then yields `NEW_PART`, skips on to that offset
    as with ``skip_before`` (recording ``resume_meet`` at its first batch there) and reads to the end.

    Raises (from `batches`):
        TraceFormatError: bad gzip data, invalid or truncated JSON, no ``traceEvents`` array.
        TraceTooLargeError: one event (or the header) is larger than ``max_value_bytes``.
        OSError: the file cannot be opened.
    """

    path: Path
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    decompressor: Decompressor = "auto"
    read_block: int = DEFAULT_READ_BLOCK
    header: Header = field(default_factory=Header)
    decoded_bytes: int = 0
    lenient_skipped: int = 0
    compressed: bool = False
    skip_before: int = 0
    stop_at: int | None = None
    stopped: bool = False
    meet: tuple[int, int, bool] | None = None
    identity: tuple[int, ...] = ()
    """The file read: (device, inode, size, modification time in ns) when it was opened."""
    halt: Callable[[int], bool] | None = field(default=None, repr=False)
    halt_meet: tuple[int, int, bool] | None = None
    resume: Callable[[int], int | None] | None = field(default=None, repr=False)
    resume_meet: tuple[int, int, bool] | None = None
    _buf: bytearray = field(default_factory=bytearray, repr=False)
    _base: int = 0
    _eof: bool = False
    _file: _Readable | None = field(default=None, repr=False)
    _complete_only: bool = field(default=False, repr=False)

    def batches(self) -> Iterator[list[Event]]:
        """Yield lists of events in file order; see the class docstring for errors."""
        yield from self._batches()

    def complete_batches(self) -> Iterator[tuple[int, list[Complete]]]:
        """Yield (events in the batch, its complete events) in file order, as `batches` reads them.

        Only complete events are built: the others are counted (their fields are neither built nor
        type-checked, unless their batch is read leniently for an odd field of some event).
        """
        self._complete_only = True
        for items in self._batches():
            if items is NEW_PART:
                yield 0, NEW_PART
                continue
            yield len(items), [e for e in items if type(e) is Complete]

    def _batches(self) -> Iterator[list[Any]]:
        self._file, self.compressed, self.identity = _open(self.path, self.decompressor)
        try:
            yield from self._run()
        except _gzip_errors() as exc:
            if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
                raise
            raise TraceFormatError(
                f"{self.path}: cannot decompress ({type(exc).__name__}: {exc}); the gzip file is corrupt or "
                "was truncated while being written. Re-copy or re-capture the trace."
            ) from exc
        except RecursionError as exc:
            # msgspec decodes nested values recursively: a trace nested thousands deep is not a profile.
            raise TraceFormatError(
                f"{self.path}: a value is nested too deeply to decode (past Python's recursion limit, within "
                f"the {len(self._buf)} bytes buffered); the file is corrupt or not a Kineto trace"
            ) from exc
        finally:
            self._file.close()
            self._file = None

    # -- reading ---------------------------------------------------------------------------------

    def _fill(self, want: int) -> None:
        """Read until at least ``want`` bytes are buffered or the file ends."""
        assert self._file is not None
        while not self._eof and len(self._buf) < want:
            checkpoint()  # the parsing deadline, per block read (perfgate.helpers.deadline)
            # Small blocks keep decompression and the copy into the buffer cache-resident.
            block = self._file.read(self.read_block)
            if not block:
                self._eof = True
                break
            self._buf += block
            self.decoded_bytes += len(block)

    def _where(self, pos: int) -> str:
        return f"{self.path} near byte {self._base + pos} of the decompressed JSON"

    # -- structure -------------------------------------------------------------------------------

    def _run(self) -> Iterator[list[Any]]:
        self._fill(self.read_block)
        buf = self._buf
        start = 3 if buf.startswith(b"\xef\xbb\xbf") else 0
        while start < len(buf) and buf[start] in _WS:
            start += 1
        if start >= len(buf):
            raise TraceFormatError(f"{self.path}: the file is empty; it is not a trace")
        opener = buf[start]
        if opener == ord("["):
            sep = start
            top_is_array = True
        elif opener == ord("{"):
            sep = self._find_events_array(start)
            top_is_array = False
        else:
            raise TraceFormatError(
                f"{self.path}: does not start with a JSON object or array (first byte {bytes([opener])!r}); "
                "expected a Kineto/Chrome trace (.json or .json.gz)"
            )
        end = yield from self._events(sep)
        if not self.stopped:
            self._tail(end, top_is_array)

    def _find_events_array(self, start: int) -> int:
        """Decode the keys before ``traceEvents`` and return the index of its ``[``."""
        search_from = start
        last_error: str | None = None
        while True:
            match = _EVENTS_KEY.search(self._buf, search_from)
            if match is None:
                if self._eof:
                    detail = f" ({last_error})" if last_error else ""
                    raise TraceFormatError(
                        f"{self.path}: no top-level 'traceEvents' array{detail}; this is not a Kineto trace "
                        "or the file is truncated"
                    )
                if len(self._buf) > self.max_value_bytes:
                    raise TraceTooLargeError(
                        f"{self.path}: more than {self.max_value_bytes} bytes before 'traceEvents'; the "
                        "header is implausibly large or this is not a Kineto trace"
                    )
                search_from = max(start, len(self._buf) - 64)
                self._fill(len(self._buf) + self.read_block)
                continue
            head = bytes(self._buf[start : match.start()]) + b'"traceEvents":null}'
            try:
                self.header = _HEADER_DECODER.decode(head)
            except msgspec.DecodeError as exc:
                # The key may sit inside a string value; try the next occurrence.
                last_error = str(exc)
                search_from = match.end()
                continue
            return match.end() - 1

    def _tail(self, end: int, top_is_array: bool) -> None:
        """Check what follows the events array and merge any trailing top-level keys."""
        while not self._eof:
            if len(self._buf) - end > self.max_value_bytes:
                raise TraceTooLargeError(
                    f"{self.path}: more than {self.max_value_bytes} bytes after the events array"
                )
            self._fill(len(self._buf) + self.read_block)
        rest = bytes(self._buf[end + 1 :]).strip(_WS)
        if top_is_array:
            if rest:
                raise TraceFormatError(f"{self._where(end + 1)}: unexpected data after the events array")
            return
        if rest.startswith(b"}"):
            if rest[1:].strip(_WS):
                raise TraceFormatError(f"{self._where(end + 1)}: unexpected data after the trace object")
            return
        if not rest.startswith(b","):
            raise TraceFormatError(
                f"{self._where(end + 1)}: the trace object is not closed after 'traceEvents' (truncated file?)"
            )
        try:
            tail = _HEADER_DECODER.decode(b"{" + rest[1:])
        except msgspec.DecodeError as exc:
            raise TraceFormatError(
                f"{self._where(end + 1)}: invalid JSON after the events array ({exc}); the file is "
                "truncated or corrupt"
            ) from exc
        merged = {
            name: getattr(tail, name) if getattr(tail, name) is not None else getattr(self.header, name)
            for name in Header.__struct_fields__
        }
        self.header = Header(**merged)

    # -- events ----------------------------------------------------------------------------------

    def _events(self, sep: int) -> Generator[list[Any], None, int]:
        """Yield event batches; ``sep`` indexes the ``[`` or ``,`` before the next element.

        Returns the buffer index of the ``]`` that closes the array (0 when it was seen already, or
        when the stream stopped at ``stop_at``).
        """
        while True:
            at = self._base + sep
            if self.stop_at is not None and at >= self.stop_at:
                self.meet = (at, self._base + len(self._buf), self._eof)
                later = None if self.resume is None else self.resume(at)
                if later is None:
                    self.stopped = True
                    return 0
                self.stop_at, self.skip_before = None, later
                yield NEW_PART
            if self.skip_before and at >= self.skip_before:
                if self.meet is None:
                    self.meet = (at, self._base + len(self._buf), self._eof)
                elif self.resume_meet is None and self.stop_at is None and self.resume is not None:
                    self.resume_meet = (at, self._base + len(self._buf), self._eof)
                if self.halt is not None and self.halt(at):
                    self.halt_meet = (at, self._base + len(self._buf), self._eof)
                    self.stopped = True
                    return 0
            self._fill(sep + self.chunk_bytes)
            buf = self._buf
            probe = sep + 1
            while probe < len(buf) and buf[probe] in _WS:
                probe += 1
            if probe < len(buf) and buf[probe] == ord("]") and buf[sep] == ord("["):
                return probe
            cut = self._cut(sep)
            if cut is None:
                continue
            events, close, next_sep = cut
            # Move the unread rest into a fresh buffer instead of deleting the consumed head: the
            # events' raw args still point into the old one, which must never be resized.
            self._buf = self._buf[next_sep:]
            self._base += next_sep
            if events:
                yield events
            if close:
                return 0
            sep = 0

    def _cut(self, sep: int) -> tuple[list[Any], bool, int] | None:
        """Decode the longest run of whole elements after ``sep`` that the buffer holds.

        Returns (events, array_closed, index of the next separator or of ``]``), or None after
        reading more input when no cut was possible yet.
        """
        if self._base + sep < self.skip_before:
            return self._guess_cut(sep)
        # Candidates where an event can end first: a failed decode runs through the whole run, and C++
        # kernel names hold ``}, `` often. Then every candidate, as an array of other values needs.
        found, _ = self._decode_at(sep, _ENDS_EVENT)
        if found is not None:
            return found
        found, last_error = self._decode_at(sep, _AFTER_CLOSE)
        if found is not None:
            return found
        buf = self._buf
        pending = len(buf) - sep
        if self._eof:
            self._fail_at_eof(sep, last_error)
        if pending > self.max_value_bytes:
            if last_error is not None and "truncated" not in last_error:
                raise TraceFormatError(f"{self._where(sep)}: invalid JSON in traceEvents ({last_error})")
            raise TraceTooLargeError(
                f"{self._where(sep)}: no complete event within {self.max_value_bytes} bytes; a single event "
                "is larger than the limit (raise max_event_bytes if it is genuine) or the file is corrupt"
            )
        self._fill(len(buf) + max(self.chunk_bytes, pending))
        return None

    def _decode_at(
        self, sep: int, follows: re.Pattern[bytes]
    ) -> tuple[tuple[list[Any], bool, int] | None, str | None]:
        """The run after ``sep`` decoded up to the last ``}`` that ``follows`` matches after (group 1: the
        separator there), trying up to `_MAX_ATTEMPTS` such ``}`` from the buffer's end: ((events, whether
        the array closed, index of the separator) or None when none decodes, the last decode error). A
        ``}`` inside a string or a nested value leaves the run unbalanced, so its decode fails."""
        buf = self._buf
        hi = len(buf)
        attempts = 0
        last_error: str | None = None
        while attempts < _MAX_ATTEMPTS and (idx := buf.rfind(b"}", sep + 1, hi)) >= 0:
            hi = idx
            after = follows.match(buf, idx + 1)
            if after is None:
                continue
            attempts += 1
            try:
                events = self._decode_run(sep, idx)
            except msgspec.DecodeError as exc:
                last_error = str(exc)
                continue
            return (events, after.group(1) == b"]", after.start(1)), last_error
        return None, last_error

    def _guess_cut(self, sep: int) -> tuple[list[Any], bool, int] | None:
        """Where `_cut` most likely cuts, without decoding: after the last ``}`` followed by ``,`` and
        ``{`` or the end of the buffer (`_ENDS_EVENT`; see the class docstring); None after reading more
        input when the buffer holds none."""
        buf = self._buf
        hi = len(buf)
        while (idx := buf.rfind(b"}", sep + 1, hi)) >= 0:
            after = _ENDS_EVENT.match(buf, idx + 1)
            if after is not None and after.group(1) == b",":
                return [], False, after.start(1)
            hi = idx
        pending = len(buf) - sep
        if self._eof or pending > self.max_value_bytes:
            raise TraceFormatError(
                f"{self._where(sep)}: no place to start reading a part of the events array"
            )
        self._fill(len(buf) + max(self.chunk_bytes, pending))
        return None

    def _fail_at_eof(self, sep: int, last_error: str | None) -> NoReturn:
        if last_error is not None and "truncated" not in last_error:
            pos = _BYTE_POS.search(last_error)
            where = self._where(sep + int(pos.group(1)) - 1) if pos else self._where(sep)
            raise TraceFormatError(f"{where}: invalid JSON in traceEvents ({last_error})")
        raise TraceFormatError(
            f"{self._where(sep)}: the traceEvents array is not closed; the trace is truncated (was the "
            "profiler or the job killed while writing it?). Re-capture it."
        )

    def _decode_run(self, sep: int, close: int) -> list[Any]:
        """Decode buffer[sep..close] as a JSON array by overwriting its delimiters in place.

        No copy is made: the events' raw ``args`` are views into the buffer, which is why the reader
        replaces the buffer after a cut rather than resizing it.
        """
        buf = self._buf
        # A cut candidate is always followed by "," or "]", so close + 1 is inside the buffer.
        saved_open, saved_close = buf[sep], buf[close + 1]
        buf[sep] = ord("[")
        buf[close + 1] = ord("]")
        region = memoryview(buf)[sep : close + 2]
        try:
            try:
                if self._complete_only:
                    return _COMPLETE_DECODER.decode(region)
                return _EVENTS_DECODER.decode(region)
            except msgspec.ValidationError:
                events = self._decode_lenient(region)
                if self._complete_only:
                    return [_complete(e) if e.ph == "X" else OTHER_EVENT for e in events]
                return events
        finally:
            buf[sep] = saved_open
            buf[close + 1] = saved_close

    def _decode_lenient(self, region: memoryview) -> list[Event]:
        """Fallback when some event has an unexpected field type: convert events one by one."""
        items: Any = _ANY_DECODER.decode(region)
        assert isinstance(items, list)
        events: list[Event] = []
        for item in items:  # pyright: ignore[reportUnknownVariableType]
            if not isinstance(item, dict):
                self.lenient_skipped += 1
                continue
            fields: dict[str, Any] = {k: v for k, v in item.items() if k != "args"}  # pyright: ignore[reportUnknownVariableType]
            try:
                event = msgspec.convert(fields, Event, strict=False)
            except msgspec.ValidationError:
                self.lenient_skipped += 1
                continue
            if "args" in item:
                event.args = msgspec.Raw(_ENCODER.encode(item["args"]))
            events.append(event)
        return events


def _complete(event: Event) -> Complete:
    return Complete(
        cat=event.cat, name=event.name, ts=event.ts, dur=event.dur, tid=event.tid, args=event.args
    )
