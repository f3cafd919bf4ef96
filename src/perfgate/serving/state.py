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
        self._restore_swapped_code()

    def _restore_swapped_code(self) -> None:
        """Put back the working tree a paired run left at its baseline when the server stopped mid-run (the
        next paired call's answer says so); a look at one folder when there is nothing to do."""
        private = self.ledger.trust.workspace_dir(self.config.workspace, create=False)
        if (private / "codeswap").exists():
            from perfgate.execution.codeswap import recover

            recover(self.config.workspace, private)

    async def aclose(self) -> None:
        """Stop command process groups still running, and the trace reader's kept worker (call when the
        lifespan ends)."""
        await self.execution.aclose()
        traces_pool = sys.modules.get("perfgate.traces.pool")  # never imported: nothing was read
        if traces_pool is not None:
            await anyio.to_thread.run_sync(traces_pool.release_workers)
