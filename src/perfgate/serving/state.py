"""Server-lifetime state, created in the server lifespan (light to import: no tool module is loaded)."""

from __future__ import annotations

import sys

import anyio.to_thread

from perfgate.evidence import Ledger
from perfgate.execution.service import ExecutionService
from perfgate.serving.config import ServerConfig

__all__ = ["AppState"]


class AppState:
    """Server-lifetime state, created in the server lifespan."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.ledger = Ledger(config.workspace, config.trust)
        self.execution = ExecutionService(config.workspace, self.ledger)

    async def aclose(self) -> None:
        """Stop command process groups still running, and the trace reader's kept worker (call when the
        lifespan ends)."""
        await self.execution.aclose()
        traces_pool = sys.modules.get("perfgate.traces.pool")  # never imported: nothing was read
        if traces_pool is not None:
            await anyio.to_thread.run_sync(traces_pool.release_workers)
