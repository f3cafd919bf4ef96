"""The operator's execution policy: what may run without asking, and the limits on every run.

The policy is operator configuration read from the workspace, never model input, and no tool writes it.
It lives in the ``[execution]`` table of ``<workspace>/perfgate.toml`` or of
``<workspace>/.perfgate/policy.toml`` (one of them; both is an error)::

    [execution]
    max_timeout_s = 3600             # hard limit on every run, approved or not
    cwd_roots = [".", "/scratch/me"] # working directories allowed (relative = to the workspace)
    allow_env = ["PERFGATE_*", "CUDA_VISIBLE_DEVICES"]  # keys an allowlisted run may set
    pending_ttl_s = 86400            # a pending approval expires after this
    grant_ttl_s = 28800              # a human's grant is reusable for the same digest this long

    [[execution.allow]]
    argv = ["python", "train.py"]    # prefix, one fnmatch pattern per token
    env = ["OMP_NUM_THREADS"]        # extra keys this rule lets the run set
    exact = false                    # true: no arguments beyond the prefix

An allowlist rule matches a request when each pattern matches the argv token at its position and every
environment variable the request sets is allowed. A request that matches no rule goes to a human; the
limits (timeout, working directory) bind every request whoever approves it.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from perfgate.execution.request import CommandRequest

__all__ = [
    "AllowRule",
    "ExecutionPolicy",
    "PolicyError",
    "load_policy",
    "policy_paths",
]

DEFAULT_MAX_TIMEOUT_S = 3600.0
DEFAULT_PENDING_TTL_S = 24 * 3600.0
DEFAULT_GRANT_TTL_S = 8 * 3600.0
DEFAULT_ALLOW_ENV = ("PERFGATE_*",)
"""perfgate's own harness variables; nothing else reads them."""

_POLICY_KEYS = {"max_timeout_s", "cwd_roots", "allow_env", "allow", "pending_ttl_s", "grant_ttl_s"}
_RULE_KEYS = {"argv", "env", "exact", "name"}


class PolicyError(ValueError):
    """The operator's policy file is missing a piece, has an unknown key or a wrong type."""


def policy_paths(workspace: Path) -> tuple[Path, Path]:
    """The two places the policy may live; tools must treat both as read-only."""
    return (workspace / "perfgate.toml", workspace / ".perfgate" / "policy.toml")


@dataclass(frozen=True)
class AllowRule:
    """argv prefix patterns that may run without a human's approval."""

    argv: tuple[str, ...]
    env: tuple[str, ...] = ()
    exact: bool = False
    name: str = ""

    def label(self) -> str:
        return self.name or " ".join(self.argv)

    def matches_argv(self, argv: tuple[str, ...]) -> bool:
        if len(argv) < len(self.argv) or (self.exact and len(argv) != len(self.argv)):
            return False
        return all(
            fnmatch.fnmatchcase(token, pattern)
            for token, pattern in zip(argv[: len(self.argv)], self.argv, strict=True)
        )


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
        """The first allowlist rule that lets this request run without asking, or None."""
        for rule in self.allow:
            if not rule.matches_argv(request.argv):
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


def _rule(raw: object, index: int, source: Path) -> AllowRule:
    where = f"{source}: execution.allow[{index}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where} must be a table with an argv list")
    table = cast("dict[str, object]", raw)
    unknown = set(table) - _RULE_KEYS
    if unknown:
        raise PolicyError(f"{where} has unknown keys {sorted(unknown)} (allowed: {sorted(_RULE_KEYS)})")
    if "argv" not in table:
        raise PolicyError(f"{where} needs an argv list")
    argv = _strings(table["argv"], f"{where}.argv")
    if not argv or not argv[0]:
        raise PolicyError(f"{where}.argv must name at least the program")
    exact = table.get("exact", False)
    name = table.get("name", "")
    if not isinstance(exact, bool) or not isinstance(name, str):
        raise PolicyError(f"{where}: exact must be true/false and name a string")
    return AllowRule(argv=argv, env=_strings(table.get("env", []), f"{where}.env"), exact=exact, name=name)


def _from_table(workspace: Path, table: Mapping[str, Any], source: Path) -> ExecutionPolicy:
    unknown = set(table) - _POLICY_KEYS
    if unknown:
        raise PolicyError(
            f"{source}: [execution] has unknown keys {sorted(unknown)} (allowed: {sorted(_POLICY_KEYS)})"
        )
    raw_rules: object = table.get("allow", [])
    if not isinstance(raw_rules, list):
        raise PolicyError(f"{source}: execution.allow must be an array of tables ([[execution.allow]])")
    rules = tuple(_rule(r, i, source) for i, r in enumerate(cast("list[object]", raw_rules)))
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


def load_policy(workspace: Path) -> ExecutionPolicy:
    """Read the workspace's policy; built-in defaults (nothing allowlisted) when there is none.

    Raises:
        PolicyError: a policy file is unreadable or invalid, or both files define ``[execution]``.
    """
    workspace = workspace.resolve()
    found: list[tuple[Path, Mapping[str, Any]]] = []
    for path in policy_paths(workspace):
        if not path.is_file():
            continue
        table: object = _read_toml(path).get("execution")
        if table is None:
            continue
        if not isinstance(table, dict):
            raise PolicyError(f"{path}: execution must be a table ([execution])")
        found.append((path, cast("dict[str, Any]", table)))
    if len(found) > 1:
        raise PolicyError(
            f"both {found[0][0]} and {found[1][0]} define [execution]; keep the policy in one of them"
        )
    if not found:
        return ExecutionPolicy(workspace=workspace)
    source, table = found[0]
    return _from_table(workspace, table, source)
