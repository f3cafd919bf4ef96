"""Key mapping: a compiled or wrapped model's dump compares with an eager one without editing files.

The state dicts come from real modules: ``torch.compile`` wraps without compiling until the first call,
so reading the wrapper's state dict costs no compilation.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.evidence import Ledger
from perfgate.harness.dump import dump_tensors
from perfgate.tensors import CompareOptions, KeyMapping, TensorInputError, compare_sources, open_tensor_source

torch = pytest.importorskip("torch")


def _eager() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))


def _dump(path: Path, module: Any) -> Path:
    return dump_tensors(path, {k: v.detach() for k, v in module.state_dict().items()})


@pytest.fixture(scope="module")
def compiled() -> tuple[Any, Any]:
    """torch.compile of the whole module, and of its middle submodule (one dynamo import per module)."""
    with warnings.catch_warnings():
        # importing dynamo touches torch.jit.script_method, deprecated in recent torch: not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        whole = torch.compile(_eager())
        part = _eager()
        part[1] = torch.compile(part[1])
    return whole, part


@pytest.fixture
def eager_and_compiled(tmp_path: Path, compiled: tuple[Any, Any]) -> tuple[Path, Path, list[str]]:
    """The same weights dumped from an eager module and from torch.compile of it."""
    whole, _ = compiled
    keys = list(whole.state_dict())
    assert all(k.startswith("_orig_mod.") for k in keys), keys  # what torch.compile really produces
    eager = _dump(tmp_path / "eager.safetensors", _eager())
    return eager, _dump(tmp_path / "compiled.safetensors", whole), keys


def _compare(ref: Path, cand: Path, atol: float = 0.0, **options: Any) -> Any:
    with open_tensor_source(ref) as r, open_tensor_source(cand) as c:
        return compare_sources(r, c, CompareOptions(atol=atol, rtol=0.0, **options))


def test_without_a_mapping_a_compiled_dump_is_incomparable_and_the_note_names_the_fix(
    eager_and_compiled: tuple[Path, Path, list[str]],
) -> None:
    ref, cand, _ = eager_and_compiled
    report = _compare(ref, cand)
    assert report.status == "incomparable"
    assert report.missing_keys == ["0.bias", "0.weight", "1.bias", "1.weight", "2.bias", "2.weight"]
    assert any("key_map={'strip_prefixes': ['_orig_mod.']}" in note for note in report.notes)


def test_stripping_the_compile_prefix_pairs_every_tensor_and_keeps_the_originals(
    eager_and_compiled: tuple[Path, Path, list[str]],
) -> None:
    ref, cand, keys = eager_and_compiled
    report = _compare(ref, cand, key_mapping=KeyMapping(strip_prefixes=("_orig_mod.",)))
    assert report.status == "match", report.summary
    assert not report.missing_keys and not report.extra_keys
    assert {t.key: t.candidate_key for t in report.tensors} == {k.removeprefix("_orig_mod."): k for k in keys}
    assert all(t.reference_key == t.key for t in report.tensors)
    assert next((m.key, m.reference_key, m.candidate_key) for m in report.mapped_keys) == (
        "0.bias",
        "0.bias",
        "_orig_mod.0.bias",
    )


def test_a_compiled_submodule_needs_its_segment_dropped_and_a_value_change_still_fails(
    tmp_path: Path,
) -> None:
    eager = _eager()
    wrapped = _eager()
    wrapped[1] = torch.compile(wrapped[1])
    with torch.no_grad():
        wrapped[2].weight[1, 2] += 0.25
    assert "1._orig_mod.weight" in wrapped.state_dict()
    ref, cand = _dump(tmp_path / "e.safetensors", eager), _dump(tmp_path / "w.safetensors", wrapped)
    report = _compare(ref, cand, atol=1e-6, key_mapping=KeyMapping(drop_segments=("_orig_mod",)))
    assert report.status == "mismatch"
    bad = [t for t in report.tensors if t.status != "match"]
    assert [(t.key, t.max_abs_error_index) for t in bad] == [("2.weight", [1, 2])]
    assert {m.candidate_key for m in report.mapped_keys} == {"1._orig_mod.weight", "1._orig_mod.bias"}


def test_renames_pair_a_converted_checkpoint_and_keys_globs_use_the_mapped_names(tmp_path: Path) -> None:
    weights = {k: v.detach() for k, v in _eager().state_dict().items()}
    ref = dump_tensors(tmp_path / "ref.safetensors", weights)
    converted = {
        "model." + k.replace("0.", "embed.", 1) if k.startswith("0.") else "model." + k: v
        for k, v in weights.items()
    }
    cand = dump_tensors(tmp_path / "conv.safetensors", converted)
    mapping = KeyMapping(
        strip_prefixes=("model.",), rename=(("embed.weight", "0.weight"), ("embed.bias", "0.bias"))
    )
    report = _compare(ref, cand, key_mapping=mapping, keys=("0.*",))
    assert report.status == "match"
    assert [(t.key, t.candidate_key) for t in report.tensors] == [
        ("0.weight", "model.embed.weight"),
        ("0.bias", "model.embed.bias"),
    ]


def test_mappings_that_collide_or_rename_nothing_are_refused_with_the_names(tmp_path: Path) -> None:
    weights = {"a.w": torch.ones(2), "module.a.w": torch.zeros(2)}
    ref = dump_tensors(tmp_path / "r.safetensors", weights)
    with pytest.raises(TensorInputError, match=r"sends both ⟦a\.w⟧ and ⟦module\.a\.w⟧ to ⟦a\.w⟧"):
        _compare(ref, ref, key_mapping=KeyMapping(strip_prefixes=("module.",)))
    with pytest.raises(TensorInputError, match=r"no tensor is called ⟦a\.W⟧"):
        _compare(ref, ref, key_mapping=KeyMapping(rename=(("a.W", "x"),)))
    with pytest.raises(TensorInputError, match="one path segment"):
        KeyMapping(drop_segments=("a.b",))


@pytest.mark.anyio
async def test_the_tool_records_the_mapping_in_the_evidence(
    server: Any, workspace: Path, eager_and_compiled: tuple[Path, Path, list[str]]
) -> None:
    ref, cand, _ = eager_and_compiled
    (workspace / "dumps").mkdir()
    for path in (ref, cand):
        (workspace / "dumps" / path.name).write_bytes(path.read_bytes())
    args = {
        "reference": "dumps/eager.safetensors",
        "candidate": "dumps/compiled.safetensors",
        "atol": 0.0,
        "rtol": 0.0,
    }
    async with Client(server, mode="auto") as client:
        plain = await client.call_tool("compare_tensors", args)
        mapped = await client.call_tool(
            "compare_tensors", {**args, "key_map": {"strip_prefixes": ["_orig_mod."]}}
        )
    assert plain.structured_content is not None and mapped.structured_content is not None
    assert plain.structured_content["status"] == "incomparable"
    out = mapped.structured_content
    assert (out["status"], out["state"], out["keys_mapped"]) == ("match", "passed", 6)
    assert "6 keys renamed by key_map" in out["summary"]
    first = out["tensors"][0]
    assert first["reference_key"] is None and first["candidate_key"] == "_orig_mod." + first["key"]

    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None
    assert record.inputs["key_map"]["strip_prefixes"] == ["_orig_mod."]
    (artifact,) = record.artifacts
    saved = json.loads((workspace / artifact.path).read_text())["key_mapping"]
    assert saved["strip_prefixes"] == ["_orig_mod."]
    assert {m["candidate_key"] for m in saved["mapped"]} == {"_orig_mod." + t["key"] for t in out["tensors"]}
