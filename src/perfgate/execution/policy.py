"""The operator's execution policy: what may run without asking, and the limits on every run.

The policy is operator configuration kept in the trust root (`perfgate.security.trustroot`), outside the workspace the
agent writes: ``~/.config/perfgate/policy.toml`` (``$PERFGATE_CONFIG_DIR/policy.toml``, or the file named by
``$PERFGATE_POLICY`` / ``--policy``). A ``perfgate.toml`` or ``.perfgate/policy.toml`` in the workspace is
never obeyed: the agent could have written it. When one holds an ``[execution]`` table it is reported
(server log, refusals, ``perfgate policy``) so the operator can move it::

    [execution]
    max_timeout_s = 3600             # hard limit on every run, approved or not
    cwd_roots = [".", "/scratch/me"] # working directories allowed (relative = to the workspace)
    allow_env = ["PERFGATE_*", "CUDA_VISIBLE_DEVICES"]  # keys an allowlisted run may set
    pending_ttl_s = 86400            # a pending approval expires after this
    grant_ttl_s = 7200               # a human's grant covers its scope this long (default 2 h) ...
    grant_runs = 8                   # ... for at most this many calls (default 8)

    [[execution.allow]]
    script = "train.py"              # the script the command runs (relative to the workspace), or
                                     # module = "pkg.train"
    sha256 = "9f2c..."               # that file's content (`perfgate policy pin train.py` prints it), and
    code_state = "41d0..."           # the workspace's code state it was pinned in (printed with it); or
                                     # code = "any" to allow whatever the file holds when it runs
    argv = ["python", "train.py", "*"]  # optional: patterns for the user's command, one per token
    env = ["OMP_NUM_THREADS"]        # extra keys this rule lets the run set
    exact = false                    # true: no arguments beyond the argv patterns

Rules are about the user's command, not perfgate's wrapper: ``python -m perfgate.harness -- train.py``
is matched as ``python train.py``. A rule matches a request when its argv patterns match the command's
leading tokens, the command runs the rule's script or module, that file has the pinned sha256 and the
workspace the pinned code state (git commit, changes and untracked code files: a module the script
imports, edited and committed, is another code state), unless the rule says ``code = "any"``, and every
environment variable the request sets is allowed. A rule must pin
its code or opt out explicitly; a request that matches no rule goes to a human, and the limits (timeout,
working directory) bind every request whoever approves it.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from perfgate.execution.request import CommandRequest
from perfgate.execution.target import command_target, is_slurm_submission, user_argv
from perfgate.security.trustroot import TrustRoot


def _file_sha256(path: Path) -> str:
    # The binding's digest, imported when a rule names one: the server's start reads this module for
    # `workspace_policy_files` alone.
    from perfgate.execution.binding import file_sha256

    return file_sha256(path)


__all__ = [
    "AllowRule",
    "ExecutionPolicy",
    "PolicyError",
    "load_policy",
    "policy_paths",
    "workspace_policy_files",
]

DEFAULT_MAX_TIMEOUT_S = 3600.0
DEFAULT_PENDING_TTL_S = 24 * 3600.0
DEFAULT_GRANT_TTL_S = 2 * 3600.0
DEFAULT_GRANT_RUNS = 8
"""A human's grant covers this command and code for this many calls (`perfgate.execution.scope`)."""
DEFAULT_ALLOW_ENV = ("PERFGATE_*",)
"""perfgate's own harness variables; nothing else reads them."""

_POLICY_KEYS = {
    "max_timeout_s",
    "cwd_roots",
    "allow_env",
    "allow",
    "pending_ttl_s",
    "grant_ttl_s",
    "grant_runs",
}
_RULE_KEYS = {"argv", "env", "exact", "name", "script", "module", "sha256", "code_state", "code"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


class PolicyError(ValueError):
    """The operator's policy file is missing a piece, has an unknown key or a wrong type."""


def policy_paths(workspace: Path) -> tuple[Path, Path]:
    """The two workspace files an older perfgate read a policy from; now only reported, never obeyed."""
    return (workspace / "perfgate.toml", workspace / ".perfgate" / "policy.toml")


def workspace_policy_files(workspace: Path) -> list[Path]:
    """Workspace files that define ``[execution]``: ignored (the agent can write them), to be reported."""
    found: list[Path] = []
    for path in policy_paths(workspace.resolve()):
        try:
            if path.is_file() and re.search(r"(?m)^\s*\[\[?\s*execution", path.read_text(errors="replace")):
                found.append(path)
        except OSError:
            continue
    return found


@dataclass(frozen=True)
class AllowRule:
    """A command that may run without a human: the script or module it runs, its code, argv patterns."""

    argv: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    exact: bool = False
    name: str = ""
    script: Path | None = None
    module: str | None = None
    sha256: str | None = None
    code_state: str | None = None
    any_code: bool = False

    def label(self) -> str:
        if self.name:
            return self.name
        if self.script is None and self.module is None:
            return " ".join(self.argv)
        what = str(self.script) if self.script else f"-m {self.module}"
        return what + (f" (sha256 {self.sha256[:12]})" if self.sha256 else " (any code)")

    def matches_argv(self, argv: tuple[str, ...]) -> bool:
        """Whether the patterns match the user's command (``argv`` with perfgate's harness removed)."""
        user = user_argv(argv)
        if len(user) < len(self.argv) or (self.exact and len(user) != len(self.argv)):
            return False
        return all(
            fnmatch.fnmatchcase(token, pattern)
            for token, pattern in zip(user[: len(self.argv)], self.argv, strict=True)
        )

    def why_not(self, request: CommandRequest) -> str | None:
        """None when the command, its target and its code match this rule; else the reason."""
        if not self.matches_argv(request.argv):
            return "argv does not match"
        if self.script is None and self.module is None:
            return None
        target = command_target(request.argv)
        if target is None:
            return "the command runs no script or module perfgate can name"
        if self.module is not None:
            if target.kind != "module" or target.name != self.module:
                return f"it does not run module {self.module}"
        else:
            found = target.file(request.cwd) if target.kind != "module" else None
            if found is None or self.script is None or found != self.script.resolve():
                return f"it does not run {self.script}"
        if self.sha256 is not None:
            found = target.file(request.cwd)
            if found is None or _file_sha256(found) != self.sha256:
                return f"{target.name} changed since the operator pinned it (sha256 {self.sha256[:12]})"
        if self.code_state is not None and (
            request.code is None or request.code.workspace != self.code_state
        ):
            state = request.code.summary if request.code is not None else "not bound"
            return (
                f"the workspace's code changed since the operator pinned {target.name} (code state "
                f"{self.code_state[:12]}; now {state})"
            )
        return None


@dataclass(frozen=True)
class ExecutionPolicy:
    """A loaded policy. ``source`` is the file it came from (None: built-in defaults)."""

    workspace: Path
    allow: tuple[AllowRule, ...] = ()
    max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S
    cwd_roots: tuple[Path, ...] = ()
    allow_env: tuple[str, ...] = DEFAULT_ALLOW_ENV
    pending_ttl_s: float = DEFAULT_PENDING_TTL_S
    grant_ttl_s: float = DEFAULT_GRANT_TTL_S
    grant_runs: int = DEFAULT_GRANT_RUNS
    source: Path | None = None
    _roots: tuple[Path, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        roots = self.cwd_roots or (self.workspace,)
        object.__setattr__(self, "_roots", tuple(r.resolve() for r in roots))

    @property
    def roots(self) -> tuple[Path, ...]:
        """Resolved directories a command may run in (the workspace when none are configured)."""
        return self._roots

    def limit_violations(self, request: CommandRequest) -> list[str]:
        """Why this request may not run at all, whoever approves it; empty when within limits."""
        problems: list[str] = []
        if request.timeout_s > self.max_timeout_s:
            problems.append(
                f"timeout {request.timeout_s:g} s exceeds the operator's max_timeout_s {self.max_timeout_s:g} s"
            )
        cwd = request.cwd.resolve()
        if not any(cwd == root or root in cwd.parents for root in self.roots):
            allowed = ", ".join(str(r) for r in self.roots)
            problems.append(f"working directory {cwd} is outside the allowed roots ({allowed})")
        return problems

    def match(self, request: CommandRequest) -> AllowRule | None:
        """The first allowlist rule that lets this request run without asking, or None.

        A Slurm submission never matches: it spends cluster resources (nodes, GRES, a partition's time)
        that a rule about the user's command does not describe, so a human approves each one.
        """
        if is_slurm_submission(request.argv):
            return None
        for rule in self.allow:
            if rule.why_not(request) is not None:
                continue
            patterns = (*self.allow_env, *rule.env)
            if all(any(fnmatch.fnmatchcase(key, p) for p in patterns) for key in request.env):
                return rule
        return None

    def describe_source(self) -> str:
        return str(self.source) if self.source else "built-in defaults (no policy file)"


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in cast("list[object]", value)):
        raise PolicyError(f"{where} must be a list of strings")
    return tuple(cast("list[str]", value))


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PolicyError(f"{where} must be a positive number of seconds")
    return float(value)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise PolicyError(f"{where} must be a whole number of calls from 1 to 1000")
    return value


def _rule(raw: object, index: int, source: Path, workspace: Path) -> AllowRule:
    where = f"{source}: execution.allow[{index}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where} must be a table with a script, module or argv")
    table = cast("dict[str, object]", raw)
    unknown = set(table) - _RULE_KEYS
    if unknown:
        hint = (
            " (the old `argv` prefix rules matched perfgate's harness wrapper; name the script instead)"
            if "argv" in table
            else ""
        )
        raise PolicyError(f"{where} has unknown keys {sorted(unknown)} (allowed: {sorted(_RULE_KEYS)}){hint}")
    argv = _strings(table.get("argv", []), f"{where}.argv")
    exact, name, script, module = (
        table.get(k, d) for k, d in (("exact", False), ("name", ""), ("script", None), ("module", None))
    )
    sha256, code, code_state = table.get("sha256"), table.get("code"), table.get("code_state")
    if not isinstance(exact, bool) or not isinstance(name, str):
        raise PolicyError(f"{where}: exact must be true/false and name a string")
    if (script is not None and not isinstance(script, str)) or (
        module is not None and not isinstance(module, str)
    ):
        raise PolicyError(f"{where}: script and module must be strings")
    if script is not None and module is not None:
        raise PolicyError(f"{where}: give script or module, not both")
    if not argv and script is None and module is None:
        raise PolicyError(f"{where} needs a script, a module or an argv list")
    if argv and not argv[0]:
        raise PolicyError(f"{where}.argv must name at least the program")
    if sha256 is not None and (not isinstance(sha256, str) or not _SHA256.fullmatch(sha256.lower())):
        raise PolicyError(f"{where}.sha256 must be 64 hex digits (`perfgate policy pin FILE` prints it)")
    if sha256 is not None and script is None and module is None:
        raise PolicyError(f"{where}: sha256 pins the script or module; name one")
    if code_state is not None and (
        not isinstance(code_state, str) or not _SHA256.fullmatch(code_state.lower())
    ):
        raise PolicyError(f"{where}.code_state must be 64 hex digits (`perfgate policy pin FILE` prints it)")
    if sha256 is not None and code_state is None:
        raise PolicyError(
            f"{where} pins the file but not the workspace's code state, so a module it imports could change "
            'unasked: add code_state = "<digest>" (`perfgate policy pin FILE` prints both lines)'
        )
    if code not in (None, "any", "pinned"):
        raise PolicyError(f'{where}.code must be "any" (no pin) or "pinned" (with sha256)')
    if sha256 is None and code != "any":
        raise PolicyError(
            f'{where} pins no code: add sha256 = "<the file\'s sha256>" (`perfgate policy pin FILE` prints it), '
            'or code = "any" to let whatever the file holds run without asking'
        )
    script_path: Path | None = None
    if isinstance(script, str):
        script_path = Path(script).expanduser()
        script_path = script_path if script_path.is_absolute() else workspace / script_path
    return AllowRule(
        argv=argv,
        env=_strings(table.get("env", []), f"{where}.env"),
        exact=exact,
        name=name,
        script=script_path,
        module=module if isinstance(module, str) else None,
        sha256=sha256.lower() if isinstance(sha256, str) else None,
        code_state=code_state.lower() if isinstance(code_state, str) else None,
        any_code=code == "any",
    )


def _from_table(workspace: Path, table: Mapping[str, Any], source: Path) -> ExecutionPolicy:
    unknown = set(table) - _POLICY_KEYS
    if unknown:
        raise PolicyError(
            f"{source}: [execution] has unknown keys {sorted(unknown)} (allowed: {sorted(_POLICY_KEYS)})"
        )
    raw_rules: object = table.get("allow", [])
    if not isinstance(raw_rules, list):
        raise PolicyError(f"{source}: execution.allow must be an array of tables ([[execution.allow]])")
    rules = tuple(_rule(r, i, source, workspace) for i, r in enumerate(cast("list[object]", raw_rules)))
    roots = tuple(
        (Path(r).expanduser() if Path(r).expanduser().is_absolute() else workspace / r)
        for r in _strings(table.get("cwd_roots", ["."]), f"{source}: execution.cwd_roots")
    )
    return ExecutionPolicy(
        workspace=workspace,
        allow=rules,
        max_timeout_s=_number(table.get("max_timeout_s", DEFAULT_MAX_TIMEOUT_S), f"{source}: max_timeout_s"),
        cwd_roots=roots,
        allow_env=_strings(table.get("allow_env", list(DEFAULT_ALLOW_ENV)), f"{source}: execution.allow_env"),
        pending_ttl_s=_number(table.get("pending_ttl_s", DEFAULT_PENDING_TTL_S), f"{source}: pending_ttl_s"),
        grant_ttl_s=_number(table.get("grant_ttl_s", DEFAULT_GRANT_TTL_S), f"{source}: grant_ttl_s"),
        grant_runs=_count(table.get("grant_runs", DEFAULT_GRANT_RUNS), f"{source}: grant_runs"),
        source=source,
    )


def _read_toml(path: Path) -> dict[str, Any]:
    # Imported here, not at start-up: most workspaces have no policy file.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"cannot read the execution policy {path}: {exc}") from exc


def load_policy(workspace: Path, trust: TrustRoot | None = None) -> ExecutionPolicy:
    """Read the operator's policy from the trust root; built-in defaults (nothing allowlisted) without one.

    Workspace policy files are not read (see `workspace_policy_files`).

    Raises:
        PolicyError: the policy file is unreadable or invalid.
    """
    workspace = workspace.resolve()
    path = (trust or TrustRoot.locate()).policy_file
    if not path.is_file():
        return ExecutionPolicy(workspace=workspace)
    table: object = _read_toml(path).get("execution")
    if table is None:
        return ExecutionPolicy(workspace=workspace, source=path)
    if not isinstance(table, dict):
        raise PolicyError(f"{path}: execution must be a table ([execution])")
    return _from_table(workspace, cast("dict[str, Any]", table), path)
