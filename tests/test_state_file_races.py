"""State files that processes or threads race to create or read: each is created whole by exactly one of
them, and a reader never takes an empty or partial file for "nothing there" (the family of the signing
key's race, `test_trust_key.py`)."""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import pytest

from perfgate.transports.http import TokenError, http_token


def test_servers_starting_at_once_serve_the_one_generated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two HTTP servers sharing a trust root, started together: both serve the token the file holds (before,
    each wrote its own; the first served a token that was no longer on disk, so clients were refused)."""
    state = tmp_path / "state"
    both_decided = threading.Barrier(2, timeout=10)
    first_done = threading.Event()
    real = secrets.token_urlsafe

    def token_urlsafe(n: int | None = None) -> str:  # both found no file; the second writes after the first
        both_decided.wait()
        if threading.current_thread().name == "second":
            first_done.wait(10)
        return real(n)

    monkeypatch.setattr(secrets, "token_urlsafe", token_urlsafe)
    served: dict[str, str] = {}

    def start(name: str) -> None:
        served[name] = http_token(None, None, state)[0]
        if name == "first":
            first_done.set()

    threads = [threading.Thread(target=start, args=(name,), name=name) for name in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    on_disk = (state / "http-token").read_text().strip()
    assert served == {"first": on_disk, "second": on_disk}
    assert not [p.name for p in state.iterdir() if p.name != "http-token"]  # no temporary file left


def test_an_empty_generated_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "http-token").write_text("\n")
    with pytest.raises(TokenError, match="delete it"):
        http_token(None, None, tmp_path)
