"""Training logs written by other launchers, read into per-step timing and health entries.

Built-in formats (each reads what its trainer prints to the console):

- ``megatron``: Megatron-LM's ``iteration N/M | ... | elapsed time per iteration (ms): T | ...`` lines. A line
  reports the mean over the iterations since the previous line (``--log-interval``); it also carries the
  loss (``lm loss:``), ``loss scale:``, ``grad norm:``, ``number of skipped iterations:`` and ``number of nan
  iterations:`` for that interval. ``using world size: N`` and the argument dump give the world size,
  ``global_batch_size`` and ``seq_length``; ``memory (MB) | ... max allocated: ...`` lines give memory.
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

User patterns run in linear time (RE2, through ``benchmarking.userregex``); the built-in formats' own
patterns have no nested repetition.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.userregex import LinearPattern, UserRegexError, compile_user_regex
from perfgate.quoting import file_text

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
"""Only this much of each line is searched: bounds the work a pathological pattern can do per line."""

_NUM = r"([-+]?(?:\d[\d,]*(?:\.\d*)?(?:[eE][-+]?\d+)?|[Nn]a[Nn]|[Ii]nf(?:inity)?))"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OPTIONAL_GROUPS = ("loss", "grad_norm", "loss_scale", "skipped", "nan")


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


# --------------------------------------------------------------------------- Megatron

_MEG_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEG_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_MEG_LOSS = re.compile(r"\|\s*([A-Za-z0-9_ -]{0,40}?)loss:\s*" + _NUM)
_MEG_SCALE = re.compile(r"loss scale:\s*" + _NUM)
_MEG_GRAD = re.compile(r"grad norm:\s*" + _NUM)
_MEG_SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
_MEG_NAN = re.compile(r"number of nan iterations:\s*(\d+)")
_MEG_GBS_LINE = re.compile(r"global batch size:\s*(\d+)")
_MEG_WORLD = re.compile(r"using world size:\s*(\d+)")
_MEG_ARG = re.compile(r"^\s*(world_size|global_batch_size|seq_length)\s\.{3,}\s*(\d+)\s*$")
_MEG_MEM = re.compile(
    r"memory \(MB\)\s*\|.*?max allocated:\s*" + _NUM + r"(?:.*?max reserved:\s*" + _NUM + ")?"
)


def _megatron(lines: Iterable[str], out: ParsedLog) -> None:
    for no, raw in enumerate(lines, 1):
        out.lines_read = no
        line = raw[:MAX_LINE_CHARS]
        if (m := _MEG_WORLD.search(line)) is not None:
            out.world_size = int(m.group(1))
            out.world_size_evidence = f"line {no}: {file_text(line.strip(), 120)}"
            continue
        if (m := _MEG_ARG.match(line)) is not None:
            key, value = m.group(1), int(m.group(2))
            if key == "world_size" and out.world_size is None:
                out.world_size = value
                out.world_size_evidence = f"line {no}: argument world_size = {value}"
            elif key == "global_batch_size":
                out.global_batch = value
            elif key == "seq_length":
                out.seq_length = value
            continue
        if (m := _MEG_MEM.search(line)) is not None:
            alloc = int(_num(m.group(1)) * 2**20)
            out.peak_allocated_bytes = max(out.peak_allocated_bytes or 0, alloc)
            if m.group(2) is not None:
                reserved = int(_num(m.group(2)) * 2**20)
                out.peak_reserved_bytes = max(out.peak_reserved_bytes or 0, reserved)
            continue
        it = _MEG_ITER.search(line)
        tm = _MEG_TIME.search(line)
        if it is None or tm is None:
            continue
        entry = LogEntry(step=int(it.group(1)), step_ms=_num(tm.group(1)), line=no)
        if (m := _MEG_LOSS.search(line)) is not None:
            entry.loss = _num(m.group(2))
        if (m := _MEG_SCALE.search(line)) is not None:
            entry.loss_scale = _num(m.group(1))
        if (m := _MEG_GRAD.search(line)) is not None:
            entry.grad_norm = _num(m.group(1))
        if (m := _MEG_SKIPPED.search(line)) is not None:
            entry.skipped = int(m.group(1))
        if (m := _MEG_NAN.search(line)) is not None:
            entry.nan = int(m.group(1))
        if (m := _MEG_GBS_LINE.search(line)) is not None:
            out.global_batch = int(m.group(1))
        out.entries.append(entry)
    if out.global_batch is not None and out.seq_length is not None:
        out.tokens_per_step = out.global_batch * out.seq_length


# --------------------------------------------------------------------------- nanoGPT

_NANO_ITER = re.compile(r"^iter (\d+): loss " + _NUM + r", time " + _NUM + r"ms")
_NANO_EVAL = re.compile(r"^step (\d+): train loss ")
_NANO_SAVE = re.compile(r"^saving checkpoint")
_NANO_TOKENS = re.compile(r"tokens per iteration will be:\s*([\d,]+)")


def _nanogpt(lines: Iterable[str], out: ParsedLog) -> None:
    pending: str | None = None  # work done at the top of the next logged iteration (eval, checkpoint)
    for no, raw in enumerate(lines, 1):
        out.lines_read = no
        line = raw[:MAX_LINE_CHARS].strip()
        if (m := _NANO_TOKENS.search(line)) is not None:
            out.tokens_per_step = _int(m.group(1))
        elif _NANO_EVAL.match(line):
            pending = "evaluation ran in this iteration"
        elif _NANO_SAVE.match(line):
            pending = pending or "a checkpoint was saved in this iteration"
        elif (m := _NANO_ITER.match(line)) is not None:
            entry = LogEntry(step=int(m.group(1)), step_ms=_num(m.group(3)), line=no, loss=_num(m.group(2)))
            entry.excluded, pending = pending, None
            out.entries.append(entry)


# --------------------------------------------------------------------------- torchtitan

_TT_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*" + _NUM)
_TT_GRAD = re.compile(r"grad_norm:\s*" + _NUM)
_TT_MEM = re.compile(r"memory:\s*" + _NUM + r"\s*GiB")
_TT_TPS = re.compile(r"\btps:\s*" + _NUM)
_TT_START = re.compile(r"global batch size (\d+).*?sequence length (\d+)")
_TT_MESH = re.compile(r"device mesh with \[[^\]]*\],\s*\[([\d,\s]+)\]")


def _torchtitan(lines: Iterable[str], out: ParsedLog) -> None:
    for no, raw in enumerate(lines, 1):
        out.lines_read = no
        line = _ANSI.sub("", raw[:MAX_LINE_CHARS])
        if (m := _TT_START.search(line)) is not None:
            out.global_batch, out.seq_length = int(m.group(1)), int(m.group(2))
            out.tokens_per_step = out.global_batch * out.seq_length
            continue
        if (m := _TT_MESH.search(line)) is not None:
            sizes = [int(s) for s in m.group(1).replace(" ", "").split(",") if s]
            out.world_size = math.prod(sizes)
            out.world_size_evidence = f"line {no}: device mesh {sizes}"
            continue
        st = _TT_STEP.search(line)
        if st is None:
            continue
        entry = LogEntry(step=int(st.group(1)), step_ms=None, line=no, loss=_num(st.group(2)))
        if (m := _TT_GRAD.search(line)) is not None:
            entry.grad_norm = _num(m.group(1))
        if (m := _TT_TPS.search(line)) is not None:
            entry.tokens_per_s_device = _num(m.group(1))
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


def _regex(lines: Iterable[str], out: ParsedLog, pattern: LinearPattern) -> None:
    for no, raw in enumerate(lines, 1):
        out.lines_read = no
        m = pattern.search(raw)
        if m is None:
            continue
        try:
            entry = LogEntry(step=int(m["step"] or ""), step_ms=_num(m["step_time_ms"] or ""), line=no)
            for name in _OPTIONAL_GROUPS:
                value_text = m.get(name)
                if value_text is not None:
                    value = _num(value_text)
                    if name in ("skipped", "nan"):
                        setattr(entry, name, int(value))
                    else:
                        setattr(entry, name, value)
        except (ValueError, OverflowError):
            out.notes.append(f"line {no}: matched but a number could not be read; skipped")
            continue
        out.entries.append(entry)


def parse_log(
    lines: Iterable[str],
    fmt: LogFormat,
    *,
    pattern: LinearPattern | None = None,
    mean_since_previous: bool = True,
    tokens_per_step: int | None = None,
    world_size: int | None = None,
) -> ParsedLog:
    """Read ``lines`` in format ``fmt``.

    ``mean_since_previous`` applies to the regex format only. ``tokens_per_step`` / ``world_size`` are the
    caller's values, used where the format needs them (torchtitan) and the log is silent.

    Raises:
        BenchmarkError: the format needs a value the log and the caller do not give.
    """
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
    return out
