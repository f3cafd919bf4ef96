"""Server-wide settings, light to import: the command line builds them before the tools load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.helpers.deadline import ParseLimits
from perfgate.security.trustroot import TrustRoot

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """Server-wide settings fixed at start-up (from the command line), shared by every call."""

    workspace: Path
    read_only: bool = False
    read_roots: tuple[Path, ...] = ()
    trust: TrustRoot = field(default_factory=TrustRoot.locate)
    limits: ParseLimits = field(default_factory=ParseLimits.from_env)
    """Parsing deadline and trace event cap (``perfgate serve --parse-deadline-s/--max-trace-events``)."""

    @classmethod
    def create(
        cls,
        workspace: Path,
        read_only: bool = False,
        read_roots: Sequence[Path] = (),
        trust: TrustRoot | None = None,
        limits: ParseLimits | None = None,
    ) -> ServerConfig:
        return cls(
            workspace=workspace.resolve(),
            read_only=read_only,
            read_roots=tuple(p.resolve() for p in read_roots),
            trust=trust or TrustRoot.locate(),
            limits=limits or ParseLimits.from_env(),
        )
