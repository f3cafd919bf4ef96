"""Command requests, their digest, and the operator's execution policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from perfgate.execution.policy import AllowRule, ExecutionPolicy, PolicyError, load_policy, policy_paths
from perfgate.execution.request import CommandRequest


def req(
    ws: Path, *argv: str, env: dict[str, str] | None = None, timeout_s: float = 60, cwd: Path | None = None
):
    return CommandRequest(argv=argv, cwd=cwd or ws, env=env or {}, timeout_s=timeout_s, reason="why")


def test_the_digest_binds_argv_cwd_env_and_timeout_but_not_the_reason(tmp_path: Path) -> None:
    base = req(tmp_path, "python", "train.py", env={"A": "1"})
    assert base.digest == req(tmp_path, "python", "train.py", env={"A": "1"}).digest
    assert base.digest == base.model_copy(update={"reason": "other words"}).digest
    changed = [
        req(tmp_path, "python", "train.py", "--x", env={"A": "1"}),
        req(tmp_path, "python", "train.py;", env={"A": "1"}),
        req(tmp_path, "python", "train.py", env={"A": "2"}),
        req(tmp_path, "python", "train.py", env={"A": "1", "B": "1"}),
        req(tmp_path, "python", "train.py", env={"A": "1"}, timeout_s=61),
        req(tmp_path, "python", "train.py", env={"A": "1"}, cwd=tmp_path / "sub"),
    ]
    assert len({base.digest, *(c.digest for c in changed)}) == 1 + len(changed)
    # Token boundaries matter: ["a b"] is not ["a", "b"].
    assert req(tmp_path, "echo", "a b").digest != req(tmp_path, "echo", "a", "b").digest


def test_requests_reject_relative_cwd_bad_env_names_and_nul_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="absolute"):
        CommandRequest(argv=("ls",), cwd=Path("rel"), timeout_s=1)
    with pytest.raises(ValidationError, match="not a valid identifier"):
        req(tmp_path, "ls", env={"A=B": "1"})
    with pytest.raises(ValidationError, match="NUL"):
        req(tmp_path, "ls", "a\x00b")
    with pytest.raises(ValidationError):
        CommandRequest(argv=(), cwd=tmp_path, timeout_s=1)
    with pytest.raises(ValidationError):
        req(tmp_path, "ls", timeout_s=0)


def test_the_description_shows_everything_the_human_decides_on(tmp_path: Path) -> None:
    text = req(tmp_path, "python", "x; rm -rf /", env={"CUDA_VISIBLE_DEVICES": "0"}).describe("run_x")
    assert '["python", "x; rm -rf /"]' in text
    assert str(tmp_path) in text and 'CUDA_VISIBLE_DEVICES="0"' in text
    assert "60 s" in text and "why" in text and "run_x" in text


def write_policy(ws: Path, body: str, where: str = "perfgate.toml") -> None:
    path = ws / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)


def test_without_a_policy_file_nothing_is_allowlisted_and_the_workspace_is_the_only_root(
    tmp_path: Path,
) -> None:
    policy = load_policy(tmp_path)
    assert policy.source is None and policy.allow == ()
    assert policy.match(req(tmp_path, "python")) is None
    assert policy.roots == (tmp_path.resolve(),)
    assert policy.limit_violations(req(tmp_path, "python", cwd=tmp_path / "sub")) == []
    outside = policy.limit_violations(req(tmp_path, "python", cwd=tmp_path.parent))
    assert len(outside) == 1 and "outside the allowed roots" in outside[0]


def test_allowlist_rules_match_argv_prefixes_token_by_token(tmp_path: Path) -> None:
    write_policy(
        tmp_path,
        """
[execution]
max_timeout_s = 120
allow_env = ["CUDA_VISIBLE_DEVICES"]

[[execution.allow]]
argv = ["python", "train.py"]

[[execution.allow]]
name = "torchrun"
argv = ["torchrun", "--nproc-per-node=*", "train.py"]
env = ["OMP_NUM_THREADS"]

[[execution.allow]]
argv = ["nvidia-smi"]
exact = true
""",
    )
    policy = load_policy(tmp_path)
    assert policy.source == tmp_path.resolve() / "perfgate.toml"
    ok = policy.match(req(tmp_path, "python", "train.py", "--steps", "10"))
    assert ok is not None and ok.label() == "python train.py"
    assert policy.match(req(tmp_path, "python", "other.py")) is None
    assert policy.match(req(tmp_path, "python")) is None
    # A pattern covers one token only: the shell never sees these, and neither does the matcher.
    assert policy.match(req(tmp_path, "python", "train.py; rm -rf /")) is None
    tr = policy.match(
        req(tmp_path, "torchrun", "--nproc-per-node=8", "train.py", env={"OMP_NUM_THREADS": "4"})
    )
    assert tr is not None and tr.name == "torchrun"
    assert policy.match(req(tmp_path, "nvidia-smi")) is not None
    assert policy.match(req(tmp_path, "nvidia-smi", "-q")) is None
    # Environment changes outside the allowed keys send the request to a human.
    assert policy.match(req(tmp_path, "python", "train.py", env={"CUDA_VISIBLE_DEVICES": "0"})) is not None
    assert policy.match(req(tmp_path, "python", "train.py", env={"LD_PRELOAD": "x.so"})) is None
    assert policy.match(req(tmp_path, "python", "train.py", env={"OMP_NUM_THREADS": "4"})) is None
    assert policy.limit_violations(req(tmp_path, "python", "train.py", timeout_s=121))


def test_extra_cwd_roots_relative_and_absolute(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    scratch = tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    write_policy(ws, f'[execution]\ncwd_roots = ["sub", "{scratch}"]\n', ".perfgate/policy.toml")
    policy = load_policy(ws)
    assert policy.roots == ((ws / "sub").resolve(), scratch.resolve())
    assert policy.limit_violations(req(ws, "x", cwd=scratch / "a")) == []
    assert policy.limit_violations(req(ws, "x", cwd=ws / "sub")) == []
    assert policy.limit_violations(req(ws, "x", cwd=ws))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[execution]\nalow = []\n", "unknown keys"),
        ("[execution]\nmax_timeout_s = -1\n", "positive number"),
        ("[execution]\nmax_timeout_s = true\n", "positive number"),
        ("[[execution.allow]]\nenv = []\n", "needs an argv"),
        ("[[execution.allow]]\nargv = []\n", "at least the program"),
        ("[[execution.allow]]\nargv = 'python'\n", "list of strings"),
        ("[[execution.allow]]\nargv = ['x']\nshell = true\n", "unknown keys"),
        ("execution = 3\n", "must be a table"),
        ("[execution\n", "cannot read"),
    ],
)
def test_invalid_policies_are_refused_with_the_reason(tmp_path: Path, body: str, message: str) -> None:
    write_policy(tmp_path, body)
    with pytest.raises(PolicyError, match=message):
        load_policy(tmp_path)


def test_two_policy_files_are_ambiguous(tmp_path: Path) -> None:
    write_policy(tmp_path, "[execution]\n")
    write_policy(tmp_path, "[execution]\n", ".perfgate/policy.toml")
    with pytest.raises(PolicyError, match="keep the policy in one"):
        load_policy(tmp_path)
    assert policy_paths(tmp_path) == (tmp_path / "perfgate.toml", tmp_path / ".perfgate" / "policy.toml")


def test_a_perfgate_toml_without_an_execution_table_is_ignored(tmp_path: Path) -> None:
    write_policy(tmp_path, "[other]\nx = 1\n")
    assert load_policy(tmp_path).source is None


def test_rules_can_be_built_in_code(tmp_path: Path) -> None:
    policy = ExecutionPolicy(workspace=tmp_path, allow=(AllowRule(argv=("make", "bench*")),))
    assert policy.match(req(tmp_path, "make", "bench-fast")) is not None
    assert policy.match(req(tmp_path, "make", "bench", env={"PERFGATE_OUT": "x"})) is not None
    assert policy.match(req(tmp_path, "make", "clean")) is None
