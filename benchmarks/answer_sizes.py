"""Measure the size of each tool's typical answer: the text an agent reads, before and after budgeting.

"before" is what the SDK writes as text for a returned model (the output pretty-printed as JSON with
indent=2, the text perfgate sent until answers were budgeted); "after" is `answer_text` (lead lines plus
compact JSON under `TEXT_BUDGET_CHARS`). Tokens are estimated as characters / 4.

Typical answers come from a real run of ``perfgate demo`` (collect_env, run_benchmark_window,
profile_segment, compare_benchmarks, compare_tensors, audit_samples, record_decision on a tiny CPU job)
plus typical calls of the other tools: import_benchmark (an 8-rank Megatron log), analyze_trace on a
one-rank real A100 trace (a DDP training step, nccl_parser_config, from ../shared/data/traces/hta when
present) and on the two-rank planted gloo trace, estimate_flops (Llama-2-7B), compute_mfu,
plan_parallel_layout (a layout search for Mixtral 8x7B on 16 H100s). A busy machine can make the demo's
A/B comparison inconclusive; its keep is then refused and the answers recorded so far are measured.
Needs torch for the demo::

    python benchmarks/answer_sizes.py            # prints a Markdown table
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from mcp import Client

from perfgate.evidence import Ledger
from perfgate.server import build_server
from perfgate.serving.answer import CHARS_PER_TOKEN, answer_text
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import REGISTRY

REPO = Path(__file__).resolve().parents[1]
PLANTED = REPO / "tests" / "fixtures" / "traces" / "planted"
SHARED = Path(os.environ.get("PERFGATE_SHARED_DIR", REPO.parent / "shared"))
A100 = SHARED / "data" / "traces" / "hta" / "nccl_parser_config_nccl_data.json.gz"
LLAMA_7B = {"layers": 32, "hidden_size": 4096, "ffn_hidden_size": 11008, "num_attention_heads": 32,
            "vocab_size": 32000, "swiglu": True}  # fmt: skip
MIXTRAL = {"layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32,
           "num_kv_heads": 8, "vocab_size": 32000, "swiglu": True, "moe": {"num_experts": 8, "top_k": 2}}  # fmt: skip


async def _extra_calls(workspace: Path) -> None:
    folder = workspace / "profiles"
    folder.mkdir(exist_ok=True)
    for name in ("slow_rank_rank0.json.gz", "slow_rank_rank1.json.gz"):
        shutil.copy(PLANTED / name, folder)
    shutil.copy(REPO / "tests" / "fixtures" / "logs" / "megatron_8rank.log", workspace / "megatron_8rank.log")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("analyze_trace", {"trace_paths": ["profiles"]}),
        ("import_benchmark", {"paths": ["megatron_8rank.log"], "format": "megatron", "warmup_steps": 20}),
        (
            "estimate_flops",
            {
                "model": LLAMA_7B,
                "seq_len": 4096,
                "tokens_per_step": 4 << 20,
                "convention": "megatron",
                "devices": 64,
            },
        ),
        (
            "compute_mfu",
            {
                "buckets": [{"name": "s", "flops_per_step": 4e14, "step_time_s": 1.0, "steps": 10}],
                "flops_kind": "model",
                "device": "NVIDIA H100 80GB HBM3",
                "precision": "bf16",
            },
        ),
        (
            "plan_parallel_layout",
            {
                "model": MIXTRAL,
                "world_size": 16,
                "gpus_per_node": 8,
                "device": "H100",
                "seq_len": 4096,
                "micro_batch_size": 1,
                "global_batch_size": 256,
                "recompute": "full",
                "mode": "search",
            },
        ),
    ]
    if A100.is_file():
        shutil.copy(A100, workspace / "a100_rank0.json.gz")
        calls.insert(0, ("analyze_trace", {"trace_paths": ["a100_rank0.json.gz"]}))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        for tool, args in calls:
            result = await client.call_tool(tool, args)
            if result.is_error:
                print(f"{tool} failed: {result.content}", file=sys.stderr)


def measure(workspace: Path) -> dict[str, list[tuple[int, int]]]:
    """(before, after) characters per answer, by tool, for every record in the workspace's ledger."""
    specs = {s.name: s for s in REGISTRY}
    sizes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for record in Ledger(workspace).records():
        spec = specs.get(record.tool)
        if spec is None:
            continue
        out = spec.output_model.model_validate(record.result)
        before = len(json.dumps(out.model_dump(mode="json"), indent=2, ensure_ascii=False))
        after = len(answer_text(spec.name, out, spec.brief))
        sizes[spec.name].append((before, after))
    return sizes


def main() -> None:
    from perfgate.demo import run_demo

    workspace = Path(tempfile.mkdtemp(prefix="perfgate-sizes-"))
    try:
        run_demo(workspace / "demo", say=lambda _: None)
    except Exception as exc:  # noqa: BLE001  # a busy machine can make the demo's A/B inconclusive
        print(
            f"the demo stopped early ({str(exc)[:200]}); measuring the answers it recorded", file=sys.stderr
        )
    asyncio.run(_extra_calls(workspace / "demo"))
    sizes = measure(workspace / "demo")
    print("| tool | answers measured | before: tokens (median, max) | after: tokens (median, max) |")
    print("|---|---|---|---|")
    for spec in REGISTRY:
        rows = sizes.get(spec.name)
        if not rows:
            print(f"| `{spec.name}` | 0 | - | - |")
            continue
        b = [r[0] / CHARS_PER_TOKEN for r in rows]
        a = [r[1] / CHARS_PER_TOKEN for r in rows]
        print(
            f"| `{spec.name}` | {len(rows)} | {statistics.median(b):,.0f}, {max(b):,.0f} | "
            f"{statistics.median(a):,.0f}, {max(a):,.0f} |"
        )
    shutil.rmtree(workspace, ignore_errors=True)


if __name__ == "__main__":
    main()
