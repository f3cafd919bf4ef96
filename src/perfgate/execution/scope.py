"""What one human approval covers: a command template, its code state(s), a number of calls, a time limit.

A human answering the same question again and again stops reading it. So a grant covers a stated scope
instead of one digest: the same command (argv, working directory, environment, timeout; flags the human
names with ``--vary`` may take other values), run with one of the code states in the scope (the code
binding: workspace code state, named files, resolved programs, importable-file tree), at most ``runs``
calls, until the grant expires. Anything outside it (another command, other code, one call more, later)
asks again. The scope is stored with the grant in the signed approval store in the trust root, and each
use is counted there (`perfgate.execution.approvals`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.execution.linestamps import LOG_PATTERN_ENV
from perfgate.execution.request import CommandRequest
from perfgate.harness.config import ENV_PREFIX

__all__ = ["ApprovalScope", "measuring_variable", "request_print", "template_digest"]

BOUND_HARNESS_ENV = (LOG_PATTERN_ENV,)
"""A perfgate variable the template keeps: which log lines are read as step times is the human's to see."""


def measuring_variable(name: str) -> bool:
    """Whether ``name`` is one of the variables perfgate sets to configure its harness (windows, profile
    schedule, capture, output folders). The agent cannot set these (`perfgate.benchmarking.windows.launch.launch_env`
    refuses them); they say how perfgate measures the approved command, not what runs, so a scope's
    template leaves them out: one grant covers a window, a profile and a capture of the same command."""
    return name.startswith(ENV_PREFIX) and name not in BOUND_HARNESS_ENV


def _h(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def request_print(request: CommandRequest) -> dict[str, Any]:
    """The request less its code, each value replaced by its sha256 (argv tokens also by the flag before
    an ``=``): what a scope's template is computed from. Kept with a pending approval, whose stored request
    has its secrets redacted, so the template a human grants binds the real values without storing them."""
    printed: dict[str, Any] = {
        "argv": [[_h(t), _h(t.partition("=")[0]) if "=" in t else None] for t in request.argv],
        "cwd": str(request.cwd),
        "env": {k: _h(v) for k, v in sorted(request.env.items())},
        "timeout_s": float(request.timeout_s),
    }
    if request.paired is not None:  # a pair's template covers its candidate too
        printed["paired"] = request_print(request.paired)
    return printed


def template_digest(printed: dict[str, Any], vary: tuple[str, ...] = ()) -> str:
    """Digest of a `request_print` with the values of ``vary`` flags (``--lr 3`` and ``--lr=3``) masked and
    perfgate's measuring variables (`measuring_variable`) left out: two requests with the same template
    differ only in their code, in a varied flag's value, or in how perfgate measures them."""
    fields = json.loads(json.dumps(printed))
    fields["env"] = {k: v for k, v in fields["env"].items() if not measuring_variable(k)}
    if "paired" in fields:
        fields["paired"] = template_digest(fields["paired"], vary)
    if vary:
        flags = {_h(f) for f in vary}
        argv: list[list[str | None]] = fields["argv"]
        masked: list[object] = []
        for i, (token, flag) in enumerate(argv):
            if flag in flags or (i > 0 and argv[i - 1][0] in flags):
                masked.append([flag, "*"])
            else:
                masked.append([token, flag])
        fields["argv"] = masked
        fields["vary"] = sorted(vary)
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class ApprovalScope(BaseModel):
    """The scope of one grant (stored with it, signed; the agent never writes it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template: str = Field(description="`template_digest` of the approved command.")
    code: tuple[str, ...] = Field(min_length=1, description="Code binding digests the grant covers.")
    runs: int = Field(ge=1, le=1000, description="Calls the grant allows in all.")
    vary: tuple[str, ...] = Field(default=(), description="Flags whose values may differ between calls.")
    granted_in: Literal["terminal", "client"] = Field(
        default="terminal", description="Where the human granted it: `perfgate approve`, or the MCP client."
    )

    @field_validator("vary")
    @classmethod
    def _flags(cls, vary: tuple[str, ...]) -> tuple[str, ...]:
        for flag in vary:
            if not flag.startswith("-") or "=" in flag or len(flag) < 2:
                raise ValueError(f"--vary takes a flag such as --lr, got {flag!r}")
        return tuple(sorted(set(vary)))

    @classmethod
    def make(
        cls,
        printed: dict[str, Any],
        code: str,
        runs: int,
        vary: tuple[str, ...] = (),
        granted_in: Literal["terminal", "client"] = "terminal",
    ) -> ApprovalScope:
        """The scope of a grant for the request printed as ``printed`` (`request_print`) with code binding
        digest ``code``."""
        vary = tuple(sorted(set(vary)))
        return cls(
            template=template_digest(printed, vary), code=(code,), runs=runs, vary=vary, granted_in=granted_in
        )

    def same_command(self, request: CommandRequest) -> bool:
        """Whether ``request`` is the approved command (varied flags aside), whatever its code."""
        return template_digest(request_print(request), self.vary) == self.template

    def why_not(self, request: CommandRequest) -> str | None:
        """None when the scope covers ``request`` (use count aside); else what differs, in words."""
        if not self.same_command(request):
            return "a different command (argv, cwd, env or timeout)"
        if request.code is None or request.code.digest not in self.code:
            return "other code (a file, the workspace's code state or a program it runs changed)"
        return None

    def describe(self, hours: float) -> str:
        varied = f", any value of {', '.join(self.vary)}" if self.vary else ""
        return (
            f"this command{varied} with this code, up to {self.runs} call(s) within {hours:g} h; another "
            "command, other code, a further call or a later one asks again"
        )
