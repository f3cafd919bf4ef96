"""`perfgate demo`: the whole loop on a tiny CPU training job, through the real tools over MCP.

The demo makes a temporary workspace holding the bundled training script (`train.py`: an MLP whose
DataLoader decodes samples slowly) and an operator allowlist for exactly the commands the demo runs,
then drives an in-process MCP client through: environment -> baseline windows -> profile -> the change
(DataLoader workers 0 -> 2) -> candidate windows -> comparison -> tensor parity -> sample audit ->
decision, printing what an agent would see, and ending with the decisions.md it produced.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DemoResult", "run_demo"]

WARMUP_STEPS = 5
MEASURE_STEPS = 30
BATCH = 16
REPEATS = 3
SCRIPT = "train.py"


@dataclass
class DemoResult:
    workspace: Path
    experiment_id: str
    accepted: bool
    speedup: float | None
    decisions_md: str
    evidence: dict[str, str]


def _policy(python: str) -> str:
    """Allowlist the demo's own launches only: the harness around train.py with the interpreter in use."""
    return (
        "# Written by `perfgate demo` for its own temporary workspace.\n"
        "[execution]\n"
        "max_timeout_s = 600\n"
        'allow_env = ["PERFGATE_*"]\n\n'
        "[[execution.allow]]\n"
        'name = "demo training runs under the harness"\n'
        f'argv = [{json.dumps(python)}, "-m", "perfgate.harness", "--", "{SCRIPT}"]\n\n'
        "[[execution.allow]]\n"
        'name = "demo profiler run"\n'
        f'argv = [{json.dumps(python)}, "-m", "perfgate.harness", "*"]\n'
    )


def _command(workers: int, dump: str, samples: str) -> list[str]:
    return [
        sys.executable,
        SCRIPT,
        "--steps",
        str(WARMUP_STEPS + MEASURE_STEPS),
        "--batch",
        str(BATCH),
        "--num-workers",
        str(workers),
        "--dump",
        dump,
        "--sample-log",
        samples,
    ]


def _contract(workers: int) -> dict[str, Any]:
    return {
        "invariants": {
            "model": "demo-mlp-64-512-512-10",
            "dataset": "synthetic SlowDecode seed 0",
            "precision": "fp32",
            "global_batch": BATCH,
            "seed": 0,
            "optimizer": "SGD lr=0.05",
        },
        "execution": {"microbatch": BATCH, "accumulation": 1, "data_parallel": 1, "workers": workers},
    }


async def _demo(workspace: Path, say: Callable[[str], None]) -> DemoResult:
    from mcp import Client

    from perfgate.server import build_server
    from perfgate.tools._runtime import ServerConfig

    evidence: dict[str, str] = {}
    server = build_server(ServerConfig.create(workspace))

    async with Client(server) as client:

        async def call(step: str, tool: str, args: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
            say(f"\n== {step}\n-> {tool}({', '.join(sorted(args))})")
            result = await client.call_tool(tool, args)
            text = " ".join(getattr(c, "text", "") for c in result.content)
            if result.is_error or result.structured_content is None:
                raise RuntimeError(f"{tool} failed: {text}")
            out = result.structured_content
            shown = {k: out.get(k) for k in ("evidence_id", "state", *keys) if k in out}
            say("<- " + json.dumps(shown, default=str))
            return out

        env = await call("1. Record the environment", "collect_env", {}, ("backend", "fingerprint"))
        evidence["environment"] = env["evidence_id"]

        windows = (
            "median_step_ms",
            "iqr_ratio",
            "noisy",
            "throughput",
            "data_wait_fraction",
            "windows_measured",
        )
        base = await call(
            "2. Baseline: 3 steady-state windows, warm-up excluded (num_workers=0)",
            "run_benchmark_window",
            {
                "command": _command(0, "ref.safetensors", "samples-baseline"),
                "warmup_steps": WARMUP_STEPS,
                "measure_steps": MEASURE_STEPS,
                "repeats": REPEATS,
                "samples_per_step": BATCH,
                "label": "baseline",
                "contract": _contract(0),
                "environment_id": evidence["environment"],
                "reason": "demo baseline",
            },
            windows,
        )
        evidence["baseline"] = base["evidence_id"]

        profile = await call(
            "3. Profile a short segment: where does step time go?",
            "profile_segment",
            {
                "mode": "run",
                "command": _command(0, "profile.safetensors", "samples-profile"),
                "top_k": 5,
            },
            ("profiled", "warnings"),
        )
        evidence["profile"] = profile["evidence_id"]
        say(
            "   The data-loader wait dominates the step (data_wait_fraction above): hypothesis: decode in "
            "DataLoader workers so it overlaps training. One change: num_workers 0 -> 2."
        )

        cand = await call(
            "4. Candidate: the same job with num_workers=2",
            "run_benchmark_window",
            {
                "command": _command(2, "cand.safetensors", "samples-candidate"),
                "warmup_steps": WARMUP_STEPS,
                "measure_steps": MEASURE_STEPS,
                "repeats": REPEATS,
                "samples_per_step": BATCH,
                "label": "candidate",
                "contract": _contract(2),
                "environment_id": evidence["environment"],
                "reason": "demo candidate",
            },
            windows,
        )
        evidence["candidate"] = cand["evidence_id"]

        comp = await call(
            "5. Compare: same invariants, only the declared change, noise-aware verdict",
            "compare_benchmarks",
            {
                "baseline": [evidence["baseline"]],
                "candidate": [evidence["candidate"]],
                "declared_changes": ["workers"],
            },
            ("status", "verdict", "speedup", "ci_low", "ci_high", "warnings"),
        )
        evidence["comparison"] = comp["evidence_id"]

        parity = await call(
            "6. Correctness: weights and loss after 8 steps, bit-for-bit",
            "compare_tensors",
            {"reference": "ref.safetensors", "candidate": "cand.safetensors", "atol": 0.0, "rtol": 0.0},
            ("status", "summary"),
        )
        evidence["correctness"] = parity["evidence_id"]

        audit = await call(
            "7. The change touches data loading: did the candidate see every sample once?",
            "audit_samples",
            {
                "observed": "samples-candidate",
                "expected_range": [0, BATCH * (WARMUP_STEPS + MEASURE_STEPS)],
                "world_size": 1,
            },
            ("status", "coverage", "findings"),
        )
        evidence["audit"] = audit["evidence_id"]

        opened = await call(
            "8. Record the experiment",
            "record_decision",
            {
                "action": "open",
                "hypothesis": "decoding in 2 DataLoader workers overlaps data loading with training",
                "classification": "system_optimization",
                "changed_variable": "DataLoader num_workers 0 -> 2",
                "touches_data": True,
                "evidence": [
                    {"id": evidence["environment"], "role": "environment"},
                    {"id": evidence["baseline"], "role": "baseline"},
                    {"id": evidence["profile"], "role": "profile"},
                ],
            },
            ("experiment_id",),
        )
        exp_id = str(opened["experiment_id"])
        decided = await call(
            "9. Decide: keep (the gates check the ledger, not the claim)",
            "record_decision",
            {
                "action": "decide",
                "experiment_id": exp_id,
                "decision": "keep",
                "rationale": "faster beyond noise with bit-identical weights and full sample coverage",
                "rollback": "run the training command with --num-workers 0 again",
                "evidence": [
                    {"id": evidence["candidate"], "role": "candidate"},
                    {"id": evidence["comparison"], "role": "comparison"},
                    {"id": evidence["correctness"], "role": "correctness"},
                    {"id": evidence["audit"], "role": "audit"},
                ],
            },
            ("accepted", "label"),
        )
        for gate in decided["gates"]:
            say(f"   gate {gate['name']:<18} {gate['status']:<15} {gate['reason']}")

    decisions = (workspace / str(decided["decisions_md"])).read_text(encoding="utf-8")
    say("\n== decisions.md\n" + decisions)
    speedup = comp.get("speedup")
    return DemoResult(
        workspace=workspace,
        experiment_id=exp_id,
        accepted=bool(decided["accepted"]),
        speedup=float(speedup) if isinstance(speedup, (int, float)) else None,
        decisions_md=decisions,
        evidence=evidence,
    )


def run_demo(workspace: Path | None = None, say: Callable[[str], None] = print) -> DemoResult:
    """Run the demo in ``workspace`` (a new temporary directory when None) and return what it produced."""
    import anyio

    if workspace is None:
        workspace = Path(tempfile.mkdtemp(prefix="perfgate-demo-"))
    workspace.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("train.py"), workspace / SCRIPT)
    (workspace / "perfgate.toml").write_text(_policy(sys.executable), encoding="utf-8")
    say(f"perfgate demo in {workspace} (an allowlist for the demo's own commands is in perfgate.toml)")

    async def main() -> DemoResult:
        return await _demo(workspace, say)

    return anyio.run(main)
