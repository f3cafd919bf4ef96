"""Open once, then check: a folder swapped for a symlink after the path check reads nothing outside."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from perfgate.evidence import Ledger
from perfgate.harness.dump import dump_tensors
from perfgate.helpers.safeopen import UnsafeFileError, open_file
from perfgate.serving.runtime import ToolRuntime

pytestmark = pytest.mark.anyio

RECORD = {"sample_id": 1, "epoch": 0, "rank": 0, "worker": -1}


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def _swap_after_check(monkeypatch: pytest.MonkeyPatch, folder: Path, outside: Path) -> None:
    """After every path check, swap ``folder`` for a link to ``outside`` (restored before the next check)."""
    real = ToolRuntime.resolve_path
    parked = folder.with_name(folder.name + ".parked")

    def resolve_then_swap(self: ToolRuntime, raw: str, **kwargs: Any) -> Path:
        if folder.is_symlink():
            folder.unlink()
            parked.rename(folder)
        resolved = real(self, raw, **kwargs)
        folder.rename(parked)
        folder.symlink_to(outside, target_is_directory=True)
        return resolved

    monkeypatch.setattr(ToolRuntime, "resolve_path", resolve_then_swap)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir()
    return secret


async def test_audit_samples_never_reads_through_a_folder_swapped_after_the_check(
    server: Any, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "records.jsonl").write_text(json.dumps(RECORD) + "\n")
    (outside / "records.jsonl").write_text(json.dumps({**RECORD, "sample_id": "SECRET"}) + "\n")
    _swap_after_check(monkeypatch, workspace / "d", outside)
    async with Client(server) as client:
        result = await client.call_tool(
            "audit_samples", {"observed": "d/records.jsonl", "expected_range": [0, 2]}
        )
    assert result.is_error
    assert "became a symbolic link" in _text(result) and "SECRET" not in _text(result)
    assert Ledger(workspace).records() == []


async def test_compare_tensors_never_reads_through_a_folder_swapped_after_the_check(
    server: Any, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "d").mkdir()
    dump_tensors(workspace / "d" / "a.safetensors", {"w": np.zeros(4, np.float32)})
    dump_tensors(workspace / "b.safetensors", {"w": np.zeros(4, np.float32)})
    dump_tensors(outside / "a.safetensors", {"w": np.full(4, 7.0, np.float32)})
    _swap_after_check(monkeypatch, workspace / "d", outside)
    args = {"reference": "d/a.safetensors", "candidate": "b.safetensors", "atol": 0.0, "rtol": 0.0}
    async with Client(server) as client:
        result = await client.call_tool("compare_tensors", args)
    assert result.is_error and "became a symbolic link" in _text(result)


async def test_a_hardlink_to_a_file_outside_is_refused(server: Any, workspace: Path, outside: Path) -> None:
    (outside / "records.jsonl").write_text(json.dumps(RECORD) + "\n")
    try:
        os.link(outside / "records.jsonl", workspace / "records.jsonl")
    except OSError:
        pytest.skip("hard links are not possible here")
    async with Client(server) as client:
        result = await client.call_tool(
            "audit_samples", {"observed": "records.jsonl", "expected_range": [0, 2]}
        )
    assert result.is_error
    assert "has 2 hard links" in _text(result) and "Copy the file" in _text(result)


def test_open_file_refuses_links_fifos_and_reads_plain_files(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"ok")
    with open_file(plain) as f:
        assert f.read() == b"ok"
    (tmp_path / "link").symlink_to(plain)
    with pytest.raises(UnsafeFileError, match="became a symbolic link"):
        open_file(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        open_file(tmp_path / "fifo")  # and does not block waiting for a writer
