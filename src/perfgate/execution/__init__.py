"""Gated command execution: approval, process groups, timeouts, output capture.

Tools that run user commands declare ``ToolSpec.command`` (input -> `CommandRequest`) and call
``await rt.run_command(request, evidence)`` in their body; the server's approval gate has already
approved exactly that request (allowlist, elicitation, or a human's ``perfgate approve``) before the body
runs. No tool starts a process any other way: perfgate's own fixed diagnostic queries (``nvidia-smi``,
``git``; argv never from tool input, so no approval) go through `perfgate.envprobe.fixed`, with the same
process-group and timeout rules.
"""

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
