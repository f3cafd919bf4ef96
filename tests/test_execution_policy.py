"""Command requests, their digest, and the operator's execution policy."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from _trust import operator_policy
from perfgate.envprobe.provenance import code_state
from perfgate.execution.binding import bind_code
from perfgate.execution.policy import (
    AllowRule,
    ExecutionPolicy,
    PolicyError,
    load_policy,
    policy_paths,
    workspace_policy_files,
)
from perfgate.execution.request import CommandRequest
from perfgate.execution.target import Target, command_target, user_argv
from perfgate.security.trustroot import TrustRoot


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


def write_policy(ws: Path, body: str) -> None:
    """The operator's policy, in the test's trust root (the workspace is never read)."""
    operator_policy(body)


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


def test_workspace_policy_files_are_reported_never_obeyed(tmp_path: Path) -> None:
    rule = '[execution]\nmax_timeout_s = 99999\n[[execution.allow]]\nargv = ["python"]\ncode = "any"\n'
    (tmp_path / "perfgate.toml").write_text(rule)
    (tmp_path / ".perfgate").mkdir()
    (tmp_path / ".perfgate" / "policy.toml").write_text(rule)
    policy = load_policy(tmp_path)
    assert policy.source is None and policy.allow == () and policy.max_timeout_s == 3600
    assert workspace_policy_files(tmp_path) == list(policy_paths(tmp_path.resolve()))
    (tmp_path / "perfgate.toml").write_text("[tool.other]\nx = 1\n")
    assert workspace_policy_files(tmp_path) == [policy_paths(tmp_path.resolve())[1]]


def test_allowlist_rules_match_argv_prefixes_token_by_token(tmp_path: Path) -> None:
    write_policy(
        tmp_path,
        """
[execution]
max_timeout_s = 120
allow_env = ["CUDA_VISIBLE_DEVICES"]

[[execution.allow]]
argv = ["python", "train.py"]
code = "any"

[[execution.allow]]
name = "torchrun"
argv = ["torchrun", "--nproc-per-node=*", "train.py"]
env = ["OMP_NUM_THREADS"]
code = "any"

[[execution.allow]]
argv = ["nvidia-smi"]
exact = true
code = "any"
""",
    )
    policy = load_policy(tmp_path)
    assert policy.source == TrustRoot.locate().policy_file
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


def test_rules_match_the_users_command_inside_the_harness_wrapper(tmp_path: Path) -> None:
    """`python -m perfgate.harness *` used to allow every script: rules now see the user's command."""
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    state = code_state(tmp_path).digest
    write_policy(
        tmp_path,
        f'[execution]\n[[execution.allow]]\nscript = "train.py"\nsha256 = "{digest}"\ncode_state = "{state}"\n'
        'argv = ["python"]\n',
    )
    policy = load_policy(tmp_path)
    entry = "/state/harness/0123456789abcdef/perfgate-harness.py"
    wrapped = ("python", entry, "--", "train.py", "--steps", "5")
    assert user_argv(wrapped) == ("python", "train.py", "--steps", "5")
    assert policy.match(bind_code(req(tmp_path, *wrapped), tmp_path)) is not None
    assert policy.match(bind_code(req(tmp_path, "python", "train.py"), tmp_path)) is not None
    assert policy.match(req(tmp_path, *wrapped)) is None  # a request not bound to its code matches no pin
    torchrun = ("torchrun", "--nproc-per-node=2", entry, "--", "train.py")
    assert command_target(torchrun) == Target("script", "train.py")
    # `-m perfgate.harness` imports a perfgate/ folder of the working directory first: not the user's
    # command alone, so no rule about train.py matches it
    module_form = ("python", "-m", "perfgate.harness", "--", "train.py")
    assert command_target(module_form) == Target("module", "perfgate.harness")
    assert policy.match(req(tmp_path, *module_form)) is None
    # Another script the agent wrote, even under the harness, is not allowed...
    (tmp_path / "evil.py").write_text("print('x')\n")
    assert policy.match(req(tmp_path, "python", entry, "--", "evil.py")) is None
    # ...nor the allowed script once edited: the pin no longer matches.
    script.write_text("print('v2')\n")
    assert policy.match(bind_code(req(tmp_path, *wrapped), tmp_path)) is None
    assert "changed since the operator pinned it" in (policy.allow[0].why_not(req(tmp_path, *wrapped)) or "")


def test_a_rule_must_pin_its_code_or_opt_out_explicitly(tmp_path: Path) -> None:
    write_policy(tmp_path, '[execution]\n[[execution.allow]]\nscript = "train.py"\n')
    with pytest.raises(PolicyError, match="pins no code"):
        load_policy(tmp_path)
    write_policy(tmp_path, '[execution]\n[[execution.allow]]\nscript = "train.py"\ncode = "any"\n')
    rule = load_policy(tmp_path).allow[0]
    assert rule.any_code and rule.label().endswith("(any code)")
    write_policy(
        tmp_path, '[execution]\n[[execution.allow]]\nargv = ["python"]\nsha256 = "' + "a" * 64 + '"\n'
    )
    with pytest.raises(PolicyError, match="name one"):
        load_policy(tmp_path)


def test_the_digest_binds_the_code_the_command_runs(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    (tmp_path / "model.py").write_text("X = 1\n")
    request = req(tmp_path, "python", "-m", "perfgate.harness", "--", "train.py", "--config=cfg.yaml")
    (tmp_path / "cfg.yaml").write_text("lr: 1\n")
    bound = bind_code(request, tmp_path)
    assert bound.code is not None and set(bound.code.files) == {
        str(script.resolve()),
        str((tmp_path / "cfg.yaml").resolve()),
    }
    assert bind_code(request, tmp_path).digest == bound.digest and bound.digest != request.digest
    assert bound.unbound().digest == request.digest
    script.write_text("print(2)\n")  # the approved script, edited
    assert bind_code(request, tmp_path).digest != bound.digest
    script.write_text("print(1)\n")
    (tmp_path / "model.py").write_text("X = 2\n")  # a module it imports, edited
    assert bind_code(request, tmp_path).digest != bound.digest
    (tmp_path / "model.py").write_text("X = 1\n")
    (tmp_path / "checkpoint.pt").write_bytes(b"weights")  # outputs a run writes are not code
    assert bind_code(request, tmp_path).digest == bound.digest
    assert "file:" in bound.describe() and "code:" in bound.describe()


def test_extra_cwd_roots_relative_and_absolute(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    scratch = tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    write_policy(ws, f'[execution]\ncwd_roots = ["sub", "{scratch}"]\n')
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
        ("[[execution.allow]]\nenv = []\n", "needs a script, a module or an argv"),
        ("[[execution.allow]]\nargv = ['']\ncode = 'any'\n", "at least the program"),
        ("[[execution.allow]]\nargv = 'python'\n", "list of strings"),
        ("[[execution.allow]]\nargv = ['x']\nshell = true\n", "unknown keys"),
        ("[[execution.allow]]\nscript = 'a.py'\nsha256 = 'abc'\n", "64 hex digits"),
        ("execution = 3\n", "must be a table"),
        ("[execution\n", "cannot read"),
    ],
)
def test_invalid_policies_are_refused_with_the_reason(tmp_path: Path, body: str, message: str) -> None:
    write_policy(tmp_path, body)
    with pytest.raises(PolicyError, match=message):
        load_policy(tmp_path)


def test_a_policy_file_without_an_execution_table_gives_the_defaults(tmp_path: Path) -> None:
    write_policy(tmp_path, "[other]\nx = 1\n")
    assert load_policy(tmp_path).allow == ()


def test_rules_can_be_built_in_code(tmp_path: Path) -> None:
    policy = ExecutionPolicy(workspace=tmp_path, allow=(AllowRule(argv=("make", "bench*")),))
    assert policy.match(req(tmp_path, "make", "bench-fast")) is not None
    assert policy.match(req(tmp_path, "make", "bench", env={"PERFGATE_OUT": "x"})) is not None
    assert policy.match(req(tmp_path, "make", "clean")) is None


def test_the_documented_allowlist_example_allows_its_named_script_and_nothing_else(tmp_path: Path) -> None:
    """The documented policy example (docs/approvals.md), as written there: its rule names a script (never
    `*`), and under the harness wrapper it lets that script, with that content, run and nothing else."""
    readme = (Path(__file__).parents[1] / "docs" / "approvals.md").read_text()
    block = readme.split("# ~/.config/perfgate/policy.toml", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    assert '"*"' not in block and "perfgate.harness" not in block
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    body, placeholders = re.subn(r"<`perfgate policy pin train.py`>", digest, block)
    body, states = re.subn(r"<printed with it>", code_state(tmp_path).digest, body)
    assert placeholders == 1 and states == 1
    write_policy(tmp_path, body)
    policy = load_policy(tmp_path)
    (rule,) = policy.allow
    entry = "/state/harness/0123456789abcdef/perfgate-harness.py"
    wrapped = ("python", entry, "--warmup-steps", "5", "--", "train.py", "--steps", "9")
    assert policy.match(bind_code(req(tmp_path, *wrapped), tmp_path)) is rule
    (tmp_path / "other.py").write_text("print('x')\n")
    assert policy.match(req(tmp_path, "python", entry, "--", "other.py")) is None
    assert policy.match(req(tmp_path, "python", "-c", "print(1)")) is None
    script.write_text("print('v2')\n")  # the named script, edited: no longer the pinned content
    assert policy.match(req(tmp_path, *wrapped)) is None


def test_a_pin_binds_the_code_state_so_an_imported_module_edited_and_committed_asks_a_human(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38: a pinned rule checked only the script's hash, so a module it imports, edited and committed,
    ran unasked. `perfgate policy pin` now prints the code state too, and a rule without one is refused."""
    import subprocess

    from perfgate.cli import main as cli_main

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "train.py").write_text("import helper\nhelper.step()\n")
    (tmp_path / "helper.py").write_text("def step():\n    pass\n")
    git("add", ".")
    git("commit", "-qm", "v1")
    assert cli_main(["policy", "pin", "train.py", "--workspace", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    rule = printed.split("\n", 1)[1]
    assert "code_state = " in rule
    write_policy(tmp_path, "[execution]\n" + rule + 'argv = ["python"]\n')
    policy = load_policy(tmp_path)
    wrapped = ("python", "/state/harness/0123456789abcdef/perfgate-harness.py", "--", "train.py")
    assert policy.match(bind_code(req(tmp_path, *wrapped), tmp_path)) is not None
    (tmp_path / "helper.py").write_text("def step():\n    import os; os.system('id')\n")
    git("commit", "-qam", "v2")  # train.py's hash is unchanged
    bound = bind_code(req(tmp_path, *wrapped), tmp_path)
    assert policy.match(bound) is None
    assert "code changed since the operator pinned" in (policy.allow[0].why_not(bound) or "")
    # a rule that pins the file alone would let that happen: it is refused, saying what to add
    write_policy(tmp_path, "[execution]\n" + rule.replace("code_state", "# code_state"))
    with pytest.raises(PolicyError, match="code_state"):
        load_policy(tmp_path)
