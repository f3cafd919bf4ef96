"""Process-wide harness state: whether the launcher runs this process, and with which settings."""

from __future__ import annotations

from perfgate.harness.config import HarnessConfig

__all__ = ["current_config", "launcher_active", "set_launcher_config"]

_launcher_config: HarnessConfig | None = None


def set_launcher_config(config: HarnessConfig | None) -> None:
    """Called by ``python -m perfgate.harness`` before it runs the script (``None`` when it ends)."""
    global _launcher_config
    _launcher_config = config


def launcher_active() -> bool:
    return _launcher_config is not None


def current_config() -> HarnessConfig:
    """The launcher's settings when it runs this process, else the ``PERFGATE_*`` environment."""
    return _launcher_config if _launcher_config is not None else HarnessConfig.from_env()
