"""The scrubber remembers each short string's scrubbed form: a repeated string is scrubbed the same way
and counted again, every time."""

from __future__ import annotations

import re

from perfgate.security.scrubber import REDACTED, Scrubber

_PLACEHOLDER = re.compile(r"<redacted:[a-z0-9-]+:[0-9a-f]{8}>")


def _bare(value: object) -> object:
    """``value`` with each placeholder shown as the bare marker (tags are checked elsewhere)."""
    return _PLACEHOLDER.sub(REDACTED, value) if isinstance(value, str) else value


def test_a_repeated_string_is_scrubbed_and_counted_every_time() -> None:
    scrub = Scrubber({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx"})
    tree = {
        "keys": ["layers.0.weight", "layers.0.weight", "hf_abcdefghijklmnopqrstuvwx"],
        "note": "token hf_abcdefghijklmnopqrstuvwx here",
        "again": ["token hf_abcdefghijklmnopqrstuvwx here", "hf_abcdefghijklmnopqrstuvwx"],
    }
    out = scrub.tree(tree)
    assert [_bare(k) for k in out["keys"]] == ["layers.0.weight", "layers.0.weight", REDACTED]
    assert _bare(out["note"]) == _bare(out["again"][0]) == f"token {REDACTED} here"
    assert _bare(out["again"][1]) == REDACTED
    assert scrub.redactions == 4
    assert scrub.text("hf_abcdefghijklmnopqrstuvwx") == out["keys"][2] and scrub.redactions == 5
