"""The scrubber remembers each short string's scrubbed form: a repeated string is scrubbed the same way
and counted again, every time."""

from __future__ import annotations

from perfgate.redaction import REDACTED, Scrubber


def test_a_repeated_string_is_scrubbed_and_counted_every_time() -> None:
    scrub = Scrubber({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx"})
    tree = {
        "keys": ["layers.0.weight", "layers.0.weight", "hf_abcdefghijklmnopqrstuvwx"],
        "note": "token hf_abcdefghijklmnopqrstuvwx here",
        "again": ["token hf_abcdefghijklmnopqrstuvwx here", "hf_abcdefghijklmnopqrstuvwx"],
    }
    out = scrub.tree(tree)
    assert out["keys"] == ["layers.0.weight", "layers.0.weight", REDACTED]
    assert out["note"] == out["again"][0] == f"token {REDACTED} here"
    assert out["again"][1] == REDACTED
    assert scrub.redactions == 4
    assert scrub.text("hf_abcdefghijklmnopqrstuvwx") == REDACTED and scrub.redactions == 5
