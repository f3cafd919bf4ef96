"""The run's own log as weaker, labelled evidence (issue 45 item 2): the MoE dispatcher and graph arguments
Megatron lists at start-up, read from the server's copy of a window's stdout into ``logged_settings``.

Megatron's argument listing (megatron/training/arguments.py, ``_print_args``) prints each argument as
``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)``, sorted, between two rules; the lines below are
written in that format, and the script run under run_benchmark_window prints them the same way."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.reading.logsettings import parse_logged_settings, read_logged_settings
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import run_benchmark_window

PY = sys.executable


def megatron_line(name: str, value: object) -> str:
    return "  {} {} {}".format(name, "." * (48 - len(name)), value)


LISTING = [
    "------------------------ arguments ------------------------",
    megatron_line("cuda_graph_impl", "transformer_engine"),
    megatron_line("cuda_graph_scope", "['attn', 'moe_router']"),
    megatron_line("moe_enable_deepep", True),
    megatron_line("moe_flex_dispatcher_backend", "deepep"),
    megatron_line("moe_router_topk", 8),
    megatron_line("moe_token_dispatcher_type", "flex"),
    megatron_line("num_layers", 61),
    "-------------------- end of arguments ---------------------",
]


def test_megatrons_listing_yields_the_dispatcher_and_graph_arguments_only() -> None:
    assert parse_logged_settings(LISTING) == {
        "cuda_graph_impl": "transformer_engine",
        "cuda_graph_scope": "['attn', 'moe_router']",
        "moe_enable_deepep": "True",
        "moe_flex_dispatcher_backend": "deepep",
        "moe_token_dispatcher_type": "flex",
    }


def test_launcher_prefixes_are_stripped_and_the_first_listing_wins() -> None:
    tagged = [f"[rank0]: {megatron_line('moe_token_dispatcher_type', 'alltoall')}"]
    tagged += [f"3: {megatron_line('moe_token_dispatcher_type', 'flex')}"]
    assert parse_logged_settings(tagged) == {"moe_token_dispatcher_type": "alltoall"}


def test_prose_and_command_lines_that_mention_the_names_are_not_a_listing() -> None:
    lines = [
        "WARNING: moe_token_dispatcher_type flex needs deep_ep; falling back to alltoall",
        "moe_token_dispatcher_type = flex",
        "  moe_token_dispatcher_type ....",  # no value
        "python pretrain_gpt.py --moe-token-dispatcher-type flex",
        megatron_line("moe_token_dispatcher_typo", "flex"),
    ]
    assert parse_logged_settings(lines) == {}


def test_a_log_is_read_from_its_start_and_a_cut_last_line_is_not(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(
        ("\n".join(LISTING[:3]) + "\n" + megatron_line("moe_token_dispatcher_type", "flex")).encode()
    )
    # the last line has no newline: it may have been cut ('flex' of 'flexible'?), so it is not read
    assert read_logged_settings(log) == {
        "cuda_graph_impl": "transformer_engine",
        "cuda_graph_scope": "['attn', 'moe_router']",
    }
    assert read_logged_settings(log, max_lines=2) == {"cuda_graph_impl": "transformer_engine"}
    assert read_logged_settings(tmp_path / "absent.log") == {}


SCRIPT = """\
import time

ARGS = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
        "moe_enable_deepep": True, "cuda_graph_impl": "transformer_engine", "seq_length": 4096}
print("------------------------ arguments ------------------------", flush=True)
for line in sorted("  {} {} {}".format(k, "." * (48 - len(k)), v) for k, v in ARGS.items()):
    print(line, flush=True)
print("-------------------- end of arguments ---------------------", flush=True)
for step in range(1, 15):
    time.sleep(0.002)
    print(f"step {step} step_time_ms 2.0", flush=True)
"""


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_window_records_what_its_own_stdout_listed(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if run_benchmark_window.SPEC not in perfgate.tools.REGISTRY:
        monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, run_benchmark_window.SPEC))
    script = workspace / "megatron_args.py"
    script.write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([PY, str(script)]))
    args: dict[str, Any] = {
        "command": [PY, str(script)],
        "timing": "log",
        "log_pattern": r"step (?P<step>\d+) step_time_ms (?P<step_time_ms>[0-9.]+)",
        "warmup_steps": 2,
        "measure_steps": 10,
        "repeats": 1,
        "samples_per_step": 8,
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    out = result.structured_content
    assert out is not None and out["state"] == "executed", result.content
    assert out["logged_settings"] == {
        "cuda_graph_impl": "transformer_engine",
        "moe_enable_deepep": "True",
        "moe_flex_dispatcher_backend": "deepep",
        "moe_token_dispatcher_type": "flex",
    }
