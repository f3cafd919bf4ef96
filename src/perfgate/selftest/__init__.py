"""`perfgate selftest`: does perfgate measure this machine's accelerator correctly?

The selftest makes a temporary workspace holding its workload (``job.py``) and an operator allowlist
for exactly the commands it runs, then drives perfgate's real tools over MCP in memory, on the device
the training interpreter (this interpreter) sees:

1. ``run_benchmark_window`` on a small training job: the window's step times (device events where the
   device has them) against the job's own synchronized wall clock over the same steps; peak allocated
   and reserved memory against a ballast allocation of known size.
2. ``collect_env`` on the same interpreter: backend, devices, runtime and driver versions against what
   torch reported inside the job.
3. ``run_benchmark_window`` (explicit timing) on a matmul loop of known FLOPs, then ``compute_mfu``:
   measured TFLOP/s, the peak table's entry for this device and precision, the utilization.
4. ``profile_segment`` on the training job (under torchrun on 2 devices when there are 2+): kernels,
   copies, a collective, and a temporal breakdown consistent with the window.
5. ``compare_tensors`` on bf16 (and fp8) dumps the job wrote: host reference vs device, and a
   negative control that must fail.

Each check ends pass, fail or unavailable (with the reason); the result is one ``selftest`` ledger
record citing the tools' records, and a short report. Nothing is simulated: a check that cannot run
here says so.
"""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from perfgate.hardware.peaks import PeakLookupError, lookup_peak
from perfgate.selftest.checks import (
    Check,
    environment_check,
    matmul_check,
    memory_check,
    obj,
    parity_check,
    profile_check,
    step_time_check,
    strings,
    window_steps_ms,
)

__all__ = ["DEVICES", "SelftestError", "SelftestResult", "run_selftest"]

Device = Literal["auto", "cuda", "rocm", "musa", "cpu"]
DEVICES: tuple[Device, ...] = ("auto", "cuda", "rocm", "musa", "cpu")
SCRIPT = "selftest_job.py"
OUT = "selftest-out"
EXIT_NO_DEVICE = 3
PROFILE_STEPS = 20
"""Steps the profiled job may run; the harness stops it once the profiler schedule is done."""


class SelftestError(RuntimeError):
    """The selftest could not run at all (the requested device is absent, a tool crashed)."""


@dataclass(frozen=True)
class _Plan:
    """Sizes of the workloads: small on the host, large enough on a device to be measurable."""

    train_warmup: int
    train_measure: int
    train_batch: int
    train_width: int
    ballast_mib: int
    mm_n: int
    mm_reps: int
    mm_warmup: int
    mm_measure: int
    mm_dtype: str
    profile_active: int


def _plan(kind: str, quick: bool) -> _Plan:
    if kind == "cpu":
        # Steps cost milliseconds next to a launch's seconds: a long window keeps the 5% tolerance well
        # above one scheduler time slice on a busy host.
        return _Plan(3, 100 if quick else 200, 64, 256, 8, 256, 4, 2, 10 if quick else 20, "fp32", 3)
    return _Plan(
        5,
        100 if quick else 300,
        256,
        1024,
        64 if quick else 256,
        4096 if quick else 8192,
        4,
        3,
        10 if quick else 20,
        "bf16",
        3 if quick else 5,
    )


@dataclass
class SelftestResult:
    workspace: Path
    device: str
    checks: list[Check]
    evidence: dict[str, str]
    record_id: str
    report: str
    passed: bool = field(default=False)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def _policy(rules: list[tuple[str, list[str], bool]], script_sha256: str, code_state: str) -> str:
    """Rules on the user's command (perfgate's harness wrapper is not part of what a rule matches), each
    pinned to the bundled job's content and the temporary workspace's code state."""
    from perfgate.execution.target import user_argv

    lines = [
        "# Written by `perfgate selftest` for its own temporary workspace: exactly its own commands.",
        "[execution]",
        "max_timeout_s = 900",
        'allow_env = ["PERFGATE_*"]',
        "",
    ]
    for name, argv, exact in rules:
        lines += [
            "[[execution.allow]]",
            f"name = {json.dumps(name)}",
            f"script = {json.dumps(SCRIPT)}",
            f"sha256 = {json.dumps(script_sha256)}",
            f"code_state = {json.dumps(code_state)}",
            "argv = [" + ", ".join(json.dumps(glob.escape(tok)) for tok in user_argv(argv)) + "]",
            f"exact = {'true' if exact else 'false'}",
            "",
        ]
    return "\n".join(lines)


def _train_cmd(device: str, plan: _Plan, out: str, *, dump: bool, clock: bool, steps: int) -> list[str]:
    cmd = [
        sys.executable,
        SCRIPT,
        "train",
        "--device",
        device,
        "--out",
        out,
        "--steps",
        str(steps),
        "--batch",
        str(plan.train_batch),
        "--width",
        str(plan.train_width),
        "--ballast-mib",
        str(plan.ballast_mib),
    ]
    if dump:
        cmd.append("--dump")
    if clock:
        cmd += ["--clock", "clock.json"]
    return cmd


def _matmul_cmd(device: str, plan: _Plan) -> list[str]:
    return [
        sys.executable,
        SCRIPT,
        "matmul",
        "--device",
        device,
        "--out",
        f"{OUT}/matmul",
        "--steps",
        str(plan.mm_warmup + plan.mm_measure + 5),
        "--n",
        str(plan.mm_n),
        "--reps",
        str(plan.mm_reps),
        "--dtype",
        plan.mm_dtype,
    ]


def _torchrun(cmd: list[str], nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *cmd[1:],
    ]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj(value) or None


class _Session:
    def __init__(self, client: Any, workspace: Path, say: Callable[[str], None]) -> None:
        self.client = client
        self.workspace = workspace
        self.say = say
        self.evidence: dict[str, str] = {}

    async def call(self, role: str, tool: str, args: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """(structured output, text); output is None when the tool answered with an error."""
        started = time.monotonic()
        result = await self.client.call_tool(tool, args)
        self.say(f"-> {tool}: {role} ({time.monotonic() - started:.1f} s)")
        text = " ".join(getattr(c, "text", "") for c in result.content)
        if result.is_error or result.structured_content is None:
            return None, text
        out: dict[str, Any] = result.structured_content
        if "evidence_id" in out:
            self.evidence[role] = str(out["evidence_id"])
        return out, text

    def artifact(self, out: dict[str, Any], suffix: str) -> Path | None:
        for rel in strings(out.get("artifacts")):
            if str(rel).endswith(suffix):
                return self.workspace / str(rel)
        return None


def _window_args(
    cmd: list[str], warmup: int, measure: int, batch: int | None, label: str, timing: str
) -> dict[str, Any]:
    args: dict[str, Any] = {
        "command": cmd,
        "warmup_steps": warmup,
        "measure_steps": measure,
        "repeats": 1,
        "timing": timing,
        "label": label,
        "timeout_s": 600.0,
        "reason": f"perfgate selftest: {label}",
    }
    if batch is not None:
        args["samples_per_step"] = batch
        args["contract"] = {
            "invariants": {"global_batch": batch, "model": "selftest-mlp"},
            "execution": {"microbatch": batch, "accumulation": 1, "data_parallel": 1},
        }
    return args


async def _run(
    workspace: Path, device: str, quick: bool, say: Callable[[str], None], policy: Path
) -> SelftestResult:
    from mcp import Client

    from perfgate.security.trustroot import TrustRoot
    from perfgate.server import build_server
    from perfgate.serving.config import ServerConfig

    server = build_server(ServerConfig.create(workspace, trust=TrustRoot.locate(policy=policy)))
    checks: list[Check] = []
    error: SelftestError | None = None
    kind = "unknown"
    facts: dict[str, Any] = {}
    async with Client(server) as client:
        s = _Session(client, workspace, say)
        try:
            # 1. The environment, probed by collect_env in this same interpreter; it also sizes the workloads.
            env, env_text = await s.call("environment", "collect_env", {})
            backend = str(obj(obj(env).get("summary")).get("backend") or "cpu")
            expected = backend if device == "auto" else device
            # collect_env also knows backends the job does not drive (xpu): those run on the host.
            plan = _plan("device" if expected in ("cuda", "rocm", "musa") else "cpu", quick)

            # 2. The training window. Its job also reports what torch sees and writes the parity dumps.
            train_out = f"{OUT}/train"
            steps = plan.train_warmup + plan.train_measure + 5
            train_cmd = _train_cmd(device, plan, train_out, dump=True, clock=True, steps=steps)
            window, text = await s.call(
                "training window",
                "run_benchmark_window",
                _window_args(
                    train_cmd,
                    plan.train_warmup,
                    plan.train_measure,
                    plan.train_batch,
                    "selftest-train",
                    "harness",
                ),
            )
            found = _read_json(workspace / train_out / "facts.json")
            if found is not None and "error" in found:
                raise SelftestError(f"device {device!r} is not usable here: {found['error']}")
            if window is None or found is None:
                raise SelftestError(f"the training window did not run: {text or 'no facts from the job'}")
            facts = found
            kind = str(facts["kind"])
            plan = _plan("cpu" if kind == "cpu" else "device", quick)  # what the job actually runs on
            clock = _read_json(workspace / train_out / "clock.json") or {}
            record_path = s.artifact(window, "launch0_rank0.json")
            record = _read_json(record_path) if record_path else None
            window_steps: list[float] | None = None
            if window.get("state") == "failed" or record is None:
                why = window.get("failure_reason") or "no harness record"
                checks.append(Check("step_time", "fail", reason=f"run_benchmark_window failed: {why}"))
                checks.append(Check("memory", "fail", reason=f"run_benchmark_window failed: {why}"))
            else:
                checks.append(step_time_check(record, clock))
                checks.append(memory_check(window["ranks"][0], clock, kind))
                window_steps = window_steps_ms(record)
            if env is None:
                checks.append(Check("environment", "fail", reason=f"collect_env failed: {env_text}"))
            else:
                checks.append(environment_check(env, facts))

            # 3. The known-FLOP matmul loop and the peak table.
            mm_window, text = await s.call(
                "matmul window",
                "run_benchmark_window",
                _window_args(
                    _matmul_cmd(device, plan),
                    plan.mm_warmup,
                    plan.mm_measure,
                    None,
                    "selftest-matmul",
                    "explicit",
                ),
            )
            spec = _read_json(workspace / OUT / "matmul" / "matmul.json")
            if mm_window is None or spec is None or mm_window.get("state") == "failed":
                why = (mm_window or {}).get("failure_reason") or text or "no matmul.json from the job"
                checks.append(Check("matmul", "fail", reason=f"the matmul window failed: {why}"))
            else:
                median = mm_window.get("median_step_ms")
                names = strings(facts.get("device_names"))
                name = (
                    str(names[0])
                    if names and kind != "cpu"
                    else str((env or {}).get("summary", {}).get("cpu_model") or "cpu")
                )
                mfu: dict[str, Any] | None = None
                refusal: str | None = None
                try:
                    lookup_peak(name, spec["dtype"])
                except PeakLookupError as exc:
                    # compute_mfu would refuse with this same message; asking it adds nothing but noise.
                    refusal = str(exc).split(" (known:")[0].split(". ")[0]
                if median and refusal is None:
                    mfu, refusal = await s.call(
                        "utilization",
                        "compute_mfu",
                        {
                            "buckets": [
                                {
                                    "name": "matmul",
                                    "flops_per_step": float(spec["flops_per_step"]),
                                    "step_time_s": median / 1e3,
                                }
                            ],
                            "flops_kind": "hardware",
                            "device": name,
                            "precision": spec["dtype"],
                        },
                    )
                checks.append(matmul_check(spec, median, mfu, refusal, name))

            # 4. A short profile of the same training job (2 ranks when there are 2+ devices).
            world = 2 if kind != "cpu" and int(facts.get("device_count", 0)) >= 2 else 1
            prof_cmd = _train_cmd(
                device, plan, f"{OUT}/profile", dump=False, clock=False, steps=PROFILE_STEPS
            )
            if world > 1:
                prof_cmd = _torchrun(prof_cmd, world)
            profile, text = await s.call(
                "profile",
                "profile_segment",
                {
                    "mode": "run",
                    "command": prof_cmd,
                    "skip_first": 1,
                    "warmup": 1,
                    "active": plan.profile_active,
                    "top_k": 20,
                    "timeout_s": 600.0,
                    "reason": "perfgate selftest: profile capture",
                },
            )
            if profile is None:
                checks.append(Check("profile", "fail", reason=f"profile_segment failed: {text}"))
            else:
                checks.append(profile_check(profile, window_steps, kind, world))

            # 5. Parity of the dumps through compare_tensors.
            parity = obj(facts.get("parity"))
            ref, dev = f"{train_out}/bf16-ref.safetensors", f"{train_out}/bf16-dev.safetensors"
            tolerances = {
                "atol": 3e-2,
                "rtol": 1.6e-2,
                "overrides": [{"pattern": "exact", "atol": 0.0, "rtol": 0.0}],
                "allow_dtype_change": True,
            }
            bf16, text = await s.call(
                "bf16 parity", "compare_tensors", {"reference": ref, "candidate": dev, **tolerances}
            )
            control, _ = await s.call(
                "bf16 negative control",
                "compare_tensors",
                {"reference": ref, "candidate": f"{train_out}/bf16-control.safetensors", **tolerances},
            )
            checks.append(parity_check("parity_bf16", bf16, control))
            if bf16 is None:
                checks[-1].reason = f"compare_tensors failed: {text}"
            if parity.get("fp8"):
                fp8, text = await s.call(
                    "fp8 parity",
                    "compare_tensors",
                    {
                        "reference": f"{train_out}/fp8-ref.safetensors",
                        "candidate": f"{train_out}/fp8-dev.safetensors",
                        "atol": 0.0,
                        "rtol": 0.0,
                    },
                )
                checks.append(parity_check("parity_fp8", fp8, None))
                if fp8 is None:
                    checks[-1].reason = f"compare_tensors failed: {text}"
            else:
                checks.append(
                    parity_check("parity_fp8", None, None, str(parity.get("fp8_reason") or "not attempted"))
                )
        except SelftestError as exc:
            # Raised out of the client's task group it would arrive wrapped in an exception group.
            error = exc
    if error is not None:
        raise error
    return _finish(workspace, device, quick, kind, facts, checks, s.evidence)


def _label(kind: str, facts: dict[str, Any]) -> str:
    names = strings(facts.get("device_names"))
    if kind == "cpu" or not names:
        return kind
    count = len(names)
    return f"{kind} ({count} x {names[0]})" if count > 1 else f"{kind} ({names[0]})"


_MARK = {"pass": "PASS", "fail": "FAIL", "unavailable": "N/A "}


def format_report(device: str, quick: bool, facts: dict[str, Any], checks: list[Check]) -> str:
    failed = [c for c in checks if c.status == "fail"]
    passed = [c for c in checks if c.status == "pass"]
    na = [c for c in checks if c.status == "unavailable"]
    verdict = "FAIL" if failed else "PASS"
    lines = [
        f"perfgate selftest {verdict} on {device}{' (quick)' if quick else ''}, torch {facts.get('torch_version')}: "
        f"{len(passed)} passed, {len(failed)} failed, {len(na)} unavailable"
    ]
    for c in checks:
        lines.append(f"{_MARK[c.status]}  {c.name:<12} {c.figure}".rstrip())
        if c.against:
            lines.append(f"      {'':<12} vs {c.against}")
        if c.reason:
            lines.append(f"      {'':<12} {'why' if c.status != 'pass' else 'note'}: {c.reason}")
        note = c.values.get("note")
        if note:
            lines.append(f"      {'':<12} note: {note}")
    return "\n".join(lines)


def _finish(
    workspace: Path,
    device: str,
    quick: bool,
    kind: str,
    facts: dict[str, Any],
    checks: list[Check],
    evidence: dict[str, str],
) -> SelftestResult:
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

    label = _label(kind, facts)
    report = format_report(label, quick, facts, checks)
    passed = not any(c.status == "fail" for c in checks)
    ledger = Ledger(workspace)
    record_id = Ledger.new_id()
    folder = ledger.artifact_dir(record_id)
    result: dict[str, Any] = {
        "passed": passed,
        "device": label,
        "kind": kind,
        "requested_device": device,
        "quick": quick,
        "torch": facts,
        "checks": [c.to_json() for c in checks],
        "evidence": evidence,
    }
    (folder / "selftest.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    (folder / "report.txt").write_text(report + "\n", encoding="utf-8")
    ledger.append(
        EvidenceDraft(
            id=record_id,
            tool="selftest",
            state=EvidenceState.PASSED if passed else EvidenceState.FAILED,
            inputs={"device": device, "quick": quick},
            result=json.loads(json.dumps(result, default=str)),
            environment_id=evidence.get("environment"),
            artifact_names=["selftest.json", "report.txt"],
        )
    )
    return SelftestResult(workspace, label, checks, evidence, record_id, report, passed)


def _commands(device: str, quick: bool) -> list[tuple[str, list[str]]]:
    """Every launch the selftest may make (as the tools will run them), for both workload sizes; the
    harness entry is a stand-in (rules see the user's command, without it)."""
    from perfgate.benchmarking.windows.launch import wrap_command
    from perfgate.execution.target import HARNESS_ENTRY

    entry = Path("/harness") / HARNESS_ENTRY

    out: list[tuple[str, list[str]]] = []
    for size in ("cpu", "device"):
        plan = _plan(size, quick)
        steps = plan.train_warmup + plan.train_measure + 5
        train = _train_cmd(device, plan, f"{OUT}/train", dump=True, clock=True, steps=steps)
        profile = _train_cmd(device, plan, f"{OUT}/profile", dump=False, clock=False, steps=PROFILE_STEPS)
        out += [
            (f"selftest training window ({size} sizes)", wrap_command(train, entry)),
            (f"selftest matmul loop ({size} sizes)", _matmul_cmd(device, plan)),
            (f"selftest profile ({size} sizes)", wrap_command(profile, entry)),
        ]
        if device != "cpu" and size == "device":
            out.append(
                (f"selftest profile on 2 ranks ({size} sizes)", wrap_command(_torchrun(profile, 2), entry))
            )
    return out


def _write_workspace(workspace: Path, device: str, quick: bool) -> Path:
    """Copy the job in and write its allowlist (operator configuration: outside the workspace); returns
    the policy file."""
    shutil.copyfile(Path(__file__).with_name("job.py"), workspace / SCRIPT)
    # The allowlist names each command exactly (no extra argument matches): nothing else runs unasked.
    rules = [(name, argv, True) for name, argv in _commands(device, quick)]
    policy = Path(tempfile.mkdtemp(prefix="perfgate-selftest-policy-")) / "policy.toml"
    digest = hashlib.sha256((workspace / SCRIPT).read_bytes()).hexdigest()
    from perfgate.envprobe.provenance import code_state

    policy.write_text(_policy(rules, digest, code_state(workspace).digest), encoding="utf-8")
    return policy


def run_selftest(
    device: str = "auto",
    quick: bool = False,
    workspace: Path | None = None,
    say: Callable[[str], None] = print,
) -> SelftestResult:
    """Run every check on ``device`` in ``workspace`` (a new temporary directory when None).

    Raises:
        SelftestError: the device asked for is not usable here, or the first launch failed outright.
    """
    import anyio

    if device not in DEVICES:
        raise SelftestError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if workspace is None:
        workspace = Path(tempfile.mkdtemp(prefix="perfgate-selftest-"))
    workspace.mkdir(parents=True, exist_ok=True)
    policy = _write_workspace(workspace, device, quick)
    say(f"perfgate selftest in {workspace} (device {device}{', quick' if quick else ''})")

    async def main() -> SelftestResult:
        return await _run(workspace, device, quick, say, policy)

    return anyio.run(main)
