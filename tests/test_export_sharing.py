"""`perfgate export` writes a folder meant for sharing: no host name, user name, home or workspace path, no
other absolute path and no dataset location in any file it writes, and a map outside the folder that puts
them back."""

from __future__ import annotations

import getpass
import gzip
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.cli import main as cli_main
from perfgate.decisions.export import share_map_path
from perfgate.decisions.sharing import SHARED_USERS, Sanitizer, restore_text
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from test_record_decision import INVARIANTS, Evidence, _open, _text

pytestmark = pytest.mark.anyio

DATASET = "/lustre/acme-research/corpora/web-2025-q1/train"
OTHER_HOST = "gpu-node-017.cluster.acme.internal"
OTHER_USER = "jdoe"


def _profile(ledger: Ledger, workspace: Path) -> str:
    """A profile record whose trace files are named after the host and name the workspace inside."""
    eid = Ledger.new_id()
    host = socket.gethostname()
    trace = json.dumps({"traceName": f"{workspace}/traces/{host}_4242.pt.trace.json", "hostName": host})
    folder = ledger.artifact_dir(eid)
    (folder / f"{host}_4242.pt.trace.json").write_text(trace + "\n")
    with gzip.open(folder / f"{host}_4243.pt.trace.json.gz", "wt") as zipped:
        zipped.write(trace + "\n")
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool="profile_segment",
            state=EvidenceState.EXECUTED,
            inputs={"trace_dir": f"{workspace}/traces"},
            result={"evidence_id": eid, "trace_files": [f"{workspace}/traces/{host}_4242.pt.trace.json"]},
            artifact_names=[f"{host}_4242.pt.trace.json", f"{host}_4243.pt.trace.json.gz"],
        )
    )
    return eid


def _window(ev: Evidence, workspace: Path, workers: int) -> str:
    """A launched window as run_benchmark_window records one on a cluster: its command names the script
    by its absolute path and the dataset, its ranks name their hosts, its provenance the interpreter."""
    host, user, home = socket.gethostname(), getpass.getuser(), str(Path.home())
    command = ["python", f"{workspace}/train.py", "--data-path", DATASET, f"--num-workers={workers}"]
    return ev.add(
        "run_benchmark_window",
        "executed",
        {
            "median_step_ms": 10.0,
            "ranks": [
                {"rank": 0, "hostname": host, "node": {"hostname": host, "slurm_node": host}},
                {"rank": 1, "hostname": OTHER_HOST, "node": {"hostname": OTHER_HOST}},
            ],
            "provenance": {
                "cwd": str(workspace),
                "python": f"{home}/venvs/train/bin/python",
                "code": {"import_roots": [str(workspace), "/opt/site/acme-libs/python"]},
            },
            "notes": [f"{user} launched it on {host} for {OTHER_USER}; data under {DATASET}"],
        },
        {
            "command": command,
            "cwd": str(workspace),
            "env": {
                "USER": user,
                "SLURM_JOB_USER": OTHER_USER,
                "DATA_DIR": DATASET,
                "MASTER_ADDR": OTHER_HOST,
            },
            "contract": {"invariants": {**INVARIANTS, "dataset": DATASET}, "execution": {"workers": workers}},
        },
    )


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` as text (a .gz decompressed), by its path relative to the folder."""
    out: dict[str, str] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        out[str(path.relative_to(folder))] = data.decode("utf-8")
    return out


def _leaks(text: str, workspace: Path) -> list[str]:
    """The identifying values ``text`` still holds: a host name anywhere it stands as a name (a trace file
    is named ``HOST_PID``), the user name as a word, the workspace, the home folder, the dataset, a path."""
    hosts = [
        name
        for name in (socket.gethostname(), OTHER_HOST, "gpu-node-017")
        if re.search(r"(?<![A-Za-z0-9\-])" + re.escape(name) + r"(?![A-Za-z0-9\-])", text)
    ]
    # an account every machine has ("root" on CI) names nobody and is left as it is
    named = [u for u in (getpass.getuser(), OTHER_USER) if u not in SHARED_USERS]
    users = [u for u in named if re.search(r"(?<![\w\-])" + re.escape(u) + r"(?![\w\-])", text)]
    paths = (str(workspace), str(workspace.resolve()), str(Path.home()) + "/", DATASET, "/opt/site/acme-libs")
    return hosts + users + [p for p in paths if p in text]


async def test_an_export_names_no_host_user_path_or_dataset_and_its_map_puts_them_back(
    server: Any, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = Evidence(workspace)
    base, cand = _window(ev, workspace, 0), _window(ev, workspace, 4)
    comparison = ev.comparison([base], [cand], declared=["workers"])
    links = [
        {"id": ev.env(), "role": "environment"},
        {"id": base, "role": "baseline"},
        {"id": cand, "role": "candidate"},
        {"id": comparison, "role": "comparison"},
        {"id": _profile(ev.ledger, workspace), "role": "profile"},
    ]
    async with Client(server) as client:
        exp = await _open(client, hypothesis=f"more workers for {DATASET} on {socket.gethostname()}")
        attached = await client.call_tool(
            "record_decision", {"action": "attach", "experiment_id": exp, "evidence": links}
        )
        assert not attached.is_error, _text(attached)

    shared, raw = tmp_path / "shared", tmp_path / "raw"
    assert cli_main(["export", exp, str(shared), "--workspace", str(workspace)]) == 0
    assert "the map back is" in capsys.readouterr().err
    exported = _files(shared)
    for name in ("baseline.json", "candidate.json", "command.txt", "comparison.json", "decisions.md"):
        assert name in exported, sorted(exported)
    assert {name: leaks for name, text in exported.items() if (leaks := _leaks(name + text, workspace))} == {}
    command = exported["command.txt"]
    assert "<workspace>/train.py --data-path <redacted:dataset:" in command
    assert "<redacted:path:" in exported["baseline.json"] and "<home>/venvs" in exported["baseline.json"]
    assert "<redacted:host:" in exported["baseline.json"]
    traces = [name for name in exported if ".pt.trace.json" in name]
    assert len(traces) == 2 and all("/<redacted:host:" in name for name in traces), traces

    # the map stays in the workspace's state folder, never in what is shared
    map_path = share_map_path(Ledger(workspace), exp, shared)
    assert map_path.is_file() and shared not in map_path.parents
    assert Path.home().as_posix() in map_path.read_text()

    # restored, every file says what the unsanitised export says
    assert cli_main(["export", exp, str(raw), "--no-sanitize", "--workspace", str(workspace)]) == 0
    assert cli_main(["export", exp, str(shared), "--restore", "--workspace", str(workspace)]) == 0
    restored, original = _files(shared), _files(raw)
    assert sorted(restored) == sorted(original)
    for name, text in original.items():
        if name.endswith(".json"):
            assert json.loads(restored[name]) == json.loads(text), name
        else:
            assert restored[name] == text, name
    assert DATASET in original["command.txt"] and socket.gethostname() in original["baseline.json"]


def test_placeholders_are_stable_and_only_whole_names_are_replaced(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    share = Sanitizer(workspace, "/home/alice", hosts=["vm"], users=["alice"], datasets=["/data/train/"])
    text = f"alice ran {workspace}/x.py on vm (llvm, vm-2) reading /data/train/a and /data/train2/a"
    once = share.text(text)
    assert once == share.text(text)
    assert "llvm" in once and "vm-2" in once and "alice" not in once
    assert once.startswith("<redacted:user:") and f"{workspace}" not in once and "<workspace>/x.py" in once
    assert "<redacted:dataset:" in once and "/data/train2" not in once and "<redacted:path:" in once
    assert restore_text(once, share.mapping) == text
