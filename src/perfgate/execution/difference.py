"""What changed in a command since the last approved run: its argv tokens, environment, directory, timeout.

A human approving a run reads what differs from the run approved before, as the code's diff shows for
files (`perfgate.execution.changes`): the argv tokens replaced, added or removed, the variables added,
removed or changed. The variables perfgate sets for its harness (`perfgate.execution.scope.
measuring_variable`: windows, profile schedule, output folders) are not the human's and are left out; the
request's own rendering counts them on one line.

Values are compared by the sha256 each approval keeps of the real values (`request_print`), so a secret
that changed shows as changed though both sides are shown redacted.
"""

from __future__ import annotations

import difflib
import json
from datetime import datetime, timezone
from typing import Any

from perfgate.execution.approvals import Approval
from perfgate.execution.request import CommandRequest, redact_request
from perfgate.execution.scope import measuring_variable, request_print

__all__ = ["MAX_CHANGES", "command_changes", "pair_changes"]

MAX_CHANGES = 12
"""argv or env changes listed per line at most (the rest are counted)."""


def _q(value: str) -> str:
    # ASCII-escaped: a value cannot redraw the human's terminal.
    return json.dumps(value)


def _listed(items: list[str]) -> str:
    more = len(items) - MAX_CHANGES
    return "; ".join(items[:MAX_CHANGES]) + (f"; and {more} more" if more > 0 else "")


def command_changes(
    request: CommandRequest, base: Approval | None, printed: dict[str, Any] | None = None
) -> list[str]:
    """Lines saying how ``request`` differs from the request of ``base`` (the last grant): argv and env
    always (``no change`` included; named ``arguments`` and ``environment``, apart from the request's own
    ``argv:`` and ``env:`` lines), the working directory and timeout where they changed. ``printed``:
    the request's `request_print` where ``request`` is a stored (redacted) one."""
    if base is None:
        return ["arguments, environment: no approved run to compare with"]
    since = f"since the last approved run ({base.id}, {_utc(base.decided_at or base.created_at)})"
    if base.printed is not None:
        then, now = base.printed, printed or request_print(request)
    else:  # a grant stored before prints were kept: compare what both sides show
        then, now = request_print(base.request), request_print(redact_request(request))
    argv, env = _argv_env_changes(base.request, request, then, now)
    lines = [f"arguments: changed {since}: {_listed(argv)}" if argv else f"arguments: no change {since}"]
    since = "since then"
    lines.append(
        f"environment: changed {since}: {_listed(env)}" if env else f"environment: no change {since}"
    )
    if then["cwd"] != now["cwd"]:
        lines.append(f"directory: changed {since}: {_q(str(base.request.cwd))} -> {_q(str(request.cwd))}")
    if float(then["timeout_s"]) != float(now["timeout_s"]):
        lines.append(f"timeout: changed {since}: {base.request.timeout_s:g} s -> {request.timeout_s:g} s")
    return lines


def pair_changes(request: CommandRequest, printed: dict[str, Any] | None = None) -> list[str]:
    """Lines saying how a pair's candidate (B) differs from its baseline (A), in arguments and environment
    (perfgate's own variables left out); empty for a single request. ``printed``: as in `command_changes`."""
    if request.paired is None:
        return []
    now = printed or request_print(request)
    argv, env = _argv_env_changes(request, request.paired, now, now["paired"])
    ref = request.code_ref
    return [
        "candidate (B) against baseline (A): "
        + (f"arguments {_listed(argv)}" if argv else "same arguments")
        + "; "
        + (f"environment {_listed(env)}" if env else "same environment")
        + (
            f"; code: A runs {ref.describe()} ({_listed([_q(f) for f in sorted(ref.files)])}), B the working tree"
            if ref is not None
            else "; same code"
        )
    ]


def _argv_env_changes(
    old: CommandRequest, new: CommandRequest, then: dict[str, Any], now: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The argv tokens replaced, added or removed and the variables added, removed or changed from ``old``
    to ``new``, compared by their prints ``then`` and ``now`` (values shown as each request holds them)."""
    argv: list[str] = []
    matcher = difflib.SequenceMatcher(
        None, [t[0] for t in then["argv"]], [t[0] for t in now["argv"]], autojunk=False
    )
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        was = " ".join(_q(t) for t in old.argv[i1:i2])
        got = " ".join(_q(t) for t in new.argv[j1:j2])
        if op == "replace":
            argv.append(f"argv[{j1}] {was} -> {got}")
        elif op == "insert":
            argv.append(f"argv[{j1}] + {got}")
        elif op == "delete":
            argv.append(f"argv[{j1}] - {was}")
    old_env: dict[str, Any] = {k: v for k, v in then["env"].items() if not measuring_variable(k)}
    new_env: dict[str, Any] = {k: v for k, v in now["env"].items() if not measuring_variable(k)}
    env: list[str] = []
    for name in sorted(old_env.keys() | new_env.keys()):
        if name not in old_env:
            env.append(f"+ {name}={_q(new.env[name])}")
        elif name not in new_env:
            env.append(f"- {name}")
        elif old_env[name] != new_env[name]:
            env.append(f"{name} {_q(old.env.get(name, ''))} -> {_q(new.env[name])}")
    return argv, env


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")
