"""Tensor files bind to the run that dumped them by digest, compared like with like: a digest is recorded
with its algorithm's name, and a check that names another algorithm than the producer's record, an
unknown or malformed algorithm, or bytes the check never hashed binds nothing (protocol)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from mcp import Client
from safetensors.numpy import save_file

from perfgate.security.digests import entry_digest, parse
from test_record_decision import Evidence, _drop, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio

X, Y, Z = "a1" * 32, "b2" * 32, "c3" * 32


def test_a_digest_parses_only_with_a_known_algorithm_and_64_lowercase_hex() -> None:
    assert parse(f"blake3:{X}") == ("blake3", X)
    assert parse(f"sha256:{X}") == ("sha256", X)
    for forged in (
        f"md5:{X}",
        f"BLAKE3:{X}",
        f"blake3x:{X}",
        f"blake3:{X[:63]}",
        f"blake3:{X.upper()}",
        X,
        "",
        7,
    ):
        assert parse(forged) is None, forged
    # a record written before digests were named: its bare sha256
    assert entry_digest({"sha256": X}) == ("sha256", X)
    # an entry that has a digest field is judged by it alone: a legacy sha256 beside it cannot rescue it
    assert entry_digest({"digest": f"md5:{X}", "sha256": X}) is None
    assert entry_digest({"sha256": "not hex"}) is None


def _dumps(ref: str, cand: str) -> list[dict[str, Any]]:
    return [
        {"path": "ref.safetensors", "digest": ref, "size_bytes": 8, "launch": 0},
        {"path": "cand.safetensors", "digest": cand, "size_bytes": 8, "launch": 0},
    ]


def _check(
    ev: Evidence,
    ids: dict[str, Any],
    files: tuple[dict[str, Any], dict[str, Any]],
    producers: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> str:
    """A passed compare_tensors record whose files carry ``files`` (digest fields) and whose producers (the
    runs it found) carry ``producers`` (default: the same fields as the files)."""
    paths = (
        {"role": "reference", "path": "ref.safetensors"},
        {"role": "candidate", "path": "cand.safetensors"},
    )
    entries = [{**p, **f, "size_bytes": 8} for p, f in zip(paths, files, strict=True)]
    bound = [
        {**p, **f, "evidence_id": side[0], "launch": 0}
        for p, f, side in zip(paths, producers or files, (ids["base"], ids["cand"]), strict=True)
    ]
    return ev.add(
        "compare_tensors",
        "passed",
        {
            "status": "match",
            "files": entries,
            "producers": bound,
            "tolerance_by_dtype": [{"dtype": "float32", "tensors": 1, "atol": 1e-5, "rtol": 1e-5}],
        },
        {"reference": "ref.safetensors", "candidate": "cand.safetensors", "atol": 1e-5, "rtol": 1e-5},
    )


def _runs(ev: Evidence, ref: str, cand: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """An honest experiment's evidence whose windows dumped ``ref``/``cand`` (named digests)."""
    links, _ = _honest(ev)
    base = [ev.window(tensor_dumps=_dumps(ref, cand)) for _ in range(3)]
    cand_ids = [ev.window(tensor_dumps=_dumps(ref, cand)) for _ in range(3)]
    comp = ev.comparison(base, cand_ids)
    links = [*_drop(_drop(links, "comparison"), "correctness"), {"id": comp, "role": "comparison"}]
    return links, {"base": base, "cand": cand_ids}


CASES: dict[str, tuple[Any, str]] = {
    # the producer's record hashed with BLAKE3; the check claims a sha256 of the file (as if the record's
    # algorithm could be chosen to suit): never compared across algorithms
    "sha256 claimed against a blake3 dump": (
        lambda: (
            ({"digest": f"blake3:{X}", "other_digests": [f"sha256:{Z}"]}, {"digest": f"blake3:{Y}"}),
            ({"digest": f"sha256:{Z}"}, {"digest": f"blake3:{Y}"}),
        ),
        "cannot be compared with the record's blake3 digest",
    ),
    # the same hex relabelled with another algorithm's name
    "blake3 hex relabelled sha256": (
        lambda: (({"digest": f"sha256:{X}"}, {"digest": f"blake3:{Y}"}), None),
        "cannot be compared with the record's blake3 digest",
    ),
    "forged algorithm name": (
        lambda: (({"digest": f"blake3x:{X}"}, {"digest": f"blake3:{Y}"}), None),
        "names no known algorithm",
    ),
    "unknown algorithm": (
        lambda: (({"digest": f"md5:{X}", "sha256": X}, {"digest": f"blake3:{Y}"}), None),
        "names no known algorithm",
    ),
    # the producer names the dump's digest, but the check hashed other bytes
    "producer digest the check never took": (
        lambda: (
            ({"digest": f"blake3:{Z}"}, {"digest": f"blake3:{Y}"}),
            ({"digest": f"blake3:{X}"}, {"digest": f"blake3:{Y}"}),
        ),
        "took no blake3 digest",
    ),
    # same algorithm, other bytes: the run never dumped what was compared
    "other bytes under the same algorithm": (
        lambda: (({"digest": f"blake3:{Z}"}, {"digest": f"blake3:{Y}"}), None),
        "the record names no dump at that path",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_check_whose_digest_does_not_match_its_producer_like_for_like_is_refused(
    server: Any, workspace: Path, case: str
) -> None:
    make, reason = CASES[case]
    files, producers = make()
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _runs(ev, f"blake3:{X}", f"blake3:{Y}")
        check = _check(ev, ids, files, producers)
        refused = await _keep(client, exp, [*links, {"id": check, "role": "correctness"}])
    assert refused.is_error
    text = _text(refused)
    assert f"the reference file ref.safetensors is not bound to {ids['base'][0]}" in text, text
    assert reason in text, text


async def test_named_digests_and_records_from_before_them_both_bind(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _runs(ev, f"blake3:{X}", f"blake3:{Y}")
        check = _check(ev, ids, ({"digest": f"blake3:{X}"}, {"digest": f"blake3:{Y}"}))
        kept = await _keep(client, exp, [*links, {"id": check, "role": "correctness"}])
        assert not kept.is_error, _text(kept)
        # a ledger written before digests were named: bare sha256 on both records (the fixture's default)
        exp = await _open(client)
        links, _ = _honest(ev)
        kept = await _keep(client, exp, links)
        assert not kept.is_error, _text(kept)


async def test_compare_tensors_binds_by_the_producer_records_own_algorithm(
    server: Any, workspace: Path
) -> None:
    """A run recorded with sha256 (before BLAKE3) still binds its dump: the tool also takes a sha256 of that
    file, in the same pass; a record naming the file's BLAKE3 hex under another algorithm, or under an
    unknown one, binds nothing."""
    save_file({"w": np.arange(64, dtype=np.float32)}, str(workspace / "old.safetensors"))
    save_file({"w": np.arange(64, dtype=np.float32)}, str(workspace / "new.safetensors"))
    old, new = (workspace / "old.safetensors").read_bytes(), (workspace / "new.safetensors").read_bytes()
    b3 = blake3.blake3(new).hexdigest()
    ev = Evidence(workspace)
    legacy = ev.window(tensor_dumps=[{"path": "old.safetensors", "sha256": hashlib.sha256(old).hexdigest()}])
    relabelled = ev.window(tensor_dumps=[{"path": "new.safetensors", "digest": f"sha256:{b3}"}])
    forged = ev.window(tensor_dumps=[{"path": "new.safetensors", "digest": f"md5:{b3}"}])
    async with Client(server) as client:
        result = await client.call_tool(
            "compare_tensors",
            {"reference": "old.safetensors", "candidate": "new.safetensors", "atol": 0, "rtol": 0},
        )
        assert not result.is_error, _text(result)
        out = result.structured_content
        assert out is not None
        files = {f["role"]: f for f in out["files"]}
        assert files["reference"]["other_digests"] == [f"sha256:{hashlib.sha256(old).hexdigest()}"]
        assert files["candidate"]["digest"] == f"blake3:{b3}"
        producers = {p["role"]: p for p in out["producers"]}
        assert producers["reference"]["evidence_id"] == legacy
        assert producers["reference"]["digest"] == f"sha256:{hashlib.sha256(old).hexdigest()}"
        assert producers["candidate"]["evidence_id"] is None, (relabelled, forged)
        assert producers["candidate"]["digest"] == f"blake3:{b3}"
        blake = ev.window(tensor_dumps=[{"path": "new.safetensors", "digest": f"blake3:{b3}"}])
        again = await client.call_tool(
            "compare_tensors",
            {"reference": "old.safetensors", "candidate": "new.safetensors", "atol": 0, "rtol": 0},
        )
        assert again.structured_content is not None
        producers = {p["role"]: p for p in again.structured_content["producers"]}
        assert producers["candidate"]["evidence_id"] == blake


def test_harness_records_name_their_digest_and_older_ones_read_as_sha256() -> None:
    import msgspec

    from perfgate.benchmarking.reading.records import TensorDumpRecord

    new = msgspec.convert(
        {"path": "/w/a.safetensors", "digest": f"blake3:{X}", "size_bytes": 8}, TensorDumpRecord
    )
    old = msgspec.convert({"path": "/w/a.safetensors", "sha256": X, "size_bytes": 8}, TensorDumpRecord)
    bare = msgspec.convert({"path": "/w/a.safetensors", "size_bytes": 8}, TensorDumpRecord)
    assert (new.named_digest, old.named_digest, bare.named_digest) == (f"blake3:{X}", f"sha256:{X}", None)
    for forged in (f"md5:{X}", X, f"blake3:{X[:10]}"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"path": "/w/a.safetensors", "digest": forged, "size_bytes": 8}, TensorDumpRecord)
