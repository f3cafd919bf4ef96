"""A log line with no end is read in bounded memory: cut at the reader's cap, the rest read past.

The log is the run's (or the agent's) to write; 2 GiB without a newline grew the server past 3 GiB when
each line was read whole. Here a sparse file holds 256 MiB of NUL characters before an honest nanoGPT
log: the import reads the honest lines and the server's allocations stay far below the long line's size.
"""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest
from mcp import Client

from perfgate.helpers.cappedlines import capped_lines
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

LOGS = Path(__file__).parent / "fixtures" / "logs"
LONG = 256 << 20


async def test_a_log_with_a_256_mib_line_is_imported_in_bounded_memory(workspace: Path) -> None:
    log = workspace / "train.log"
    with log.open("wb") as fh:
        fh.truncate(LONG)  # sparse: NUL characters, no newline, no disk
        fh.seek(LONG)
        fh.write(b"\n" + (LOGS / "nanogpt.log").read_bytes())
    args = {"paths": ["train.log"], "format": "nanogpt", "warmup_steps": 10, "windows": 1, "world_size": 8}
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        tracemalloc.start()
        try:
            result = await client.call_tool("import_benchmark", args)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None and result.structured_content["steps_measured"] == 27
    assert peak < LONG // 8, f"peak {peak >> 20} MiB"


def test_an_over_long_line_is_cut_and_the_next_line_is_whole() -> None:
    text = "a" * 100 + "\nstep 1\n" + "b" * 10 + "\n" + "c" * 25
    lines = list(capped_lines(io.StringIO(text), limit=8))
    assert lines == ["a" * 8, "step 1\n", "b" * 8, "c" * 8]
