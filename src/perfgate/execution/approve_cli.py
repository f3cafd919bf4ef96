"""``perfgate approve ID`` and ``perfgate approvals``: a human grants pending commands in a terminal.

``approve`` shows the full request (with the code it binds) and reads the confirmation from the
controlling terminal (``/dev/tty``), never from stdin, and refuses when stdin is not a terminal or there
is no controlling terminal.

What that check does and does not stop, honestly: an agent's plain shell tool has no terminal, so a bare
``perfgate approve`` from it fails. An agent that can start a pseudo-terminal (``script``, ``pty.fork``,
``expect``) passes the TTY check. What stops it then is the trust root: a grant is a signed row in the
operator's state directory, so ``approve`` run by an agent that cannot write (or read the key in) that
directory fails, whatever terminal it fakes. Run the agent as another user or in a sandbox that confines
its writes to the workspace, and prefer approving through the agent host's own prompt (elicitation).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from perfgate.evidence import STATE_DIR_NAME, Ledger
from perfgate.execution.approvals import Approval, ApprovalStatus, ApprovalStore, ApprovalStoreError
from perfgate.execution.audit import Decision, How, operator_identity, record_decision
from perfgate.execution.gate import ApprovalGate, approval_view, approve_command, change_store
from perfgate.execution.policy import ExecutionPolicy, PolicyError, load_policy
from perfgate.execution.scope import ApprovalScope, measuring_variable
from perfgate.security.trustroot import TrustRoot, TrustRootError

__all__ = ["EXIT_NO_TTY", "approve", "list_approvals"]

EXIT_NO_TTY = 3
"""Exit status when ``approve`` refuses because no human terminal is attached."""


def _utc(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")


def _open(workspace: Path, trust: TrustRoot | None) -> tuple[ApprovalStore, Ledger] | str | None:
    """The store and ledger, None when the workspace has no perfgate state, or why the trust root failed."""
    if not (workspace / STATE_DIR_NAME).is_dir():
        return None
    trust = trust or TrustRoot.locate()
    try:
        return ApprovalStore.open(workspace, trust), Ledger(workspace, trust)
    except (TrustRootError, OSError) as exc:
        return (
            f"cannot open the trust root ({trust.state_dir}): {exc}. Approvals are the operator's: run this as "
            "the user who runs the perfgate server, with the same --state-dir / PERFGATE_STATE_DIR"
        )


def _expire(workspace: Path, store: ApprovalStore, ledger: Ledger) -> None:
    try:
        policy = load_policy(workspace, ledger.trust)
    except PolicyError as exc:
        ApprovalGate(workspace, ledger, store, None, str(exc)).expire_due()
        return
    ApprovalGate(workspace, ledger, store, policy).expire_due()


def _scope_line(policy: ExecutionPolicy, runs: int, vary: tuple[str, ...]) -> str:
    varied = f", any value of {', '.join(vary)}" if vary else ""
    return (
        f'"yes" grants this command{varied} with this code, up to {runs} call(s) within '
        f"{policy.grant_ttl_s / 3600:g} h; another command, other code, a further call or a later one asks "
        "again."
    )


def _show(
    approval: Approval,
    workspace: Path,
    store: ApprovalStore,
    policy: ExecutionPolicy,
    runs: int,
    vary: tuple[str, ...],
) -> str:
    again = store.why_asked_again(approval.request) if approval.printed is None else None
    view = approval_view(
        approval.request,
        approval.request.describe(approval.tool, measuring_variable) + f"\nfull digest: {approval.digest}",
        workspace,
        change_store(store),
        _scope_line(policy, runs, vary),
        store.last_grant(approval.tool),
        approval.printed,
    )
    return (
        f"approval {approval.id} ({approval.status.value}), requested {_utc(approval.created_at)}, "
        f"expires {_utc(approval.expires_at)}" + (f"; asked again: {again}" if again else "") + f"\n{view}\n"
    )


def approve(
    workspace: Path,
    approval_id: str,
    *,
    deny: bool = False,
    runs: int | None = None,
    vary: tuple[str, ...] = (),
    stdin: TextIO | None = None,
    tty_path: str = "/dev/tty",
    trust: TrustRoot | None = None,
) -> int:
    """Grant (or with ``deny``, refuse) one pending approval; returns the process exit status.

    A grant needs a human at a terminal: stdin must be a TTY and the confirmation is read from
    ``tty_path``. A denial needs no terminal (refusing is always safe). A grant covers this command and
    code for ``runs`` calls (default: the operator policy's ``grant_runs``) within the policy's
    ``grant_ttl_s``; ``vary`` names flags whose values may differ between those calls.
    """
    stdin = stdin if stdin is not None else sys.stdin
    workspace = workspace.resolve()
    opened = _open(workspace, trust)
    if opened is None:
        print(f"perfgate: no perfgate state in {workspace} (is --workspace right?)", file=sys.stderr)
        return 2
    if isinstance(opened, str):
        print(f"perfgate: {opened}", file=sys.stderr)
        return 2
    store, ledger = opened
    _expire(workspace, store, ledger)
    approval = store.get(approval_id)
    if approval is None:
        print(
            f"perfgate: no approval {approval_id!r} in {workspace}; see `perfgate approvals`", file=sys.stderr
        )
        return 2
    if approval.status is not ApprovalStatus.PENDING:
        print(f"perfgate: approval {approval_id} is {approval.status.value}, not pending", file=sys.stderr)
        return 2
    try:
        policy = load_policy(workspace, ledger.trust)
        scope = ApprovalScope(template="-", code=("-",), runs=runs or policy.grant_runs, vary=vary)
    except PolicyError as exc:
        print(f"perfgate: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"perfgate: --runs is 1 to 1000 and --vary takes flags such as --lr ({exc})", file=sys.stderr)
        return 2

    if deny:
        return _decide(
            workspace,
            store,
            ledger,
            approval,
            grant=False,
            grant_ttl_s=policy.grant_ttl_s,
            runs=scope.runs,
            vary=scope.vary,
        )

    if stdin is None or not stdin.isatty():  # sys.stdin is None when there is no stdin at all
        print(
            "perfgate: refusing to approve without a terminal: a human must run `perfgate approve` "
            "interactively (stdin is not a TTY).",
            file=sys.stderr,
        )
        return EXIT_NO_TTY
    try:
        # Two handles: a terminal is not seekable, which a single read-write text file requires.
        with open(tty_path, encoding="utf-8") as tty_in, open(tty_path, "w", encoding="utf-8") as tty_out:
            tty_out.write(_show(approval, workspace, store, policy, scope.runs, scope.vary))
            tty_out.write(
                '\nRun this command when the agent repeats its call? Type "yes" to approve, "no" to deny,\n'
            )
            tty_out.write("anything else leaves it pending: ")
            tty_out.flush()
            answer = tty_in.readline().strip().lower()
    except OSError as exc:
        print(f"perfgate: refusing to approve: no controlling terminal ({exc}).", file=sys.stderr)
        return EXIT_NO_TTY
    if answer == "yes":
        return _decide(
            workspace,
            store,
            ledger,
            approval,
            grant=True,
            grant_ttl_s=policy.grant_ttl_s,
            runs=scope.runs,
            vary=scope.vary,
        )
    if answer == "no":
        return _decide(
            workspace,
            store,
            ledger,
            approval,
            grant=False,
            grant_ttl_s=policy.grant_ttl_s,
            runs=scope.runs,
            vary=scope.vary,
        )
    print(f"perfgate: approval {approval.id} left pending")
    return 1


def _decide(
    workspace: Path,
    store: ApprovalStore,
    ledger: Ledger,
    approval: Approval,
    *,
    grant: bool,
    grant_ttl_s: float,
    runs: int,
    vary: tuple[str, ...],
) -> int:
    who = operator_identity()
    try:
        decided = store.decide(
            approval.id, grant=grant, who=who, grant_ttl_s=grant_ttl_s, runs=runs, vary=vary
        )
    except ApprovalStoreError as exc:
        print(f"perfgate: {exc}", file=sys.stderr)
        return 2
    evidence_id = record_decision(
        ledger,
        tool=decided.tool,
        request=decided.request,
        decision=Decision.APPROVED if grant else Decision.DENIED,
        how=How.CLI_GRANT,
        who=who,
        approval_id=decided.id,
        detail={"event": "granted" if grant else "denied", "valid_until": _utc(decided.expires_at)}
        | ({"scope": decided.scope.model_dump(mode="json")} if decided.scope else {}),
    )
    store.set_evidence(decided.id, evidence_id)
    if grant:
        code = decided.request.code
        if code is not None:
            change_store(store).mark_approved(code.tree, decided.id, decided.decided_at or 0.0)
        calls = f"up to {decided.scope.runs} call(s)" if decided.scope else "any number of calls"
        print(
            f"approved {decided.id} (evidence {evidence_id}); the agent can now repeat the same call. "
            f"It covers this command with this code, {calls}, until {_utc(decided.expires_at)}."
        )
    else:
        print(f"denied {decided.id} (evidence {evidence_id}); the same command is refused until it expires.")
    return 0


def list_approvals(
    workspace: Path,
    *,
    include_closed: bool = False,
    as_json: bool = False,
    out: TextIO | None = None,
    trust: TrustRoot | None = None,
) -> int:
    """Print pending and granted approvals (all of them with ``include_closed``); returns the exit status."""
    out = out if out is not None else sys.stdout
    if out is None:  # sys.stdout is None when there is no stdout
        return 2
    workspace = workspace.resolve()
    opened = _open(workspace, trust)
    rejected: list[str] = []
    if isinstance(opened, str):
        print(f"perfgate: {opened}", file=sys.stderr)
        return 2
    if opened is None:
        rows: list[Approval] = []
    else:
        store, ledger = opened
        _expire(workspace, store, ledger)
        statuses = (
            tuple(ApprovalStatus) if include_closed else (ApprovalStatus.PENDING, ApprovalStatus.GRANTED)
        )
        rows = store.list(statuses)
        store.list(tuple(ApprovalStatus))
        rejected = store.rejected
    for approval_id in rejected:
        print(
            f"perfgate: approval row {approval_id} fails its signature check (edited outside perfgate); ignored",
            file=sys.stderr,
        )
    if as_json:
        out.write(json.dumps([r.model_dump(mode="json") for r in rows], indent=2) + "\n")
        return 0
    if not rows:
        out.write("no approvals" + ("" if include_closed else " pending or granted") + f" in {workspace}\n")
        return 0
    for r in rows:
        who = f" by {r.decided_by}" if r.decided_by else ""
        out.write(
            f"{r.id}  {r.status.value:<8} {r.tool:<22} expires {_utc(r.expires_at)}  uses {r.uses}"
            f"{f' of {r.scope.runs}' if r.scope else ''}{who}\n"
            f"    {json.dumps(list(r.request.argv))}  cwd {r.request.cwd}  digest {r.digest[:12]}\n"
        )
        if r.status is ApprovalStatus.PENDING:
            out.write(f"    approve with: {approve_command(r.id, workspace)}\n")
    return 0
