"""A command a tool wants to run, and the digest an approval binds to.

A request is an argv list (never a shell string), an absolute working directory, the environment
variables it sets on top of the server's environment, its limits, and (once the server bound it, see
`perfgate.execution.binding`) the code it runs: the digests of the files its argv names and the
workspace's code state. The digest covers exactly those; the agent's stated reason is shown to the human
but not bound, so rewording it does not need a new approval while any change to what runs does, an edit
of the approved script included. `redact_request` is the request as stored and shown: its secrets removed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.security.scrubber import Scrubber

__all__ = ["DIGEST_VERSION", "CodeBinding", "CodeRef", "CommandRequest", "redact_request"]

DIGEST_VERSION = 3
"""Bumped when the digested fields change, so an old approval can never match a new meaning."""

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CodeBinding(BaseModel):
    """The code a request runs, as of when it was bound."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="Files the command names (its script or module, file arguments): path -> sha256.",
    )
    workspace: str = Field(description="The workspace's code state digest (git commit + changes, or tree).")
    summary: str = Field(description="The code state in words, for the human.")
    executables: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="Programs the argv names, resolved with the run's PATH: path as found -> 'sha256 of the "
        "file it resolves to' (a link's target is part of the value).",
    )
    tree: str = Field(
        default="",
        description="Digest of every importable file in the workspace by path and content: the files the "
        "approval's change view was drawn from (`perfgate.execution.changes`).",
    )

    def bound(self) -> dict[str, Any]:
        return {
            "files": dict(sorted(self.files.items())),
            "workspace": self.workspace,
            "executables": dict(sorted(self.executables.items())),
            "tree": self.tree,
        }

    @property
    def digest(self) -> str:
        """sha256 (hex) of the bound fields: one code state in an approval's scope."""
        text = json.dumps(self.bound(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


class CodeRef(BaseModel):
    """A paired run's baseline code: the working tree with these files as ``commit`` holds them."""

    ref: str = Field(description="The ref as given (HEAD, a branch, a commit).")
    commit: str = Field(description="The commit it resolved to when the request was made.")
    files: dict[str, str] = Field(
        description="Workspace-relative path -> its git blob id and mode at the commit ('oid mode'; '' where "
        "the commit lacks the file): the bytes the baseline runs."
    )

    def describe(self) -> str:
        return f"{self.ref} ({self.commit[:12]}), {len(self.files)} file(s) swapped"


class CommandRequest(BaseModel):
    """One command to execute, as the human will see it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: tuple[str, ...] = Field(min_length=1, description="Program and arguments; no shell is involved.")
    cwd: Path = Field(description="Absolute working directory.")
    env: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="Environment variables set on top of the server's environment (changes only).",
    )
    timeout_s: float = Field(
        gt=0, description="Wall-clock limit in seconds; the process group is killed after it."
    )
    reason: str = Field(
        default="", max_length=2000, description="Why the agent wants to run it (not digested)."
    )
    code: CodeBinding | None = Field(
        default=None, description="The code it runs, filled in by the server's gate (never by a tool input)."
    )
    code_ref: CodeRef | None = Field(
        default=None,
        description="A paired run's baseline at a git ref: the files the server swaps in before each of its "
        "launches (`perfgate.execution.codeswap`), bound with the request.",
    )
    paired: CommandRequest | None = Field(
        default=None,
        description="A paired run's candidate side (this request is its baseline): one approval covers both, "
        "shown side by side with their difference, and its digest binds both.",
    )

    @field_validator("argv")
    @classmethod
    def _argv_tokens(cls, argv: tuple[str, ...]) -> tuple[str, ...]:
        if not argv[0]:
            raise ValueError("argv[0] (the program) is empty")
        for token in argv:
            if "\x00" in token:
                raise ValueError("argv tokens cannot contain NUL bytes")
        return argv

    @field_validator("cwd")
    @classmethod
    def _absolute_cwd(cls, cwd: Path) -> Path:
        if not cwd.is_absolute():
            raise ValueError(f"cwd must be absolute, got {str(cwd)!r}")
        if "\x00" in str(cwd):
            raise ValueError("cwd contains a NUL byte")
        return cwd

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not _ENV_KEY.fullmatch(key):
                raise ValueError(f"environment variable name {key!r} is not a valid identifier")
            if "\x00" in value:
                raise ValueError(f"environment variable {key} contains a NUL byte")
        return env

    def bound_fields(self) -> dict[str, Any]:
        """The fields an approval binds to, in canonical JSON-ready form (a pair's candidate under
        ``paired``; a single request's fields are what they were before pairs existed)."""
        fields: dict[str, Any] = {
            "v": DIGEST_VERSION,
            "argv": list(self.argv),
            "cwd": str(self.cwd),
            "env": dict(sorted(self.env.items())),
            "timeout_s": float(self.timeout_s),
            "code": self.code.bound() if self.code is not None else None,
        }
        if self.code_ref is not None:
            fields["code_ref"] = self.code_ref.model_dump(mode="json")
        if self.paired is not None:
            fields["paired"] = self.paired.bound_fields()
        return fields

    def unbound(self) -> CommandRequest:
        """This request without its code binding (what a tool computes from its input), a pair's candidate
        included."""
        if self.code is None and (self.paired is None or self.paired.code is None):
            return self
        paired = self.paired.unbound() if self.paired is not None else None
        return self.model_copy(update={"code": None, "paired": paired})

    @property
    def sides(self) -> tuple[CommandRequest, ...]:
        """What runs: this request alone, or a pair's baseline (this request less its candidate) and its
        candidate."""
        if self.paired is None:
            return (self,)
        return (self.model_copy(update={"paired": None}), self.paired)

    @property
    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON of `bound_fields`."""
        text = json.dumps(self.bound_fields(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def short_digest(self) -> str:
        return self.digest[:12]

    def describe(self, tool: str | None = None, own: Callable[[str], bool] | None = None) -> str:
        """A plain-text rendering for a human deciding whether to run it; the variables ``own`` names
        (those perfgate sets for its harness) are counted on one line, not listed. A pair shows its
        baseline's lines, then its candidate's, each marked.

        Deterministic (no clock, no ids) so the same request renders the same question on every round
        of a multi-round elicitation. argv is shown as a JSON list: unambiguous about token boundaries.
        """
        lines = [f"tool:     {tool}"] if tool else []
        if self.paired is None:
            lines += self._what_runs(own)
        else:
            lines.append("baseline (A) and candidate (B), launched in turn (A B B A ...):")
            lines += [f"A {line}" for line in self._what_runs(own)]
            lines += [f"B {line}" for line in self.paired._what_runs(own)]
        lines += [f"reason:   {self.reason or '(none given)'}", f"digest:   {self.short_digest}"]
        return "\n".join(lines)

    def _what_runs(self, own: Callable[[str], bool] | None) -> list[str]:
        hidden = sorted(k for k in self.env if own is not None and own(k))
        shown = [
            f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(self.env.items()) if k not in hidden
        ]
        if hidden:
            shown.append(f"+ {len(hidden)} variables perfgate sets for its harness")
        lines = [
            f"argv:     {json.dumps(list(self.argv), ensure_ascii=False)}",
            f"cwd:      {self.cwd}",
            "env:      " + (", ".join(shown) or "(none)"),
            f"timeout:  {self.timeout_s:g} s",
        ]
        if self.code_ref is not None:
            lines.append(f"code at:  {self.code_ref.describe()} (the working tree's files, swapped in place)")
        if self.code is not None:
            lines.append(f"code:     {self.code.summary}")
            lines += [
                f"file:     {path} sha256 {digest[:16]}" for path, digest in sorted(self.code.files.items())
            ]
            lines += [
                f"program:  {path} sha256 {digest[:16]}{digest[64:]}"
                for path, digest in sorted(self.code.executables.items())
            ]
        return lines


def redact_request(request: CommandRequest) -> CommandRequest:
    """``request`` with secrets removed from argv, env values and reason (for storage and display).

    Its digest changes; keep the real request's digest where it must match (approvals do).
    """
    scrub = Scrubber.for_values(request.env, request.argv)
    return request.model_copy(
        update={
            "argv": tuple(scrub.argv(request.argv)),
            "env": {k: str(v) for k, v in scrub.env(request.env).items()},
            "reason": scrub.text(request.reason),
            "paired": redact_request(request.paired) if request.paired is not None else None,
        }
    )
