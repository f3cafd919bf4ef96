"""Gated command execution: approval, process groups, timeouts, output capture.

Tools that run user commands declare ``ToolSpec.command`` (input -> `CommandRequest`) and call
``await rt.run_command(request, evidence)`` in their body; the server's approval gate has already
approved exactly that request (allowlist, elicitation, or a human's ``perfgate approve``) before the body
runs. No tool starts a process any other way: perfgate's own fixed diagnostic queries (``nvidia-smi``,
``git``; argv never from tool input, so no approval) go through `perfgate.envprobe.fixed`, with the same
process-group and timeout rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfgate.helpers.lazy import lazy_exports

if TYPE_CHECKING:
    from perfgate.execution.approvals import Approval, ApprovalStatus, ApprovalStore, ApprovalStoreError
    from perfgate.execution.audit import APPROVAL_TOOL, Decision, How
    from perfgate.execution.executor import (
        CommandError,
        CommandProgress,
        CommandResult,
        ExecLimits,
        ProcessRegistry,
        StreamCapture,
        execute,
    )
    from perfgate.execution.gate import ApprovalGate, ConsentForm, Grant, approve_command
    from perfgate.execution.policy import AllowRule, ExecutionPolicy, PolicyError, load_policy, policy_paths
    from perfgate.execution.request import CommandRequest
    from perfgate.execution.service import CommandRunner, ExecutionService, UnapprovedCommandError

__all__ = [
    "APPROVAL_TOOL",
    "AllowRule",
    "Approval",
    "ApprovalGate",
    "ApprovalStatus",
    "ApprovalStore",
    "ApprovalStoreError",
    "CommandError",
    "CommandProgress",
    "CommandRequest",
    "CommandResult",
    "CommandRunner",
    "ConsentForm",
    "Decision",
    "ExecLimits",
    "ExecutionPolicy",
    "ExecutionService",
    "Grant",
    "How",
    "PolicyError",
    "ProcessRegistry",
    "StreamCapture",
    "UnapprovedCommandError",
    "approve_command",
    "execute",
    "load_policy",
    "policy_paths",
]

# Served lazily (attribute -> module that defines it): importing the package, as the server does at start
# for the execution service, loads none of the approval machinery until a command is first approved.
_LAZY: dict[str, str] = {
    "APPROVAL_TOOL": "perfgate.execution.audit",
    "AllowRule": "perfgate.execution.policy",
    "Approval": "perfgate.execution.approvals",
    "ApprovalGate": "perfgate.execution.gate",
    "ApprovalStatus": "perfgate.execution.approvals",
    "ApprovalStore": "perfgate.execution.approvals",
    "ApprovalStoreError": "perfgate.execution.approvals",
    "CommandError": "perfgate.execution.executor",
    "CommandProgress": "perfgate.execution.executor",
    "CommandRequest": "perfgate.execution.request",
    "CommandResult": "perfgate.execution.executor",
    "CommandRunner": "perfgate.execution.service",
    "ConsentForm": "perfgate.execution.gate",
    "Decision": "perfgate.execution.audit",
    "ExecLimits": "perfgate.execution.executor",
    "ExecutionPolicy": "perfgate.execution.policy",
    "ExecutionService": "perfgate.execution.service",
    "Grant": "perfgate.execution.gate",
    "How": "perfgate.execution.audit",
    "PolicyError": "perfgate.execution.policy",
    "ProcessRegistry": "perfgate.execution.executor",
    "StreamCapture": "perfgate.execution.executor",
    "UnapprovedCommandError": "perfgate.execution.service",
    "approve_command": "perfgate.execution.gate",
    "execute": "perfgate.execution.executor",
    "load_policy": "perfgate.execution.policy",
    "policy_paths": "perfgate.execution.policy",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
