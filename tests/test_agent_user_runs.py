# ruff: noqa: F811  # pytest fixtures imported from test_agent_user are named by the tests' parameters
"""The agent as a separate OS user (writing only the workspace) attacks what a run executes and measures.

Issue 38: records and logs were read back from the agent-writable ``.perfgate/`` while the run went on,
and the training interpreter could be made to run code nobody approved (a ``perfgate/`` package in the
run's directory shadowing the harness, a ``.pyc`` stamped with its source's mtime and size, a
``sitecustomize.py`` beside the harness copy, a torchrun option the approval read otherwise than the
launch). Here the agent (a throwaway user, see `test_agent_user`) plants each before or during an
approved run; the server is the operator (this process). Each piece of planted code would write a marker
file: none may appear, and the recorded figures are the run's own.
"""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_agent_user import Agent, _give_to_agent, agent, agent_workspace  # pyright: ignore[reportPrivateUsage]  # noqa: F401  # the fixtures

pytestmark = pytest.mark.anyio

PY = sys.executable

TRAIN = """\
import helper
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(400):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    helper.pause()
"""
HELPER = "import time\n\n\ndef pause():\n    time.sleep(0.02)\n"


def _marker_code(marker: Path, what: str) -> str:
    return f"import pathlib; pathlib.Path({str(marker)!r}).joinpath({what!r}).write_text('ran')\n"


def _contract() -> dict[str, Any]:
    return {
        "invariants": {"model": "linear", "dataset": "random", "precision": "fp32", "global_batch": 8},
        "execution": {"microbatch": 8, "accumulation": 1, "data_parallel": 1},
    }


async def _call(ws: Path, args: dict[str, Any]) -> tuple[bool, dict[str, Any] | None, str]:
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    return result.is_error, result.structured_content, text


def _stamped_pyc(source: Path, evil: str) -> bytes:
    """A timestamp .pyc of ``evil`` whose header claims ``source``'s mtime and size."""
    st = source.stat()
    code = compile(evil, str(source), "exec")
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    header += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(
        4, "little"
    )
    return header + marshal.dumps(code)


@pytest.fixture
def markers(agent_workspace: Path) -> Path:
    """Where planted code would say it ran: outside the workspace, writable only by the operator."""
    folder = Path(str(agent_workspace) + "-markers")
    folder.mkdir(mode=0o700)
    yield folder  # type: ignore[misc]
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


@pytest.mark.parametrize("plant", ["shadow_package", "stamped_pyc", "sitecustomize"])
async def test_planted_start_up_code_never_runs_under_an_approved_run(
    agent: Agent, agent_workspace: Path, trust_root: TrustRoot, markers: Path, plant: str
) -> None:
    """shadow_package: a ``perfgate/`` package in the run's directory (``-m perfgate.harness`` imported
    it first); stamped_pyc: a ``.pyc`` of the imported helper with the source's mtime and size in its
    header; sitecustomize: one added to every harness copy the agent can reach (the copy lived in
    ``.perfgate/harness-path/``, on PYTHONPATH with ``harness_on_path``)."""
    ws = agent_workspace
    (ws / "train.py").write_text(TRAIN)
    (ws / "helper.py").write_text(HELPER)
    rule = f'[execution]\n[[execution.allow]]\nscript = "train.py"\ncode = "any"\nargv = ["{PY}"]\n'
    operator_policy(rule + 'env = ["PYTHONPATH"]\n')
    _give_to_agent(ws, agent)
    evil = _marker_code(markers, plant)
    args = {
        "command": [PY, "train.py"],
        "warmup_steps": 3,
        "measure_steps": 10,
        "repeats": 1,
        "timeout_s": 300,
        "contract": _contract(),
        "harness_on_path": plant == "sitecustomize",
    }
    if plant == "shadow_package":
        names = ["perfgate/__init__.py", "perfgate/harness/__init__.py", "perfgate/harness/__main__.py"]
        code = (
            f"import pathlib\nws = pathlib.Path({str(ws)!r})\n(ws / 'perfgate/harness').mkdir(parents=True)\n"
            f"for name in {names!r}:\n    (ws / name).write_text({evil!r})\n"
        )
        assert agent.py(code).returncode == 0
    elif plant == "stamped_pyc":
        cache = importlib.util.cache_from_source(str(ws / "helper.py"))
        pyc = _stamped_pyc(ws / "helper.py", evil + HELPER)
        code = f"import pathlib; p = pathlib.Path({cache!r}); p.parent.mkdir(); p.write_bytes({pyc!r})"
        assert agent.py(code).returncode == 0
    else:
        failed, _, text = await _call(ws, args)  # a first run makes the copy
        assert not failed, text
        _give_to_agent(ws, agent)
        found = [*(ws / ".perfgate").glob("harness-path/*"), *(trust_root.state_dir / "harness").glob("*")]
        assert found
        code = f"import pathlib\nfor d in {[str(d) for d in found]!r}:\n    try:\n"
        code += f"        pathlib.Path(d, 'sitecustomize.py').write_text({evil!r})\n    except OSError:\n        pass\n"
        assert agent.py(code).returncode == 0
    failed, out, text = await _call(ws, args)
    assert list(markers.iterdir()) == []
    if plant == "sitecustomize":
        copies = list((trust_root.state_dir / "harness").glob("*/perfgate-harness.py"))
        assert copies and not (copies[0].parent / "sitecustomize.py").exists()  # the trust root: out of reach
    assert not failed and out is not None, text
    assert out["state"] == "executed", out.get("failure_reason")
    assert out["median_step_ms"] >= 15  # the helper's 20 ms pause: the source ran, not the planted bytes


async def test_torchrun_option_read_differently_cannot_smuggle_a_script_past_a_rule(
    agent: Agent, agent_workspace: Path, trust_root: TrustRoot, markers: Path
) -> None:
    ws = agent_workspace
    (ws / "train.py").write_text(TRAIN)
    (ws / "helper.py").write_text(HELPER)
    (ws / "evil.py").write_text(_marker_code(markers, "evil"))
    operator_policy(f'[execution]\n[[execution.allow]]\nscript = "train.py"\ncode = "any"\nargv = ["{PY}"]\n')
    _give_to_agent(ws, agent)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    args = {
        "command": [*torchrun, "--virtual-local-rank", "evil.py", "train.py"],
        "warmup_steps": 3,
        "measure_steps": 5,
        "repeats": 1,
        "timeout_s": 300,
        "contract": _contract(),
    }
    failed, _out, text = await _call(ws, args)
    # approval reads the command as torchrun will: it runs evil.py, which no rule allows
    assert failed and "perfgate approve" in text and "evil.py" in text, text
    assert list(markers.iterdir()) == []


async def test_records_and_logs_replaced_during_a_run_do_not_become_the_figures(
    agent: Agent, agent_workspace: Path, trust_root: TrustRoot
) -> None:
    """The agent loops over ``.perfgate/`` for the whole run: every run folder or evidence folder that
    appears is moved aside and remade as its own, with garbage records and a log of 3 ms steps where the
    run takes 20 ms. A call may fail from that interference, but no forged figure is ever recorded."""
    from perfgate.evidence import Ledger

    ws = agent_workspace
    (ws / "train.py").write_text(TRAIN)
    (ws / "helper.py").write_text(HELPER)
    (ws / "steps.py").write_text(
        "import time\nfor i in range(60):\n    t = time.perf_counter(); time.sleep(0.02)\n"
        "    print(f'step {i} time {(time.perf_counter() - t) * 1e3:.2f} ms', flush=True)\n"
    )
    operator_policy(
        f'[execution]\n[[execution.allow]]\nscript = "train.py"\ncode = "any"\nargv = ["{PY}"]\n'
        f'[[execution.allow]]\nscript = "steps.py"\ncode = "any"\nargv = ["{PY}"]\n'
    )
    for name in ("artifacts", "bench-runs"):  # the agent's own, like the rest of the workspace
        (ws / ".perfgate" / name).mkdir(parents=True)
    _give_to_agent(ws, agent)
    fake_log = "".join(f"step {i} time 3.00 ms\n" for i in range(60))
    forger = subprocess.Popen(
        [
            agent.python,
            "-c",
            textwrap.dedent(
                f"""
                import os, pathlib, shutil, time
                state = pathlib.Path({str(ws)!r}) / ".perfgate"
                taken = set()
                end = time.monotonic() + 600
                while time.monotonic() < end:
                    folders = list((state / "bench-runs").glob("*/records")) + list((state / "artifacts").glob("ev-*"))
                    for folder in folders:
                        if folder in taken or not any(folder.iterdir()):
                            continue
                        taken.add(folder)
                        try:  # the server's folder, in a folder the agent owns: moved aside, remade as its own
                            aside = folder.with_name(".aside-" + folder.name)
                            os.rename(folder, aside)
                            shutil.copytree(aside, folder)
                            for p in folder.glob("*"):
                                if p.name.endswith("stdout.log"):
                                    p.write_text({fake_log!r})
                                elif p.name.startswith("rank") and p.suffix == ".json":
                                    p.write_text("{{}}")
                        except OSError:
                            pass
                    time.sleep(0.001)
                """
            ),
        ],
        user=agent.uid,
        group=agent.gid,
        extra_groups=[],
        env={"HOME": str(agent.home), "PATH": "/usr/bin:/bin", "PYTHONPATH": agent.pythonpath},
        cwd=agent.home,
    )
    base = {"warmup_steps": 5, "measure_steps": 20, "repeats": 1, "timeout_s": 300, "contract": _contract()}
    log_args = {
        **base,
        "command": [PY, "steps.py"],
        "timing": "log",
        "log_pattern": r"step (?P<step>\d+) time (?P<step_time_ms>[0-9.]+) ms",
    }
    try:
        outcomes = [await _call(ws, {**base, "command": [PY, "train.py"]}), await _call(ws, log_args)]
    finally:
        forger.kill()
        forger.wait()
    for failed, out, text in outcomes:
        if not failed and out is not None and out["state"] == "executed":
            assert out["median_step_ms"] >= 15, text
    medians = [r.result.get("median_step_ms") for r in Ledger(ws).records(tool="run_benchmark_window")]
    assert all(m is None or m >= 15 for m in medians), medians
    assert any(
        not failed and out is not None and out["state"] == "executed" for failed, out, _ in outcomes
    ), [t for _, _, t in outcomes]
