"""The keep's backend gate (issue 45 item 2): a change that names a MoE dispatcher backend or CUDA graphs is
kept only when the server's trace of the candidate's own command shows that backend ran and graphs replayed.

The training runs for real (a tiny CPU script under profile_segment). What this machine cannot produce is
the GPU's activity: where a test needs DeepEP kernels or NCCL all-to-all kernels, the captured trace is
replaced by a hand-written Kineto trace (tests/fixtures/traces/backends, README there) before the server
analyses it, standing in for the device. Benchmark windows are written as run_benchmark_window writes them
(as the other gate tests do), bound to the same command and code as the profiled runs.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _trust import operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import profile_segment
from perfgate.traces.analyses.backends import exchange_of
from test_evidence_gate import window
from test_record_decision import _open, _shown_gate, _text

pytestmark = pytest.mark.anyio

PY = sys.executable
FIXTURES = Path(__file__).parent / "fixtures" / "traces" / "backends"
TRAIN = """\
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
args, _ = p.parse_known_args()  # the MoE flags are the real job's; this stand-in trains the same either way
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for _ in range(args.steps):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""
BASE_ARGS = ["--moe-token-dispatcher-type", "alltoall"]
CAND_ARGS = [
    "--moe-token-dispatcher-type",
    "flex",
    "--moe-flex-dispatcher-backend",
    "deepep",
    "--enable-cuda-graph",
]

LOGGED = {
    "enable_cuda_graph": "True",
    "moe_flex_dispatcher_backend": "deepep",
    "moe_token_dispatcher_type": "flex",
}
"""What the candidate windows' stdout listed (run_benchmark_window's ``logged_settings``)."""
LOG_SAYS = (
    "the candidate's log says enable_cuda_graph=True, moe_flex_dispatcher_backend=deepep, "
    "moe_token_dispatcher_type=flex (dispatcher deepep, graphs on): what the job was told, not what ran"
)

_ANALYZE = profile_segment.analyze_paths


@pytest.fixture(autouse=True)
def registry_with_profile_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    if profile_segment.SPEC not in perfgate.tools.REGISTRY:
        monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, profile_segment.SPEC))


def _device_plays(monkeypatch: pytest.MonkeyPatch, fixture: str | None) -> None:
    """The GPU boundary: each trace the CPU run captured is replaced by ``fixture`` before the server
    analyses it (None: the CPU run's own trace is analysed)."""

    async def analyze(paths: list[Path], *args: Any) -> Any:
        if fixture is not None:
            for path in paths:
                path.write_bytes(gzip.compress((FIXTURES / fixture).read_bytes()))
        return await _ANALYZE(paths, *args)

    monkeypatch.setattr(profile_segment, "analyze_paths", analyze)


async def _profile(client: Client, argv: list[str]) -> dict[str, Any]:
    args = {"mode": "run", "command": argv, "skip_first": 1, "warmup": 1, "active": 2, "timeout_s": 300,
            "with_stack": False, "with_modules": False}  # fmt: skip
    result = await client.call_tool("profile_segment", args)
    out = result.structured_content
    assert out is not None and out["state"] == "executed", _text(result)
    return out


async def _backend(client: Client, exp: str, comparison: str) -> dict[str, Any]:
    return await _shown_gate(client, exp, comparison, "backend")


def test_kernel_names_map_to_their_exchange_family() -> None:
    assert exchange_of("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)") == "deepep"
    assert exchange_of("void hybrid_ep::dispatch_kernel<128>(int)") == "hybridep"
    assert exchange_of("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "alltoall"
    assert exchange_of("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*)") == "allgather"
    # an all-gather that is no collective kernel, and a GEMM, are no exchange
    assert exchange_of("triton_poi_fused_all_gather_copy_0") is None
    assert exchange_of("sm90_xmma_gemm_bf16bf16_bf16f32") is None


async def test_the_trace_analysis_names_graph_replays_and_the_exchange_backend(workspace: Path) -> None:
    folder = workspace / "traces"
    folder.mkdir()
    for name in ("deepep_graphs_rank0.json", "nccl_alltoall_rank0.json"):
        (folder / name).write_bytes((FIXTURES / name).read_bytes())
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        deepep = await client.call_tool("analyze_trace", {"trace_paths": ["traces/deepep_graphs_rank0.json"]})
        nccl = await client.call_tool("analyze_trace", {"trace_paths": ["traces/nccl_alltoall_rank0.json"]})
    assert deepep.structured_content is not None and nccl.structured_content is not None, _text(deepep)
    seen = deepep.structured_content["ranks"][0]["backends"]
    assert seen["graph_launches"] == 2 and seen["graph_launch_calls"] == ["cudaGraphLaunch"]
    assert seen["dispatcher"] == "deepep"
    (family,) = seen["token_exchange"]
    assert family["kernels"] == 6 and family["names"][0].startswith("void deep_ep::intranode::")
    seen = nccl.structured_content["ranks"][0]["backends"]
    assert seen["graph_launches"] == 0 and seen["dispatcher"] == "alltoall"
    assert seen["token_exchange"][0]["names"] == ["ncclDevKernel_SendRecv"]


@pytest.mark.slow
async def test_a_backend_change_is_kept_only_on_a_trace_of_the_candidate_that_shows_it(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    (workspace / "train.py").write_text(TRAIN)
    operator_policy(
        f'[execution]\n\n[[execution.allow]]\nscript = {json.dumps(str(workspace / "train.py"))}\ncode = "any"\n'
    )
    base_argv, cand_argv = [PY, "train.py", *BASE_ARGS], [PY, "train.py", *CAND_ARGS]
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        exp = await _open(
            client,
            hypothesis="DeepEP dispatch replayed in CUDA graphs is faster",
            changed_variable="token_dispatcher cuda_graphs",
        )

        # the baseline's own trace, captured first: its command and code are what the windows record
        _device_plays(monkeypatch, "nccl_alltoall_rank0.json")
        base_profile = await _profile(client, base_argv)
        prov = base_profile["provenance"]
        ran = {"code": prov["code"], "files": prov["files"]}
        base = [window(workspace, 20, seed=s, command=base_argv, **ran) for s in (1, 2, 3)]
        cand = [window(workspace, 10, seed=s, command=cand_argv, logged=LOGGED, **ran) for s in (4, 5, 6)]
        compared = await client.call_tool(
            "compare_benchmarks",
            {"baseline": base, "candidate": cand, "declared_changes": ["token_dispatcher", "cuda_graphs"]},
        )
        assert compared.structured_content is not None, _text(compared)
        comparison = compared.structured_content["evidence_id"]
        assert compared.structured_content["status"] == "comparable", compared.structured_content["reasons"]

        # shortcut 1: the baseline's trace (NCCL all-to-all) offered for the candidate shows nothing of it
        gate = await _backend(client, exp, comparison)
        assert gate["status"] == "failed", gate
        assert "no trace of the candidate's own run" in gate["reason"]
        assert f"{base_profile['evidence_id']} is a trace of the baseline's command" in gate["reason"]
        assert gate["reason"].endswith(f"; {LOG_SAYS}; only a trace passes this gate")  # the log never does
        assert gate["satisfy_with"].startswith(f"profile_segment(mode='run', command={cand_argv!r})")

        # shortcut 2: the candidate declares flex/DeepEP and graphs, but its run exchanged tokens through
        # NCCL all-to-all, eagerly: refused with what the trace shows
        nccl = await _profile(client, cand_argv)
        gate = await _backend(client, exp, comparison)
        assert gate["status"] == "failed", gate
        assert nccl["evidence_id"] in gate["evidence_ids"]
        assert f"{nccl['evidence_id']} shows 0 graph launches" in gate["reason"]
        assert "no deepep kernel ran; the exchange kernels were: alltoall (4 kernels" in gate["reason"]
        assert gate["reason"].endswith(f"; {LOG_SAYS}")  # told flex/DeepEP; the trace shows all-to-all
        assert "re-run its windows" in gate["satisfy_with"]

        # the CPU run's own trace: no exchange kernel and no graph at all
        _device_plays(monkeypatch, None)
        await _profile(client, cand_argv)
        gate = await _backend(client, exp, comparison)
        assert gate["status"] == "failed"
        assert "0 graph launches" in gate["reason"] and "the exchange kernels were: none" in gate["reason"]

        # the candidate's run replays graphs holding DeepEP's dispatch and combine: passed, with the figures
        _device_plays(monkeypatch, "deepep_graphs_rank0.json")
        good = await _profile(client, cand_argv)
        gate = await _backend(client, exp, comparison)
    assert gate["status"] == "passed", gate
    assert gate["evidence_ids"] == [comparison, good["evidence_id"]]
    assert f"{good['evidence_id']}: 2 graph launches" in gate["reason"]
    assert "dispatcher kernels deepep" in gate["reason"]


async def test_a_change_that_names_no_backend_is_not_asked_for_a_trace(workspace: Path) -> None:
    base = [
        window(workspace, 20, seed=s, command=["python", "train.py", "--workers", "0"]) for s in (1, 2, 3)
    ]
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        exp = await _open(client, hypothesis="workers", changed_variable="workers")
        cand = [
            window(workspace, 10, seed=s, command=["python", "train.py", "--workers", "2"]) for s in (4, 5, 6)
        ]
        compared = await client.call_tool(
            "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": ["workers"]}
        )
        assert compared.structured_content is not None, _text(compared)
        gate = await _backend(client, exp, compared.structured_content["evidence_id"])
    assert gate["status"] == "not_applicable", gate


async def test_an_undeclared_dispatcher_change_on_the_candidates_command_still_needs_its_trace(
    workspace: Path,
) -> None:
    """Declared as something else, the candidate's command still switches to DeepEP: the gate applies."""
    argv = ["python", "train.py", "--workers", "0"]
    base = [window(workspace, 20, seed=s, command=argv) for s in (1, 2, 3)]
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        exp = await _open(client, hypothesis="workers", changed_variable="workers")
        sneaky = [*argv[:-1], "2", "--parallelism.expert_parallel_comm_backend", "deepep"]
        cand = [window(workspace, 10, seed=s, command=sneaky) for s in (4, 5, 6)]
        compared = await client.call_tool(
            "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": ["workers"]}
        )
        assert compared.structured_content is not None, _text(compared)
        gate = await _backend(client, exp, compared.structured_content["evidence_id"])
    assert gate["status"] == "failed", gate
    assert gate["reason"].startswith("the token dispatcher (deepep) differs from the baseline's")
    assert gate["satisfy_with"].startswith(f"profile_segment(mode='run', command={sneaky!r})")


async def test_a_log_that_says_deepep_ran_never_passes_without_a_trace(workspace: Path) -> None:
    """The candidate's own stdout listed flex/DeepEP (weaker evidence): the refusal quotes it, and still
    names the profile_segment call; a baseline log saying alltoall changes nothing either."""
    argv = ["python", "train.py", *BASE_ARGS]
    said = {"moe_token_dispatcher_type": "alltoall"}
    base = [window(workspace, 20, seed=s, command=argv, logged=said) for s in (1, 2, 3)]
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        exp = await _open(client, hypothesis="DeepEP dispatch is faster", changed_variable="token_dispatcher")
        cand_argv = ["python", "train.py", *CAND_ARGS[:4]]
        logged = {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": "True"}
        cand = [window(workspace, 10, seed=s, command=cand_argv, logged=logged) for s in (4, 5, 6)]
        compared = await client.call_tool(
            "compare_benchmarks",
            {"baseline": base, "candidate": cand, "declared_changes": ["token_dispatcher"]},
        )
        assert compared.structured_content is not None, _text(compared)
        gate = await _backend(client, exp, compared.structured_content["evidence_id"])
    assert gate["status"] == "failed", gate
    assert gate["reason"] == (
        "the token dispatcher (deepep) is the declared change, but no trace of the candidate's own run shows "
        "what ran; the candidate's log says moe_enable_deepep=True, moe_token_dispatcher_type=flex (dispatcher "
        "deepep): what the job was told, not what ran; only a trace passes this gate"
    )
    assert gate["satisfy_with"].startswith(f"profile_segment(mode='run', command={cand_argv!r})")


def test_moe_token_settings_are_no_secret_names_but_tokens_still_are() -> None:
    """--moe-token-dispatcher-type's value was redacted as a credential: the sides' argv then never compared."""
    from perfgate.security.secretscan import is_secret_name

    for name in ("--moe-token-dispatcher-type", "moe_token_drop_policy", "token_dispatcher"):
        assert not is_secret_name(name), name
    for name in ("HF_TOKEN", "--token", "--api-token", "TOKEN_DISPATCHER_SECRET"):
        assert is_secret_name(name), name
