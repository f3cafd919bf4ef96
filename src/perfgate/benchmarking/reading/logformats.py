"""Training logs written by other launchers, read into per-step timing and health entries.

Built-in formats (each reads what its trainer prints to the console):

- ``megatron``: Megatron-LM's ``iteration N/M | ... | elapsed time per iteration (ms): T | ...`` lines. A line
  reports the mean over the iterations since the previous line (``--log-interval``); it also carries the
  loss (``lm loss:``), ``loss scale:``, ``grad norm:``, ``number of skipped iterations:`` and ``number of nan
  iterations:`` for that interval. ``using world size: N`` and the argument dump give the world size,
  ``global_batch_size``, ``seq_length`` and ``initial_loss_scale``; ``memory (MB) | ... max allocated: ...``
  lines give memory.
- ``nanogpt``: nanoGPT's ``iter N: loss L, time T ms, mfu P%`` lines. ``T`` is the time of that single
  iteration (sampled every ``log_interval``), not a mean; the iteration that ran an evaluation
  (``step N: train loss ..., val loss ...``) or saved a checkpoint is excluded from timing.
  ``tokens per iteration will be: K`` gives the global tokens per step.
- ``torchtitan``: ``step: N  loss: L  [grad_norm: G]  memory: XGiB(P%)  tps: K ...`` lines. There is no
  step time on the line: it is the per-device tokens of a step over ``tps`` (tokens per second per device,
  averaged since the previous line), so the global tokens per step and the world size must be known
  (from ``global batch size`` / ``sequence length`` on the ``Training starts`` line and the device mesh
  line, or given by the caller).
- ``regex``: the caller's pattern with named groups ``step`` and ``step_time_ms`` (required) and optionally
  ``loss``, ``grad_norm``, ``loss_scale``, ``skipped``, ``nan``.

Lines come from `perfgate.benchmarking.reading.loglines`: a line that is not known whole (no newline at the end of the
file, not UTF-8, over-long) is never read, and every line loses its launcher and logger prefixes by the one
rule there, whatever the format. A built-in format's step line is the trainer's text from its start (after
those prefixes); one that is not whole is refused with its line number and why (``ParsedLog.refused``), never
read as a step:

- a number the format reads must be followed by what the trainer prints after it (Megatron's `` |``,
  nanoGPT's ``,`` after the loss and ``ms`` after the time, torchtitan's spaces), so ``(ms): 890`` cut from
  ``(ms): 89075.2 |`` is refused;
- a Megatron step line ends with ``|``; a line holding two step lines (writes of two processes run together)
  is refused;
- a step line whose marker (``iteration N/M |``, ``iter N: loss``, ``step: N  loss:``) sits behind a prefix
  the rule does not know is refused and the prefix is shown.

A file whose step lines carry rank tags of several ranks (a combined console log) is read for the lowest
of them; the notes say so.

User patterns run in linear time (RE2, through ``benchmarking.reading.userregex``); the built-in formats' own
patterns have no nested repetition. A user pattern is tried on the line as written, then without its prefix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.loglines import LogLine, text_line
from perfgate.benchmarking.reading.userregex import LinearPattern, UserRegexError, compile_user_regex
from perfgate.security.quoting import file_text

__all__ = [
    "FORMATS",
    "MAX_LINE_CHARS",
    "LogEntry",
    "LogFormat",
    "ParsedLog",
    "compile_user_pattern",
    "parse_log",
]

LogFormat = Literal["megatron", "nanogpt", "torchtitan", "regex"]
FORMATS: tuple[LogFormat, ...] = ("megatron", "nanogpt", "torchtitan", "regex")
MAX_LINE_CHARS = 4000
"""Only this much of each line is searched: bounds the work a pathological pattern can do per line. A step
line longer than this is refused (its end, where a number may be, is not looked at)."""

_NUM = r"([-+]?(?:\d[\d,]*(?:\.\d*)?(?:[eE][-+]?\d+)?|[Nn]a[Nn]|[Ii]nf(?:inity)?))"
_OPTIONAL_GROUPS = ("loss", "grad_norm", "loss_scale", "skipped", "nan")
MEGATRON_INITIAL_LOSS_SCALE = 2.0**32
"""Megatron's default ``--initial-loss-scale``: where its dynamic loss scale starts when the log's argument
dump does not say."""


@dataclass
class LogEntry:
    """One logged step line.

    ``step_ms`` is the reported step time; ``mean_since_previous`` says whether it is the mean over the
    steps since the previous line (Megatron, torchtitan) or the time of this one step (nanoGPT).
    ``skipped`` / ``nan`` count iterations of the interval the line closes.
    """

    step: int
    step_ms: float | None
    line: int
    loss: float | None = None
    grad_norm: float | None = None
    loss_scale: float | None = None
    skipped: int = 0
    nan: int = 0
    excluded: str | None = None
    tokens_per_s_device: float | None = None
    rank: int | None = None
    """The rank the line's prefix names, when it names one."""


@dataclass
class ParsedLog:
    """Everything one log file told about the run."""

    format: LogFormat
    entries: list[LogEntry]
    mean_since_previous: bool
    world_size: int | None = None
    world_size_evidence: str | None = None
    global_batch: int | None = None
    seq_length: int | None = None
    tokens_per_step: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    notes: list[str] = field(default_factory=list[str])
    lines_read: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    """(line number, why) of every line not read because it is not known whole."""
    refused_steps: int = 0
    """How many of the refused lines are step lines."""
    initial_loss_scale: float | None = None
    """Where the dynamic loss scale starts (Megatron's argument dump), when the log says."""


class _NotWhole(Exception):
    """A step line that cannot be read whole; the message says why."""


def _num(text: str) -> float:
    """A logged number: thousands separators allowed, ``nan``/``inf`` kept as non-finite floats."""
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(float(text.replace(",", "")))


def compile_user_pattern(pattern: str) -> LinearPattern:
    """A caller's pattern, compiled for linear-time search, with the groups the regex format needs.

    Raises:
        BenchmarkError: too long, not linear-time syntax, or missing ``step`` / ``step_time_ms``.
    """
    try:
        return compile_user_regex(pattern, field="pattern", required_groups=("step", "step_time_ms"))
    except UserRegexError as exc:
        raise BenchmarkError(
            f"{exc}; e.g. "
            r"'step (?P<step>\d+) .*time (?P<step_time_ms>[0-9.]+)ms( loss (?P<loss>\S+))?'"
        ) from exc


def _readable(lines: Iterable[LogLine], out: ParsedLog, step: Callable[[str], object]) -> Iterator[LogLine]:
    """The lines known whole; the others go to ``out.refused`` (counted as step lines when ``step`` finds the
    format's step marker in them)."""
    for ln in lines:
        out.lines_read = ln.no
        if ln.problem is not None:
            out.refused.append((ln.no, ln.problem))
            if step(ln.text[:MAX_LINE_CHARS]):
                out.refused_steps += 1
            continue
        yield ln


def _step_line(
    ln: LogLine, out: ParsedLog, start: re.Pattern[str], anywhere: re.Pattern[str], fmt: str
) -> re.Match[str] | None:
    """The format's step marker at the start of the line (after its prefix); None when the line is no step
    line. A step line behind an unknown prefix, holding two step lines, or too long is refused."""
    text = ln.text
    m = start.match(text)
    if m is None:
        if (other := anywhere.search(text[:MAX_LINE_CHARS])) is not None:
            unknown = file_text(text[: other.start()].strip(), 60)
            _refuse(
                out, ln, f"a {fmt} step line behind a prefix perfgate does not know ({unknown}); not read"
            )
        return None
    if len(text) > MAX_LINE_CHARS:
        _refuse(out, ln, f"a {fmt} step line longer than {MAX_LINE_CHARS} characters; not read")
        return None
    if len(anywhere.findall(text)) > 1:
        _refuse(out, ln, f"two {fmt} step lines run together (writes of two processes interleaved); not read")
        return None
    return m


def _refuse(out: ParsedLog, ln: LogLine, why: str) -> None:
    out.refused.append((ln.no, why))
    out.refused_steps += 1


# --------------------------------------------------------------------------- Megatron

_MEG_START = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEG_ANY = re.compile(r"\biteration\s+\d+\s*/\s*\d+\s*\|")
_MEG_TIME = re.compile(r"\|\s*elapsed time per iteration \(ms\):([^|]*)\|")
_MEG_LM_LOSS = re.compile(r"\|\s*lm loss:([^|]*)\|")
_MEG_LOSS = re.compile(r"\|\s*[A-Za-z0-9_ -]{0,40}?loss:([^|]*)\|")
_MEG_SCALE = re.compile(r"\|\s*loss scale:([^|]*)\|")
_MEG_GRAD = re.compile(r"\|\s*grad norm:([^|]*)\|")
_MEG_SKIPPED = re.compile(r"\|\s*number of skipped iterations:([^|]*)\|")
_MEG_NAN = re.compile(r"\|\s*number of nan iterations:([^|]*)\|")
_MEG_GBS_LINE = re.compile(r"\|\s*global batch size:([^|]*)\|")
_MEG_WORLD = re.compile(r"using world size:\s*(\d+)\b")
_MEG_ARG = re.compile(
    r"^\s*(world_size|global_batch_size|seq_length|initial_loss_scale)\s\.{3,}\s*([0-9.eE+]+)\s*$"
)
_MEG_MEM = re.compile(
    r"memory \(MB\)\s*\|.*?max allocated:\s*" + _NUM + r"(?:.*?max reserved:\s*" + _NUM + ")?"
)
_WHOLE_NUMBER = re.compile(r"^\s*" + _NUM + r"\s*$")


def _bar_field(text: str, pattern: re.Pattern[str], name: str) -> float | None:
    """The number in a Megatron ``| name: value |`` field; None when the field is absent.

    Raises:
        _NotWhole: the field's value is not one whole number (a cut or spliced line).
    """
    m = pattern.search(text)
    if m is None:
        return None
    value = _WHOLE_NUMBER.match(m.group(1))
    if value is None:
        raise _NotWhole(f"its {name} {file_text(m.group(1).strip(), 40)!r} is not one whole number")
    return _num(value.group(1))


def _megatron_entry(ln: LogLine, step: int) -> LogEntry:
    """A Megatron step line read whole.

    Raises:
        _NotWhole: why it is not.
    """
    text = ln.text
    if not text.rstrip().endswith("|"):
        raise _NotWhole("it does not end with ' |' as Megatron's step lines do: it is cut")
    ms = _bar_field(text, _MEG_TIME, "elapsed time")
    if ms is None:
        raise _NotWhole("it has no 'elapsed time per iteration (ms)'")
    entry = LogEntry(step=step, step_ms=ms, line=ln.no, rank=ln.rank)
    loss = _bar_field(text, _MEG_LM_LOSS, "lm loss")
    entry.loss = loss if loss is not None else _bar_field(text, _MEG_LOSS, "loss")
    entry.loss_scale = _bar_field(text, _MEG_SCALE, "loss scale")
    entry.grad_norm = _bar_field(text, _MEG_GRAD, "grad norm")
    skipped = _bar_field(text, _MEG_SKIPPED, "number of skipped iterations")
    nan = _bar_field(text, _MEG_NAN, "number of nan iterations")
    entry.skipped = int(skipped) if skipped is not None and math.isfinite(skipped) else 0
    entry.nan = int(nan) if nan is not None and math.isfinite(nan) else 0
    return entry


def _megatron(lines: Iterable[LogLine], out: ParsedLog) -> None:
    for ln in _readable(lines, out, _MEG_ANY.search):
        no = ln.no
        line = ln.text[:MAX_LINE_CHARS]
        if (m := _MEG_WORLD.search(line)) is not None:
            out.world_size = int(m.group(1))
            out.world_size_evidence = f"line {no}: {file_text(line.strip(), 120)}"
            continue
        if (m := _MEG_ARG.match(line)) is not None:
            key, value = m.group(1), float(m.group(2))
            if key == "world_size" and out.world_size is None:
                out.world_size = int(value)
                out.world_size_evidence = f"line {no}: argument world_size = {int(value)}"
            elif key == "global_batch_size":
                out.global_batch = int(value)
            elif key == "seq_length":
                out.seq_length = int(value)
            elif key == "initial_loss_scale":
                out.initial_loss_scale = value
            continue
        if (m := _MEG_MEM.search(line)) is not None:
            alloc = int(_num(m.group(1)) * 2**20)
            out.peak_allocated_bytes = max(out.peak_allocated_bytes or 0, alloc)
            if m.group(2) is not None:
                reserved = int(_num(m.group(2)) * 2**20)
                out.peak_reserved_bytes = max(out.peak_reserved_bytes or 0, reserved)
            continue
        it = _step_line(ln, out, _MEG_START, _MEG_ANY, "megatron")
        if it is None:
            continue
        try:
            entry = _megatron_entry(ln, int(it.group(1)))
            gbs = _bar_field(ln.text, _MEG_GBS_LINE, "global batch size")
        except _NotWhole as exc:
            _refuse(out, ln, f"a megatron step line, but {exc}; not read")
            continue
        if gbs is not None and math.isfinite(gbs):
            out.global_batch = int(gbs)
        out.entries.append(entry)
    if out.global_batch is not None and out.seq_length is not None:
        out.tokens_per_step = out.global_batch * out.seq_length


# --------------------------------------------------------------------------- nanoGPT

_NANO_START = re.compile(r"iter (\d+): loss ")
_NANO_ANY = re.compile(r"\biter \d+: loss ")
_NANO_ITER = re.compile(r"iter (\d+): loss " + _NUM + r", time " + _NUM + r"ms(?:,|\s*$)")
_NANO_EVAL = re.compile(r"step (\d+): train loss ")
_NANO_SAVE = re.compile(r"saving checkpoint")
_NANO_TOKENS = re.compile(r"tokens per iteration will be:\s*([\d,]+)\s*$")


def _nanogpt(lines: Iterable[LogLine], out: ParsedLog) -> None:
    pending: str | None = None  # work done at the top of the next logged iteration (eval, checkpoint)
    for ln in _readable(lines, out, _NANO_ANY.search):
        line = ln.text[:MAX_LINE_CHARS].strip()
        if (m := _NANO_TOKENS.search(line)) is not None:
            out.tokens_per_step = _int(m.group(1))
        elif _NANO_EVAL.match(line):
            pending = "evaluation ran in this iteration"
        elif _NANO_SAVE.match(line):
            pending = pending or "a checkpoint was saved in this iteration"
        elif _step_line(ln, out, _NANO_START, _NANO_ANY, "nanogpt") is not None:
            m = _NANO_ITER.match(ln.text.strip())
            if m is None:
                _refuse(
                    out, ln, "a nanogpt step line without a whole 'loss L, time Tms' (it is cut); not read"
                )
                continue
            entry = LogEntry(
                step=int(m.group(1)),
                step_ms=_num(m.group(3)),
                line=ln.no,
                loss=_num(m.group(2)),
                rank=ln.rank,
            )
            entry.excluded, pending = pending, None
            out.entries.append(entry)


# --------------------------------------------------------------------------- torchtitan

_TT_START = re.compile(r"step:\s*(\d+)\s+loss:")
_TT_ANY = re.compile(r"\bstep:\s*\d+\s+loss:")
_TT_FIELDS = {
    "loss": re.compile(r"^step:\s*\d+\s+loss:\s*(\S*)"),
    "grad_norm": re.compile(r"\sgrad_norm:\s*(\S*)"),
    "tps": re.compile(r"\stps:\s*(\S*)"),
}
_TT_WHOLE = re.compile(r"^" + _NUM + r"$")
_TT_MEM = re.compile(r"\smemory:\s*" + _NUM + r"\s*GiB")
_TT_BEGIN = re.compile(r"global batch size (\d+).*?sequence length (\d+)")
_TT_MESH = re.compile(r"device mesh with \[[^\]]*\],\s*\[([\d,\s]+)\]")


def _tt_field(text: str, name: str) -> float | None:
    """A torchtitan ``name: value`` read whole: followed by spaces, as every field but the last (mfu) is;
    None when absent.

    Raises:
        _NotWhole: the value is not one number followed by a space (the line is cut there).
    """
    m = _TT_FIELDS[name].search(text)
    if m is None:
        return None
    whole = _TT_WHOLE.match(m.group(1))
    if whole is None or m.end(1) >= len(text):
        raise _NotWhole(f"its {name} {file_text(m.group(1), 40)!r} is not one whole number")
    return _num(whole.group(1))


def _torchtitan(lines: Iterable[LogLine], out: ParsedLog) -> None:
    for ln in _readable(lines, out, _TT_ANY.search):
        no = ln.no
        line = ln.text[:MAX_LINE_CHARS]
        if (m := _TT_BEGIN.search(line)) is not None:
            out.global_batch, out.seq_length = int(m.group(1)), int(m.group(2))
            out.tokens_per_step = out.global_batch * out.seq_length
            continue
        if (m := _TT_MESH.search(line)) is not None:
            sizes = [int(s) for s in m.group(1).replace(" ", "").split(",") if s]
            out.world_size = math.prod(sizes)
            out.world_size_evidence = f"line {no}: device mesh {sizes}"
            continue
        st = _step_line(ln, out, _TT_START, _TT_ANY, "torchtitan")
        if st is None:
            continue
        try:
            loss = _tt_field(ln.text, "loss")
            grad = _tt_field(ln.text, "grad_norm")
            tps = _tt_field(ln.text, "tps")
        except _NotWhole as exc:
            _refuse(out, ln, f"a torchtitan step line, but {exc}; not read")
            continue
        entry = LogEntry(
            step=int(st.group(1)), step_ms=None, line=no, loss=loss, grad_norm=grad, rank=ln.rank
        )
        entry.tokens_per_s_device = tps
        if (m := _TT_MEM.search(line)) is not None:
            reserved = int(_num(m.group(1)) * 2**30)
            out.peak_reserved_bytes = max(out.peak_reserved_bytes or 0, reserved)
        out.entries.append(entry)


def _torchtitan_times(out: ParsedLog, tokens_per_step: int | None, world_size: int | None) -> None:
    """Step times from tps: per-device tokens of one step over per-device tokens per second."""
    if not out.entries:
        return
    if tokens_per_step is None or world_size is None:
        raise BenchmarkError(
            "torchtitan logs give tokens per second, not step times: the global tokens per step and the "
            "world size are needed (the log's 'Training starts ... global batch size ..., sequence length' "
            "and device mesh lines were not found): pass tokens_per_step and world_size"
        )
    per_device = tokens_per_step / world_size
    for e in out.entries:
        if e.tokens_per_s_device is not None and e.tokens_per_s_device > 0:
            e.step_ms = per_device / e.tokens_per_s_device * 1e3
        else:
            e.excluded = e.excluded or "no tps on this line"


# --------------------------------------------------------------------------- caller's pattern


def _regex(lines: Iterable[LogLine], out: ParsedLog, pattern: LinearPattern) -> None:
    for ln in _readable(lines, out, pattern.search):
        no = ln.no
        m = pattern.search(ln.raw[:MAX_LINE_CHARS]) or pattern.search(ln.text[:MAX_LINE_CHARS])
        if m is None:
            continue
        try:
            entry = LogEntry(
                step=int(m["step"] or ""), step_ms=_num(m["step_time_ms"] or ""), line=no, rank=ln.rank
            )
            for name in _OPTIONAL_GROUPS:
                value_text = m.get(name)
                if value_text is not None:
                    value = _num(value_text)
                    if name in ("skipped", "nan"):
                        setattr(entry, name, int(value))
                    else:
                        setattr(entry, name, value)
        except (ValueError, OverflowError):
            _refuse(out, ln, "matched the pattern, but a number in it could not be read; not read")
            continue
        out.entries.append(entry)


def _one_rank(out: ParsedLog) -> None:
    """Keep the step lines of the lowest rank a combined log tags (a console of several ranks)."""
    tagged = sorted({e.rank for e in out.entries if e.rank is not None})
    if len(tagged) < 2:
        return
    keep = tagged[0]
    out.entries = [e for e in out.entries if e.rank in (None, keep)]
    shown = ", ".join(map(str, tagged[:8])) + (", ..." if len(tagged) > 8 else "")
    out.notes.append(
        f"the file holds step lines of ranks {shown} (by their prefixes): rank {keep}'s are read; give one "
        "file per rank to compare ranks"
    )


def _as_lines(lines: Iterable[LogLine] | Iterable[str]) -> Iterator[LogLine]:
    for no, item in enumerate(lines, 1):
        yield item if isinstance(item, LogLine) else text_line(no, item)


def parse_log(
    lines: Iterable[LogLine] | Iterable[str],
    fmt: LogFormat,
    *,
    pattern: LinearPattern | None = None,
    mean_since_previous: bool = True,
    tokens_per_step: int | None = None,
    world_size: int | None = None,
) -> ParsedLog:
    """Read ``lines`` in format ``fmt``: `LogLine` from `perfgate.benchmarking.reading.loglines.read_log_lines`, or
    strings known whole (one per line, numbered from 1).

    ``mean_since_previous`` applies to the regex format only. ``tokens_per_step`` / ``world_size`` are the
    caller's values, used where the format needs them (torchtitan) and the log is silent.

    Raises:
        BenchmarkError: the format needs a value the log and the caller do not give.
    """
    lines = _as_lines(lines)
    if fmt == "megatron":
        out = ParsedLog(fmt, [], mean_since_previous=True)
        _megatron(lines, out)
    elif fmt == "nanogpt":
        out = ParsedLog(fmt, [], mean_since_previous=False)
        _nanogpt(lines, out)
    elif fmt == "torchtitan":
        out = ParsedLog(fmt, [], mean_since_previous=True)
        _torchtitan(lines, out)
        _torchtitan_times(out, out.tokens_per_step or tokens_per_step, world_size or out.world_size)
    else:
        if pattern is None:
            raise BenchmarkError("format 'regex' needs a pattern")
        out = ParsedLog(fmt, [], mean_since_previous=mean_since_previous)
        _regex(lines, out, pattern)
    _one_rank(out)
    return out
