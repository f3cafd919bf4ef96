"""Every approval decision as an evidence record: what, for which command, how and by whom.

Decision records use the ledger's ``tool`` name ``approval``. Their state says what the decision was
worth to the run: ``passed`` (it may run), ``failed`` (declined, cancelled, denied, expired) and
``scaffolded`` (a pending approval: the exact command is prepared and waits for a human).
"""

from __future__ import annotations

import getpass
import os
import socket
from enum import Enum
from typing import Any, cast

from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.execution.request import CommandRequest
from perfgate.security.envredactor import redact_env_values

__all__ = ["APPROVAL_TOOL", "Decision", "How", "operator_identity", "record_decision"]

APPROVAL_TOOL = "approval"


class Decision(str, Enum):
    APPROVED = "approved"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    DENIED = "denied"
    PENDING = "pending"
    EXPIRED = "expired"


class How(str, Enum):
    """Which path of the gate decided."""

    ALLOWLIST = "allowlist"
    ELICITATION = "elicitation"
    CLI_GRANT = "cli_grant"
    CLI_PENDING = "cli_pending"
    EXPIRY = "expiry"


_STATES = {
    Decision.APPROVED: EvidenceState.PASSED,
    Decision.PENDING: EvidenceState.SCAFFOLDED,
}


def operator_identity() -> str:
    """``user@host on TTY`` of the person running the command line (best effort, for the audit trail)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    try:
        tty = os.ttyname(0)
    except OSError:
        tty = "no tty"
    return f"{user}@{socket.gethostname()} on {tty}"


def _stored_request(request: CommandRequest) -> dict[str, Any]:
    fields = {**request.bound_fields(), "reason": request.reason}
    if isinstance(fields.get("env"), dict):
        fields["env"] = redact_env_values(cast("dict[str, Any]", fields["env"]))
    return fields


def record_decision(
    ledger: Ledger,
    *,
    tool: str,
    request: CommandRequest,
    decision: Decision,
    how: How,
    who: str,
    approval_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> str:
    """Append one decision record (synchronously) and return its evidence id."""
    evidence_id = Ledger.new_id()
    state = _STATES.get(decision, EvidenceState.FAILED)
    result: dict[str, Any] = {
        "evidence_id": evidence_id,
        "state": state.value,
        "decision": decision.value,
        "how": how.value,
        "who": who,
        "for_tool": tool,
        "request_digest": request.digest,
        "approval_id": approval_id,
        **(detail or {}),
    }
    ledger.append(
        EvidenceDraft(
            id=evidence_id,
            tool=APPROVAL_TOOL,
            state=state,
            inputs={"tool": tool, "request": _stored_request(request)},
            result=result,
            command=list(request.argv),
        )
    )
    return evidence_id
