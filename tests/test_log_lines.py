"""Log import reads a line only when it is known whole, and recognises launcher and logger prefixes by one rule
for every format. Every step line here is real trainer output from a public thread (cited per excerpt);
where a test changes one (cuts it, prefixes it, tears a byte), the comment says how."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.benchmarking.reading.logformats import ParsedLog, compile_user_pattern, parse_log
from perfgate.benchmarking.reading.loglines import read_log_lines, strip_prefix
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

# Megatron-LM, https://github.com/epfLLM/Megatron-LLM/issues/11 (turn 3): three consecutive step lines.
MEGATRON = [
    " iteration      182/  250000 | consumed samples:       186368 | elapsed time per iteration (ms): 126995.3 | learning rate: 1.365E-05 | global batch size:  1024 | lm loss: 2.382640E+00 | loss scale: 1.0 | grad norm: 0.227 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    " iteration      183/  250000 | consumed samples:       187392 | elapsed time per iteration (ms): 125553.7 | learning rate: 1.372E-05 | global batch size:  1024 | lm loss: 2.471678E+00 | loss scale: 1.0 | grad norm: 0.134 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    " iteration      184/  250000 | consumed samples:       188416 | elapsed time per iteration (ms): 127804.5 | learning rate: 1.380E-05 | global batch size:  1024 | lm loss: 2.408367E+00 | loss scale: 1.0 | grad norm: 0.270 | number of skipped iterations:   0 | number of nan iterations:   0 |",
]
# Megatron-Bridge with Megatron's own timestamp, https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/4024
MEGATRON_STAMPED = "[2026-05-28 22:26:20] iteration       29/    6069 | consumed samples:        14848 | elapsed time per iteration (ms): 26813.0 | learning rate: 5.800000E-05 | global batch size:   512 | lm loss: 8.716962E-01 | seq_load_balancing_loss: 1.253194E+00 | mtp_1 loss: 1.115410E+00 | mtp_2 loss: 1.180141E+00 | loss scale: 1.0 | grad norm: 0.852 | number of skipped iterations:   0 | number of nan iterations:   0 |"
# nanoGPT, https://github.com/karpathy/nanoGPT/issues/178 (comment by otaviogood, 2023-02-24)
NANOGPT = [
    "iter 0: loss 4.2648, time 9371.81ms, mfu -100.00%",
    "iter 10: loss 3.2202, time 893.76ms, mfu 16.68%",
    "iter 20: loss 2.7697, time 894.88ms, mfu 16.67%",
]
# nanoGPT with a timestamp its user's logger put before each line (the markdown '> ' quoting removed),
# https://github.com/karpathy/nanoGPT/issues/215
NANOGPT_STAMPED = [
    "2023-03-22 09:30:39 iter 2920: loss 3.9883, time 1099.34ms, mfu 15.34%",
    "2023-03-22 09:30:50 iter 2930: loss 3.9408, time 1097.30ms, mfu 15.34%",
]
# torchtitan behind torchrun's rank tag and its own logger, https://github.com/pytorch/torchtitan/pull/3393
TORCHTITAN = [
    "[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14  loss:  3.24405  grad_norm:  0.8319  memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52  mfu: 0.17%",
    "[rank0]:[titan] 2026-05-18 16:04:47,456 - root - INFO - step: 15  loss:  3.10680  grad_norm:  0.8587  memory:  9.46GiB(64.99%)  tps: 7,334  tflops: 0.53  mfu: 0.17%",
    "[rank0]:[titan] 2026-05-18 16:04:48,577 - root - INFO - step: 16  loss:  3.05047  grad_norm:  0.5443  memory:  9.46GiB(64.99%)  tps: 7,313  tflops: 0.52  mfu: 0.17%",
]
NANO_PATTERN = r"^iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<step_time_ms>[\d.]+)ms"

# The prefixes loggers and launchers write, each put before the real lines above.
PREFIXES = [
    "2024-05-01 12:00:00,123 ",  # Python logging's asctime
    "2024-05-01T12:00:00.123Z ",  # ISO 8601
    "[2024-05-01 12:00:00] ",  # bracketed, as Megatron writes its own
    "12:00:00 ",  # a time of day
    "INFO:root:",  # logging.basicConfig's default format
    "[INFO] ",
    "2024-05-01 12:00:00,123 - __main__ - INFO - ",  # '%(asctime)s - %(name)s - %(levelname)s - '
    "[rank3]:",  # torchrun --local-ranks-filter / log prefix
    "[default0]:",  # torchrun --tee
    "0: ",  # srun --label
    "[1,0]<stdout>:",  # mpirun --tag-output
    "[default0]:[2024-05-01 12:00:00] [INFO] ",  # several at once
]


def _bare(lines: list[str]) -> list[str]:
    return [strip_prefix(line)[0] for line in lines]


def _parse(fmt: str, lines: list[str]) -> ParsedLog:
    if fmt == "torchtitan":
        return parse_log(lines, "torchtitan", tokens_per_step=16384, world_size=1)
    if fmt == "regex":
        return parse_log(
            lines, "regex", pattern=compile_user_pattern(NANO_PATTERN), mean_since_previous=False
        )
    return parse_log(lines, fmt)  # type: ignore[arg-type]


_BASE = {
    "megatron": _bare(MEGATRON),
    "nanogpt": NANOGPT,
    "torchtitan": _bare(TORCHTITAN),
    "regex": NANOGPT,
}


@pytest.mark.parametrize("fmt", sorted(_BASE))
@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_prefix_style_is_read_in_every_format(fmt: str, prefix: str) -> None:
    bare = _parse(fmt, _BASE[fmt])
    assert len(bare.entries) == 3 and not bare.refused
    prefixed = _parse(fmt, [prefix + line for line in _BASE[fmt]])
    assert prefixed.refused == []
    got = [(e.step, e.step_ms, e.loss, e.grad_norm) for e in prefixed.entries]
    assert got == [(e.step, e.step_ms, e.loss, e.grad_norm) for e in bare.entries]


def test_the_trainers_own_prefixes_are_read() -> None:
    stamped = parse_log([MEGATRON_STAMPED], "megatron")
    assert [(e.step, e.step_ms, e.loss) for e in stamped.entries] == [(29, 26813.0, 0.8716962)]
    nano = parse_log(NANOGPT_STAMPED, "nanogpt")  # refused before: nanoGPT was matched from the line's start
    assert [(e.step, e.step_ms) for e in nano.entries] == [(2920, 1099.34), (2930, 1097.30)]
    titan = parse_log(TORCHTITAN, "torchtitan", tokens_per_step=16384, world_size=1)
    assert [e.step for e in titan.entries] == [14, 15, 16] and titan.entries[0].grad_norm == 0.8319


def _file(lines: list[str], end: str = "\n") -> io.BytesIO:
    return io.BytesIO(("\n".join(lines) + end).encode())


def test_a_number_cut_at_the_end_of_the_file_is_never_a_step() -> None:
    # the log stops inside the last line's step time: '127804.5' was being written, '12' reached the disk
    cut = MEGATRON[2][: MEGATRON[2].index("127804.5")] + "12"
    parsed = parse_log(
        read_log_lines(io.BytesIO(("\n".join(MEGATRON[:2]) + "\n" + cut).encode())), "megatron"
    )
    assert [e.step for e in parsed.entries] == [182, 183]
    ((no, why),) = parsed.refused
    assert no == 3 and "no newline" in why


def test_a_last_line_without_its_newline_is_refused_even_when_it_looks_whole() -> None:
    parsed = parse_log(read_log_lines(_file(NANOGPT, end="")), "nanogpt")
    assert [e.step for e in parsed.entries] == [0, 10]  # iter 20 looks whole, but nothing says it is
    ((no, why),) = parsed.refused
    assert no == 3 and "no newline" in why and "may be cut" in why
    whole = parse_log(read_log_lines(_file(NANOGPT)), "nanogpt")
    assert [e.step for e in whole.entries] == [0, 10, 20] and whole.refused == []


def test_a_step_line_cut_mid_file_is_refused_with_the_reason() -> None:
    # a copy that lost the end of one line: '(ms): 890' where the line said '(ms): 125553.7 | ...'
    cut = MEGATRON[1][: MEGATRON[1].index("125553.7")] + "890"
    parsed = parse_log(read_log_lines(_file([MEGATRON[0], cut, MEGATRON[2]])), "megatron")
    assert [e.step for e in parsed.entries] == [182, 184]
    ((no, why),) = parsed.refused
    assert no == 2 and "does not end with ' |'" in why
    # nanoGPT: the time cut before its 'ms'
    parsed = parse_log(["iter 10: loss 3.2202, time 89"], "nanogpt")
    assert parsed.entries == [] and "cut" in parsed.refused[0][1]
    # torchtitan: the tps cut (the last field read on the line must be followed by the next one)
    line = _bare(TORCHTITAN)[0]
    parsed = parse_log(
        [line[: line.index("tps: 7,282") + len("tps: 7,2")]], "torchtitan", tokens_per_step=1, world_size=1
    )
    assert parsed.entries == [] and "tps" in parsed.refused[0][1]


def test_two_step_lines_run_together_are_refused() -> None:
    spliced = MEGATRON[0][:120] + MEGATRON[1]  # a second process's line written into the first
    parsed = parse_log([spliced, MEGATRON[2]], "megatron")
    assert [e.step for e in parsed.entries] == [184]
    assert "run together" in parsed.refused[0][1]


def test_a_torn_utf8_sequence_refuses_its_line() -> None:
    # the first two bytes of a three-byte character, its last byte lost (a cut copy or spliced writes)
    torn = NANOGPT[1].encode().replace(b"time", b"\xe4\xb8time")
    data = (NANOGPT[0] + "\n").encode() + torn + b"\n" + (NANOGPT[2] + "\n").encode()
    parsed = parse_log(read_log_lines(io.BytesIO(data)), "nanogpt")
    assert [e.step for e in parsed.entries] == [0, 20]
    ((no, why),) = parsed.refused
    assert no == 2 and "not UTF-8 at byte" in why


def test_a_step_line_behind_an_unknown_prefix_is_refused_and_the_prefix_shown() -> None:
    parsed = parse_log(["worker@node: " + NANOGPT[0], NANOGPT[1]], "nanogpt")
    assert [e.step for e in parsed.entries] == [10]
    assert "prefix perfgate does not know" in parsed.refused[0][1] and "worker@node:" in parsed.refused[0][1]


def test_a_console_of_several_ranks_is_read_for_the_lowest() -> None:
    # torchtitan's lines as two ranks would write them to one console (rank 1's tag added to a copy)
    both = [x for line in TORCHTITAN for x in (line, line.replace("[rank0]", "[rank1]"))]
    parsed = parse_log(both, "torchtitan", tokens_per_step=16384, world_size=2)
    assert [e.step for e in parsed.entries] == [14, 15, 16]
    assert "ranks 0, 1" in parsed.notes[0]


# --------------------------------------------------------------------------- through the tool


async def _import(workspace: Path, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("import_benchmark", args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    return result.structured_content, result.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_the_import_names_the_line_it_did_not_read(workspace: Path) -> None:
    cut = MEGATRON[2][: MEGATRON[2].index("127804.5")] + "890"  # the run was killed while writing
    (workspace / "train.log").write_text("\n".join(MEGATRON) + "\n" + cut.replace("184/", "185/"))
    out, text = await _import(
        workspace, {"paths": ["train.log"], "format": "megatron", "warmup_steps": 0, "windows": 1}
    )
    assert out["steps_measured"] == 2  # 183 and 184; the cut line 185 is no step
    assert "line 4: no newline" in out["warnings"][0]
    lead = text.split("result:")[0]  # read before any figure
    assert "): rank 0 (train.log): 1 line(s) not read, 1 of them step lines: line 4: no newline" in lead
    assert out["job_health"]["unread_step_lines"] == 1
