"""`perfgate demo`: the whole loop on a tiny CPU training job, through the real tools over MCP.

The demo makes a temporary workspace holding the bundled training script (`train.py`: an MLP whose
DataLoader decodes samples slowly) and an operator allowlist for exactly the commands the demo runs,
then drives an in-process MCP client through: environment -> baseline windows -> profile -> the change
(DataLoader workers 0 -> 4) -> candidate windows -> comparison -> tensor parity -> sample audit ->
decision, printing what an agent would see, and ending with the decisions.md it produced.

The change is large against noise: each batch waits ``DECODE_MS`` per sample in the loader (one wait
per batch), several times the training step, so four workers cut the step time 2-4x even on a busy
2-core machine. Nothing
perfgate does lands in a measured window (the tensor dump is taken in the warm-up). Should the
comparison still come out inside the noise, the demo records an ``inconclusive`` decision, says what it
would do next, and succeeds: only a refused or failed step is a failure.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

__all__ = ["DemoError", "DemoResult", "run_demo"]

WARMUP_STEPS = 5
MEASURE_STEPS = 30
"""Steps per measured window: 2 s of baseline steps, ~0.5 s of candidate steps. A demo's wall time is
mostly its eight interpreter launches (each imports torch, and its first optimizer imports
torch._dynamo: ~5 CPU-seconds a launch), so longer windows buy little and cost wall time under load."""
BATCH = 16
REPEATS = 3
DECODE_MS = 4.0
"""Loader wait per sample: 64 ms a batch against a training step of a few ms."""
DUMP_STEP = 3
"""The parity dump is taken in step DUMP_STEP - 1, inside the warm-up, never in a measured window."""
WORKERS = 4
"""Loader workers in the candidate: the decode waits rather than computes, so 4 overlap it ~4x even on
a 2-core machine (the training step, not the cores, then bounds the speedup)."""
SCRIPT = "train.py"


class DemoError(Exception):
    """A demo step failed or was refused; the message says which and what to look at."""

    workspace: Path | None = None


@dataclass
class DemoResult:
    workspace: Path
    experiment_id: str
    decision: str
    """keep, or inconclusive when the comparison could not tell the change from noise."""
    accepted: bool
    """The keep was accepted by the gates (False for an inconclusive decision)."""
    speedup: float | None
    verdict: str | None
    decisions_md: str
    evidence: dict[str, str]


def _policy(python: str, script_sha256: str, code_state: str) -> str:
    """Allowlist the demo's own launches only: its train.py, pinned to the bundled content and to the
    workspace's code state, run by the interpreter in use (the harness wrapper is not part of what a rule
    matches)."""
    return (
        "# Written by `perfgate demo` for its own temporary workspace.\n"
        "[execution]\n"
        "max_timeout_s = 600\n"
        'allow_env = ["PERFGATE_*"]\n\n'
        "[[execution.allow]]\n"
        'name = "the demo training script"\n'
        f'script = "{SCRIPT}"\n'
        f'sha256 = "{script_sha256}"\n'
        f'code_state = "{code_state}"\n'
        f"argv = [{json.dumps(python)}]\n"
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
        "--decode-ms",
        str(DECODE_MS),
        "--dump",
        dump,
        "--dump-step",
        str(DUMP_STEP),
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


async def _demo(workspace: Path, say: Callable[[str], None], policy: Path) -> DemoResult:
    from mcp import Client

    from perfgate.security.trustroot import TrustRoot
    from perfgate.server import build_server
    from perfgate.serving.config import ServerConfig

    evidence: dict[str, str] = {}
    server = build_server(ServerConfig.create(workspace, trust=TrustRoot.locate(policy=policy)))

    async with Client(server) as client:

        async def call(step: str, tool: str, args: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
            say(f"\n== {step}\n-> {tool}({', '.join(sorted(args))})")
            result = await client.call_tool(tool, args)
            text = " ".join(getattr(c, "text", "") for c in result.content)
            if result.is_error or result.structured_content is None:
                raise DemoError(f"{step.split(':')[0]}: {tool} failed: {text.strip()}")
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
            "warnings",
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
            f"DataLoader workers so it overlaps training. One change: num_workers 0 -> {WORKERS}."
        )

        opened = await call(
            "4. Open the experiment before any candidate evidence exists",
            "record_decision",
            {
                "action": "open",
                "hypothesis": f"decoding in {WORKERS} DataLoader workers overlaps data loading with training",
                "classification": "system_optimization",
                "changed_variable": f"DataLoader num_workers 0 -> {WORKERS}",
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

        cand = await call(
            f"5. Candidate: the same job with num_workers={WORKERS}",
            "run_benchmark_window",
            {
                "command": _command(WORKERS, "cand.safetensors", "samples-candidate"),
                "warmup_steps": WARMUP_STEPS,
                "measure_steps": MEASURE_STEPS,
                "repeats": REPEATS,
                "samples_per_step": BATCH,
                "label": "candidate",
                "contract": _contract(WORKERS),
                "environment_id": evidence["environment"],
                "reason": "demo candidate",
            },
            windows,
        )
        evidence["candidate"] = cand["evidence_id"]

        comp = await call(
            "6. Compare: same invariants, only the declared change, noise-aware verdict",
            "compare_benchmarks",
            {
                "baseline": [evidence["baseline"]],
                "candidate": [evidence["candidate"]],
                # each side writes its own dump and sample log: those argv paths differ too
                "declared_changes": ["workers", "argv"],
            },
            ("status", "verdict", "speedup", "ci_low", "ci_high", "warnings"),
        )
        evidence["comparison"] = comp["evidence_id"]

        parity = await call(
            f"7. Correctness: weights and loss of step {DUMP_STEP} (dumped in the warm-up), bit-for-bit",
            "compare_tensors",
            {"reference": "ref.safetensors", "candidate": "cand.safetensors", "atol": 0.0, "rtol": 0.0},
            ("status", "summary"),
        )
        evidence["correctness"] = parity["evidence_id"]

        audit = await call(
            "8. The change touches data loading: did the candidate see every sample once?",
            "audit_samples",
            {
                "observed": "samples-candidate",
                "expected_range": [0, BATCH * (WARMUP_STEPS + MEASURE_STEPS)],
                "world_size": 1,
            },
            ("status", "coverage", "findings"),
        )
        evidence["audit"] = audit["evidence_id"]

        after = [
            {"id": evidence["candidate"], "role": "candidate"},
            {"id": evidence["comparison"], "role": "comparison"},
            {"id": evidence["correctness"], "role": "correctness"},
            {"id": evidence["audit"], "role": "audit"},
        ]
        verdict = comp.get("verdict")
        if verdict == "improved":
            decision = "keep"
            decided = await call(
                "9. Decide: keep (the gates check the ledger, not the claim)",
                "record_decision",
                {
                    "action": "decide",
                    "experiment_id": exp_id,
                    "decision": "keep",
                    "rationale": "faster beyond noise with bit-identical weights and full sample coverage",
                    "rollback": "run the training command with --num-workers 0 again",
                    "evidence": after,
                },
                ("accepted", "label"),
            )
        else:
            decision = "inconclusive"
            decided = await call(
                f"9. Decide: inconclusive (the comparison says {verdict}, not improved)",
                "record_decision",
                {
                    "action": "decide",
                    "experiment_id": exp_id,
                    "decision": "inconclusive",
                    "rationale": f"compare_benchmarks verdict {verdict}: the speedup is not beyond the noise "
                    "measured on this machine; the change is kept out until it is",
                    "evidence": after,
                },
                ("accepted", "label"),
            )
            say(
                "   Next: re-measure both sides with more repeats (repeats=6) on a quieter machine, then "
                "compare again.\n   If the interval still includes 1.0, decide 'revert': the change "
                "did not pay for itself here."
            )
        for gate in decided.get("gates", []):
            say(f"   gate {gate['name']:<18} {gate['status']:<15} {gate['reason']}")

    decisions = (workspace / str(decided["decisions_md"])).read_text(encoding="utf-8")
    say("\n== decisions.md\n" + decisions)
    speedup = comp.get("speedup")
    return DemoResult(
        workspace=workspace,
        experiment_id=exp_id,
        decision=decision,
        accepted=decision == "keep" and bool(decided["accepted"]),
        speedup=float(speedup) if isinstance(speedup, (int, float)) else None,
        verdict=str(verdict) if verdict is not None else None,
        decisions_md=decisions,
        evidence=evidence,
    )


def run_demo(workspace: Path | None = None, say: Callable[[str], None] = print) -> DemoResult:
    """Run the demo in ``workspace`` (a new temporary directory when None) and return what it produced.

    Raises:
        DemoError: a step failed or the keep was refused (the message names the step and the tool's answer).
    """
    import anyio

    if workspace is None:
        workspace = Path(tempfile.mkdtemp(prefix="perfgate-demo-"))
    workspace.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("train.py"), workspace / SCRIPT)
    # The allowlist is operator configuration: it lives outside the workspace, like a real one.
    policy = Path(tempfile.mkdtemp(prefix="perfgate-demo-policy-")) / "policy.toml"
    digest = hashlib.sha256((workspace / SCRIPT).read_bytes()).hexdigest()
    from perfgate.envprobe.provenance import code_state

    policy.write_text(_policy(sys.executable, digest, code_state(workspace).digest), encoding="utf-8")
    say(
        f"perfgate demo in {workspace} (the allowlist for its own {SCRIPT}, pinned by sha256, is in {policy})"
    )

    async def main() -> DemoResult:
        return await _demo(workspace, say, policy)

    try:
        return anyio.run(main)
    except DemoError as exc:
        exc.workspace = workspace
        raise
    except Exception as exc:  # the MCP client's task group wraps what the demo raised in a group
        error = next((e for e in _leaves(exc) if isinstance(e, DemoError)), None)
        if error is None:
            raise
        error.workspace = workspace
        raise error from None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, depth first (``exc`` itself when it is no group)."""
    inner: object = getattr(exc, "exceptions", None)
    if not isinstance(inner, (list, tuple)):
        return [exc]
    found: list[BaseException] = []
    for e in cast("Sequence[BaseException]", inner):
        found.extend(_leaves(e))
    return found
