"""The signing key: created once, whole, by exactly one of the processes that race to create it, and never
read short.

A key visible before its text is complete let a second writer sign with an empty key; its records were
then dropped as untrusted by every later reader (seen as 25 of 75 records lost by
``test_concurrent_processes_lose_no_record``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from perfgate.security.trustroot import KEY_BYTES, SigningKey, TrustRoot, TrustRootError


def _root(tmp_path: Path) -> TrustRoot:
    return TrustRoot.locate(state_dir=tmp_path / "state", config_dir=tmp_path / "config")


@pytest.mark.parametrize(
    "text", ["", "\n", "ab", "zz" * KEY_BYTES, "00" * (KEY_BYTES - 1), "00" * (KEY_BYTES + 1)]
)
def test_a_short_or_unreadable_key_file_is_refused_not_used(tmp_path: Path, text: str) -> None:
    root = _root(tmp_path)
    root.key_dir.mkdir(parents=True)
    (root.key_dir / "current").write_text(text)
    with pytest.raises(TrustRootError, match="corrupt"):
        root.key()
    with pytest.raises(TrustRootError, match="move the file aside"):
        root.ensure_key()


def test_the_key_is_visible_only_once_written_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(tmp_path)
    seen: list[object] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        seen.append(root.key())  # what another process reads while the key is still being made durable
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    key = root.ensure_key()
    assert seen == [None]
    assert root.key() == key
    assert len(key.secret) == KEY_BYTES
    assert [p.name for p in root.key_dir.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_racing_creators_all_get_the_one_key_and_history_lists_it_once(tmp_path: Path) -> None:
    for round_ in range(10):
        root = _root(tmp_path / str(round_))
        barrier = threading.Barrier(6)
        got: list[SigningKey] = []

        def create(
            root: TrustRoot = root, barrier: threading.Barrier = barrier, got: list[SigningKey] = got
        ) -> None:
            barrier.wait()
            got.append(root.ensure_key())

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 6
        assert {k.secret for k in got} == {k.secret for k in [root.key()] if k is not None}
        assert (root.key_dir / "history").read_text().split() == [got[0].key_id]
