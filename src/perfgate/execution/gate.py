"""The approval gate, without the protocol: allowlist, human grants, elicitation outcomes, pending ids.

Order for one request (read-only servers never get here: they do not register command tools):

1. the operator's limits (max timeout, cwd roots) bind every request; a violation is refused outright;
2. an allowlist rule that matches -> approved (``how=allowlist``);
3. a human's unexpired denial of the same digest -> refused;
4. a human's unexpired grant whose scope covers the request (same command, code in scope, calls left;
   `perfgate.execution.scope`) -> approved and counted (``how=cli_grant``, or ``elicitation`` for a grant
   given in the client);
5. otherwise the protocol layer asks through elicitation when the client supports it (`elicitation_message`,
   then `settle_elicitation`, which stores an accepted answer as a scoped grant), or calls `require_human`, which opens a pending approval and raises a
   `ToolError` telling the agent the exact ``perfgate approve`` command for the human.

Every decision is appended to the ledger (`perfgate.execution.audit`). The methods are synchronous (SQLite);
the protocol layer calls them from a worker thread.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, Field

from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.execution.approvals import Approval, ApprovalStatus, ApprovalStore
from perfgate.execution.audit import Decision, How, record_decision
from perfgate.execution.changes import ChangeStore, change_view
from perfgate.execution.difference import command_changes, pair_changes
from perfgate.execution.policy import ExecutionPolicy
from perfgate.execution.request import CommandRequest, redact_request
from perfgate.execution.scope import ApprovalScope, measuring_variable, request_print
from perfgate.execution.target import harness_entries

__all__ = ["ApprovalGate", "ConsentForm", "Grant", "approval_view", "approve_command", "change_store"]

ElicitAction = Literal["accept", "decline", "cancel"]


class ConsentForm(BaseModel):
    """What the human fills in when asked through elicitation: accepting is the approval itself."""

    note: str = Field(
        default="",
        max_length=500,
        title="Note (optional)",
        description="Kept with the decision in the evidence ledger.",
    )


@dataclass(frozen=True)
class Grant:
    """Permission for one tool call to run exactly the request with this digest (code binding included).

    ``base_digest`` is the digest without the code binding: when only that still matches at run time,
    the code changed after approval.
    """

    digest: str
    how: How
    who: str
    evidence_id: str
    approval_id: str | None = None
    base_digest: str = ""


def approve_command(approval_id: str, workspace: Path) -> str:
    """The exact shell line a human runs to approve ``approval_id`` in ``workspace``."""
    return f"perfgate approve {approval_id} --workspace {shlex.quote(str(workspace))}"


def _shown(request: CommandRequest, tool: str) -> str:
    """The request as shown outside the approval itself: secrets redacted, perfgate's own harness
    variables counted on one line."""
    return redact_request(request).describe(tool, measuring_variable)


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")


def change_store(store: ApprovalStore) -> ChangeStore:
    """The approved-code store beside ``store`` in the workspace's trust-root folder."""
    return ChangeStore(store.db_path.parent / "code")


def grants_line(policy: ExecutionPolicy, verb: str) -> str:
    hours = policy.grant_ttl_s / 3600
    return (
        f"{verb} grants this command with this code (timed, profiled or captured by perfgate), up to "
        f"{policy.grant_runs} call(s) within {hours:g} h; "
        "another command, other code, a further call or a later one asks again."
    )


def approval_view(
    request: CommandRequest,
    shown: str,
    workspace: Path,
    changes: ChangeStore,
    scope_line: str,
    base: Approval | None,
    printed: dict[str, Any] | None = None,
) -> str:
    """What a human reads before approving: the deciding lines (programs inside the workspace, perfgate
    internals, untracked importable files, what changed in the code, the argv and the environment since
    ``base``, the last approved run; ``printed``: the print of a stored request), the scope, the request, then the bounded diff. Secrets the request
    carries are scrubbed from the text shown."""
    from perfgate.security.scrubber import Scrubber

    code = request.code
    against = request.code_ref.commit if request.code_ref is not None else None
    lead, diff = change_view(code.tree, code.executables, workspace, changes, against) if code else ([], [])
    lead = pair_changes(request, printed) + lead + command_changes(request, base, printed)
    scrub = Scrubber.for_values(request.env, request.argv)
    text = "\n".join([*lead, scope_line, "", shown])
    if diff:
        text += "\n\nthe change (unified diff, at most the first lines):\n" + "\n".join(diff)
    return scrub.text(text)


class ApprovalGate:
    """Decides whether a request may run, and records each decision in the ledger."""

    def __init__(
        self,
        workspace: Path,
        ledger: Ledger,
        store: ApprovalStore,
        policy: ExecutionPolicy | None,
        policy_error: str | None = None,
        ignored_policy_files: tuple[Path, ...] = (),
    ) -> None:
        assert (policy is None) != (policy_error is None), "either a policy or the reason it failed to load"
        self.ignored_policy_files = ignored_policy_files
        self.workspace = workspace
        self.ledger = ledger
        self.store = store
        self._policy = policy
        self._policy_error = policy_error

    @property
    def policy(self) -> ExecutionPolicy:
        """The loaded policy.

        Raises:
            ToolError: the operator's policy file is invalid (nothing may run until it is fixed).
        """
        if self._policy is None:
            raise ToolError(
                f"commands are disabled: the operator's execution policy is invalid ({self._policy_error})\n"
                "next: ask the user to fix that file and restart the perfgate server (tools that run no "
                "command still work)"
            )
        return self._policy

    def check_limits(self, request: CommandRequest) -> None:
        """Refuse a request outside the operator's limits, whoever would approve it.

        Raises:
            ToolError: timeout above the maximum, or a working directory outside the allowed roots.
        """
        problems = [p for side in request.sides for p in self.policy.limit_violations(side)]
        problems += [p for side in request.sides for p in self._foreign_harness(side)]
        if problems:
            raise ToolError(
                "this command cannot run here: "
                + "; ".join(problems)
                + f" (operator policy: {self.policy.describe_source()})\n"
                "next: change the request to fit those limits, or ask the user to change the policy"
            )

    def _without_own_env(self, request: CommandRequest) -> CommandRequest:
        """``request`` less the variables perfgate sets itself with its own values (the bytecode cache in
        the trust root, unbuffered output for a log-timed launch): the operator's ``allow_env`` is about what
        the agent sets."""
        own = {"PYTHONPYCACHEPREFIX": str(self.ledger.trust.pycache_dir), "PYTHONUNBUFFERED": "1"}
        env = {k: v for k, v in request.env.items() if own.get(k) != v}
        return request if len(env) == len(request.env) else request.model_copy(update={"env": env})

    def _foreign_harness(self, request: CommandRequest) -> list[str]:
        """A harness entry file that is not the server's own copy in the trust root: approval would show
        the command without it (as it shows perfgate's), while that file, anyone's code, runs first."""
        own = (self.ledger.trust.state_dir / "harness").resolve()
        return [
            f"argv names {token!r}, which is not perfgate's harness (perfgate inserts its own: give the "
            "training command alone)"
            for token in harness_entries(request.argv)
            if not os.path.isabs(token) or Path(token).resolve().parent.parent != own
        ]

    def expire_due(self) -> list[str]:
        """Expire overdue approvals and record each expiry; returns the evidence ids written."""
        ids: list[str] = []
        for approval in self.store.expire_due():
            ids.append(
                record_decision(
                    self.ledger,
                    tool=approval.tool,
                    request=approval.request,
                    decision=Decision.EXPIRED,
                    how=How.EXPIRY,
                    who="perfgate (approval expired unused or past its validity)",
                    approval_id=approval.id,
                    detail={"status_before": "granted" if approval.decided_at else "pending"},
                )
            )
        return ids

    def preapproved(self, request: CommandRequest, tool: str) -> Grant | None:
        """A grant that needs no question (allowlist, or a human's CLI grant), else None.

        ``request`` must carry its code binding (`perfgate.execution.binding.bind_code`).

        Raises:
            ToolError: the request is outside the limits, or a human denied this exact command.
        """
        self.expire_due()
        self.check_limits(request)
        rules = [self.policy.match(self._without_own_env(side)) for side in request.sides]
        rule = rules[0] if all(r is not None for r in rules) else None  # a pair: both sides allowed
        if rule is not None:
            who = f"operator policy {self.policy.describe_source()}"
            evidence_id = record_decision(
                self.ledger,
                tool=tool,
                request=request,
                decision=Decision.APPROVED,
                how=How.ALLOWLIST,
                who=who,
                detail={"rule": rule.label(), "rule_argv": list(rule.argv)},
            )
            return Grant(
                request.digest, How.ALLOWLIST, who, evidence_id, base_digest=request.unbound().digest
            )
        live = self.store.live_for(request.digest)
        if live is not None and live.status is ApprovalStatus.DENIED:
            raise ToolError(
                f"a human denied this exact command (approval {live.id}, by {live.decided_by})\n"
                "next: ask the user what to change; do not repeat it unchanged"
            )
        grant = self.store.use_grant(request)
        if grant is None:
            return None
        who = grant.decided_by or "unknown"
        how = How.ELICITATION if grant.scope and grant.scope.granted_in == "client" else How.CLI_GRANT
        detail: dict[str, object] = {
            "event": "used",
            "use": grant.uses,
            "grant_evidence_id": grant.evidence_id,
        }
        if grant.scope is not None:
            detail["of"] = grant.scope.runs
        evidence_id = record_decision(
            self.ledger,
            tool=tool,
            request=request,
            decision=Decision.APPROVED,
            how=how,
            who=who,
            approval_id=grant.id,
            detail=detail,
        )
        return Grant(request.digest, how, who, evidence_id, grant.id, request.unbound().digest)

    @property
    def changes(self) -> ChangeStore:
        return change_store(self.store)

    def elicitation_message(self, request: CommandRequest, tool: str) -> str:
        """The question shown to the human. Deterministic: a retried round must render the same text."""
        again = self.store.why_asked_again(request)
        head = "An AI agent asks perfgate to run this command on your machine" + (
            f" (asking again: {again})" if again else ""
        )
        view = approval_view(
            request,
            _shown(request, tool),
            self.workspace,
            self.changes,
            grants_line(self.policy, "Accepting"),
            self.store.last_grant(tool),
        )
        return (
            f"{head}:\n{view}\n\n"
            "It runs exactly as shown (argv list, no shell), in its own process group, killed at the timeout. "
            "Accept to run it; decline to refuse."
        )

    def settle_elicitation(
        self, request: CommandRequest, tool: str, action: ElicitAction, who: str, note: str = ""
    ) -> Grant:
        """Record the human's answer; return the grant on accept.

        Raises:
            ToolError: the human declined or cancelled (recorded first).
        """
        decision = {"accept": Decision.APPROVED, "decline": Decision.DECLINED, "cancel": Decision.CANCELLED}[
            action
        ]
        evidence_id = record_decision(
            self.ledger,
            tool=tool,
            request=request,
            decision=decision,
            how=How.ELICITATION,
            who=who,
            detail={"note": note} if note else None,
        )
        if action == "accept":
            if request.code is not None:
                policy = self.policy
                scope = ApprovalScope.make(
                    request_print(request), request.code.digest, policy.grant_runs, granted_in="client"
                )
                grant = self.store.record_grant(request, tool, who, scope, policy.grant_ttl_s, evidence_id)
                self.changes.mark_approved(request.code.tree, grant.id, grant.decided_at or 0.0)
                return Grant(
                    request.digest, How.ELICITATION, who, evidence_id, grant.id, request.unbound().digest
                )
            return Grant(
                request.digest, How.ELICITATION, who, evidence_id, base_digest=request.unbound().digest
            )
        if action == "decline":
            raise ToolError(
                f"the user declined to run this command (recorded as {evidence_id})\n"
                "next: ask the user what they would accept instead; do not repeat it unchanged"
            )
        raise ToolError(
            f"the user dismissed the approval question without deciding (recorded as {evidence_id}); the "
            "command did not run\n"
            "next: ask the user before trying again"
        )

    def require_human(self, request: CommandRequest, tool: str) -> NoReturn:
        """Open (or reuse) a pending approval and raise the `ToolError` that tells the agent what to do.

        Raises:
            ToolError: always; it carries the approval id and the exact ``perfgate approve`` command.
        """
        approval, created = self.store.open_pending(request, tool, self.policy.pending_ttl_s)
        if created:
            evidence_id = record_decision(
                self.ledger,
                tool=tool,
                request=request,
                decision=Decision.PENDING,
                how=How.CLI_PENDING,
                who="perfgate (client has no elicitation; waiting for `perfgate approve`)",
                approval_id=approval.id,
                detail={"expires_at": _utc(approval.expires_at)},
            )
            self.store.set_evidence(approval.id, evidence_id)
        again = self.store.why_asked_again(request)
        raise ToolError(
            f"approval needed: pending approval {approval.id} (expires {_utc(approval.expires_at)}); this MCP "
            "client cannot ask the user, so the command did not run\n"
            f"next: ask the user to run `{approve_command(approval.id, self.workspace)}` in a terminal, then "
            "repeat this exact call (any change to argv, cwd, env, timeout or the code it runs needs a new "
            "approval)\n\n" + (f"asked again: {again}\n" if again else "") + f"{_shown(request, tool)}"
        )
