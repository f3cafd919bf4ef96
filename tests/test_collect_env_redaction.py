"""Secrets never reach a collect_env result, artifact or ledger row; host identity is sanitised."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.evidence import Ledger
from perfgate.security.envredactor import REDACTED, Redactor, is_secret_name
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools.collect_env import CollectEnvInput, run

FAKES = Path(__file__).parent / "fakes"

# Secret-shaped variables as they appear in real shells and job environments (values are made up).
SECRETS = {
    "HF_TOKEN": "hf_QmVhZ3lZb3VyVG9rZW5Jc05vdFJlYWwx",
    "WANDB_API_KEY": "3c1f9e2a7b4d6c8e0f1a2b3c4d5e6f708192a3b4",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
    "GITHUB_TOKEN": "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "OPENAI_API_KEY": "sk-proj-Xq9Lr2Vt8Wn4Zp6Ks1Jd3Fh5Gm7Bc0Nx",
    "SLACK_BOT_TOKEN": "xoxb-2048-4096-AbCdEfGhIjKlMnOp",
    "DB_PASSWORD": "correct-horse-battery-staple",
    "MY_SERVICE_PASSWD": "p4ssw0rd-for-the-cache",
    "SESSION_COOKIE": "sessid=9f8e7d6c5b4a39281706",
    "NPM_CONFIG__AUTH": "dXNlcjpucG1wYXNzd29yZA==",
    "TORCH_HUB_TOKEN": "torch-hub-private-token-77",
    "NCCL_IB_AUTH_KEY": "nccl-fabric-key-0042",
    "CREDENTIALS_JSON": '{"client_secret": "gcp-client-secret-5150"}',
}
URL_SECRETS = {
    "DATABASE_URL": ("postgres://admin:S3cr3tDbPass@db.internal:5432/train", "S3cr3tDbPass"),
    "PYTORCH_STORE_URL": ("tcp://trainer:Rdzv-Pa55word@10.1.2.3:29500", "Rdzv-Pa55word"),
    "HTTPS_PROXY": ("http://proxyuser:Pr0xyPassw0rd@proxy.corp:3128", "Pr0xyPassw0rd"),
}


_PLACEHOLDER = re.compile(r"<redacted:[a-z0-9-]+:[0-9a-f]{8}>")


def _bare(text: str) -> str:
    """``text`` with each placeholder shown as the bare marker (tags are checked in test_secret_scanner)."""
    return _PLACEHOLDER.sub(REDACTED, text)


def secret_values() -> list[str]:
    values = list(SECRETS.values()) + [pw for _, pw in URL_SECRETS.values()]
    values.append("gcp-client-secret-5150")
    return values


# ---------------------------------------------------------------- the redactor


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("db_password", True),
        ("MY_PASSWD", True),
        ("SESSION_COOKIE", True),
        ("NPM_CONFIG__AUTH", True),
        ("GITHUBTOKEN", True),
        ("--hf-token", True),
        ("--api_key", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("GIT_AUTHOR_NAME", False),
        ("NCCL_IB_HCA", False),
        ("MONKEYPATCH", False),
        ("PYTORCH_CUDA_ALLOC_CONF", False),
    ],
)
def test_secret_names_are_recognised_by_whole_segments(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_values_are_scrubbed_wherever_they_appear() -> None:
    r = Redactor({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz12", "X": "ab"})
    text = "token hf_abcdefghijklmnopqrstuvwxyz12 in a diff; short value ab stays"
    assert _bare(r.text(text)) == f"token {REDACTED} in a diff; short value ab stays"


def test_url_credentials_and_token_shapes_are_removed_without_knowing_the_variable() -> None:
    r = Redactor({})
    assert _bare(r.text("pip --index-url https://bob:hunter2@pypi.corp/simple")) == (
        f"pip --index-url https://bob:{REDACTED}@pypi.corp/simple"
    )
    assert _bare(r.text("push to https://ghp_abcdefghijklmnopqrstuvwx12@github.com/x")) == (
        f"push to https://{REDACTED}@github.com/x"
    )
    assert REDACTED in _bare(r.text("Authorization: Bearer abcdefghijklmnop.qrstuvwx"))
    assert _bare(r.text("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----")) == REDACTED
    assert _bare(r.text("api_key = 'zzzzzzzz'")) == f"api_key = '{REDACTED}'"
    # ordinary text survives
    assert r.text("disk-abcdefghijklmnopqrstuvwxyz and max_split_size_mb:128") == (
        "disk-abcdefghijklmnopqrstuvwxyz and max_split_size_mb:128"
    )


def test_command_lines_lose_the_values_of_secret_flags() -> None:
    r = Redactor({})
    argv = ["torchrun", "train.py", "--hf-token", "abc", "--api-key=zzz", "--lr=1e-3", "--password"]
    assert [_bare(a) for a in r.argv(argv)] == [
        "torchrun",
        "train.py",
        "--hf-token",
        REDACTED,
        f"--api-key={REDACTED}",
        "--lr=1e-3",
        "--password",
    ]


def test_home_directories_and_host_names_are_sanitised() -> None:
    r = Redactor({}, homes=["/home/alice"], hostnames=["gpu-node-17.cluster.local", "gpu-node-17"])
    text = (
        "/home/alice/.venv/bin/python on gpu-node-17 (gpu-node-17.cluster.local), /home/bob/x, /home/alicex"
    )
    assert r.text(text) == "~/.venv/bin/python on <hostname> (<hostname>), /home/<user>/x, /home/<user>"
    assert r.tree({"/home/alice/k": ["gpu-node-17", 3]}) == {"~/k": ["<hostname>", 3]}


# ---------------------------------------------------------------- end to end


@pytest.mark.anyio
@pytest.mark.slow
async def test_no_secret_value_reaches_the_result_the_artifacts_or_the_ledger(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    for name, (url, _) in URL_SECRETS.items():
        monkeypatch.setenv(name, url)
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # an ordinary switch, reported as is
    # A system tool whose output contains a secret (old-driver fake: the banner is printed, with this line).
    monkeypatch.setenv("PATH", f"{FAKES / 'fake_nvidia_bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PERFGATE_FAKE_SMI_OLD", "1")
    monkeypatch.setenv("PERFGATE_FAKE_SMI_EXTRA", f"note: key {SECRETS['OPENAI_API_KEY']} in use")
    # A working tree whose diff contains secrets.
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (workspace / "config.yaml").write_text("lr: 0.001\n")
    subprocess.run([*git, "add", "config.yaml"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    (workspace / "config.yaml").write_text(
        f"lr: 0.002\nhf_token: {SECRETS['HF_TOKEN']}\npassword = {SECRETS['DB_PASSWORD']}\n"
    )
    inp = CollectEnvInput(
        launch_command=[
            "torchrun",
            "train.py",
            "--hf-token",
            SECRETS["HF_TOKEN"],
            f"--wandb_key={SECRETS['WANDB_API_KEY']}",
            "--db",
            URL_SECRETS["DATABASE_URL"][0],
        ]
    )
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="collect_env")
    rt.inputs = inp.model_dump(mode="json")
    out = await run(inp, rt)
    assert out.state == "executed", out.failure

    result_text = out.model_dump_json()
    files = [p for p in (workspace / ".perfgate").rglob("*") if p.is_file()]
    assert any(p.name == "environment.json" for p in files) and any(p.name == "ledger.db" for p in files)
    for secret in secret_values():
        assert secret not in result_text, secret
        for path in files:
            assert secret.encode() not in path.read_bytes(), (secret, path)

    # the names are still visible, so the agent knows a switch was set
    switches = {k: _bare(v) if isinstance(v, str) else v for k, v in out.switches.items()}
    assert switches["TORCH_HUB_TOKEN"] == REDACTED and switches["NCCL_IB_AUTH_KEY"] == REDACTED
    assert switches["PYTORCH_STORE_URL"] == f"tcp://{REDACTED}@10.1.2.3:29500"
    assert switches["NCCL_ALGO"] == "Ring"
    assert out.provenance.launch_command is not None
    assert REDACTED in [_bare(a) for a in out.provenance.launch_command]
    git_prov = out.provenance.git
    assert git_prov is not None and git_prov.diff_artifact_redacted
    diff = _bare((Ledger(workspace).artifact_dir(out.evidence_id) / "git.diff").read_text())
    assert "+lr: 0.002" in diff and f"hf_token: {REDACTED}" in diff
    smi = _bare((Ledger(workspace).artifact_dir(out.evidence_id) / "systool_nvidia-smi.txt").read_text())
    assert f"note: key {REDACTED} in use" in smi


@pytest.mark.anyio
@pytest.mark.slow
async def test_home_paths_and_the_host_name_are_sanitised_in_the_artifact(workspace: Path) -> None:
    inp = CollectEnvInput(system_tools=False)
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="collect_env")
    out = await run(inp, rt)
    doc_path = Ledger(workspace).artifact_dir(out.evidence_id) / "environment.json"
    text = doc_path.read_text()
    doc = json.loads(text)
    home = str(Path.home())
    assert home + "/" not in text and f'"{home}"' not in text
    assert doc["observed"]["host"]["hostname"] == "<hostname>" and doc["observed"]["host"]["user"] == "<user>"
    hostname = socket.gethostname()
    if len(hostname) >= 3:
        assert hostname not in text
    if sys.base_prefix.startswith(home + "/"):
        assert doc["observed"]["python"]["base_prefix"] == "~" + sys.base_prefix[len(home) :]
    stdout_log = (Ledger(workspace).artifact_dir(out.evidence_id) / "probe_stdout.log").read_text()
    assert f'"hostname": "{hostname}"' not in stdout_log and '"hostname": "<hostname>"' in stdout_log
