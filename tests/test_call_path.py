"""The shortcuts that make a tool call and a ledger append cheap must not weaken what they replaced.

Each test here breaks if one shortcut goes too far: the anchor memo trusting bytes it did not read, the
body built by hand drifting from the record's dump, the clean-string set outliving a secret, the SDK's
JSON pre-parse skipped for a string it would have parsed, a compacted output schema accepting other
values, one redaction pass missing the answer, or argument errors losing a line.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import CallToolResult
from pydantic import BaseModel, Field, ValidationError

from perfgate.evidence import EvidenceDraft, EvidenceRecord, EvidenceState, Ledger, canonical_json
from perfgate.security.envredactor import placeholder
from perfgate.security.scrubber import Scrubber
from perfgate.serving.adapter import compact_schema, inline_refs
from perfgate.serving.catalog import CatalogTool
from perfgate.serving.runtime import ServerConfig, ToolRuntime

MFU_ARGS: dict[str, Any] = {
    "buckets": [{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5}],
    "flops_kind": "model",
    "device": "H100",
    "precision": "bf16",
}
SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123"
_PLACEHOLDER = re.compile(r"<redacted:[a-z0-9-]+:[0-9a-f]{8}>")


def _bare(text: str) -> str:
    """``text`` with each placeholder shown as the bare marker (tags are checked in test_secret_scanner)."""
    return _PLACEHOLDER.sub("<redacted>", text)


def _append(ledger: Ledger, **draft: Any) -> EvidenceRecord:
    return ledger.append(EvidenceDraft(id=Ledger.new_id(), tool="t", state=EvidenceState.EXECUTED, **draft))


def _slot_seqs(ledger: Ledger) -> list[int | None]:
    data = ledger.anchor_path.read_bytes()
    seqs: list[int | None] = []
    for i in range(2):
        try:
            seqs.append(json.loads(data[i * 8192 : (i + 1) * 8192])["seq"])
        except ValueError:
            seqs.append(None)
    return seqs


def test_an_anchor_written_by_another_writer_is_read_again_not_taken_from_memory(workspace: Path) -> None:
    """Each `Ledger` remembers the anchor slots it wrote; when another writer moved the anchor since, the
    slot in force is the other writer's, and the next write must go to the *other* slot (a memo trusted
    blindly would overwrite the anchor in force, and a torn write would then lose both)."""
    a, b = Ledger(workspace), Ledger(workspace)
    _append(a, result={"i": 1})
    _append(b, result={"i": 2})
    _append(a, result={"i": 3})
    assert sorted(s for s in _slot_seqs(a) if s is not None) == [2, 3]
    _append(b, result={"i": 4})
    assert sorted(s for s in _slot_seqs(a) if s is not None) == [3, 4]
    report = Ledger(workspace).verify()
    assert report.ok, report.errors


def test_an_anchor_rolled_back_on_disk_between_appends_is_noticed(workspace: Path) -> None:
    """Bytes changed under the memo (a restored copy of the anchor file) are parsed afresh."""
    ledger = Ledger(workspace)
    _append(ledger, result={"i": 1})
    old = ledger.anchor_path.read_bytes()
    _append(ledger, result={"i": 2})
    _append(ledger, result={"i": 3})
    ledger.anchor_path.write_bytes(old)  # slots back to "record 1"
    _append(ledger, result={"i": 4})
    assert sorted(s for s in _slot_seqs(ledger) if s is not None) == [1, 4]
    anchor = Ledger(workspace).anchor()
    assert anchor is not None and anchor["seq"] == 4
    assert Ledger(workspace).verify().ok


def test_the_stored_body_is_exactly_the_records_canonical_dump(workspace: Path) -> None:
    """The body is assembled from the record's attributes instead of a second dump; it must stay
    byte for byte what the dump gives, for every field a record can carry."""
    ledger = Ledger(workspace)
    evidence_id = Ledger.new_id()
    (ledger.artifact_dir(evidence_id) / "log.txt").write_text("hello\n")
    record = ledger.append(
        EvidenceDraft(
            id=evidence_id,
            tool="run_benchmark_window",
            state=EvidenceState.FAILED,
            inputs={"n": 3, "nested": {"b": [1, 2.5, None, True], "a": "é"}},
            result={"z": 1, "y": {"x": []}},
            profiled=True,
            command=["python", "train.py", "--steps", "3"],
            exit_code=2,
            environment_id="ev-env",
            artifact_names=["log.txt"],
            started_at="2026-01-01T00:00:00+00:00",
        )
    )
    with sqlite3.connect(ledger.db_path) as conn:
        (body,) = conn.execute("SELECT body FROM evidence WHERE id = ?", (evidence_id,)).fetchone()
    assert body == canonical_json(record.model_dump(mode="json", exclude={"hash"}))
    stored = EvidenceRecord.model_validate_json(body)
    assert body == canonical_json(stored.model_dump(mode="json", exclude={"hash"}))
    assert [a.name for a in stored.artifacts] == ["log.txt"]


class _Key(str):
    """A str subclass as a mapping key: JSON writes it as a plain string."""


def _sortable_keys(d: dict[Any, Any]) -> bool:
    """Keys canonical JSON can sort (it refuses a mix of numbers and strings) that stay distinct as text."""
    kinds = {isinstance(k, str) for k in d}
    return len(kinds) <= 1 and len({str(k) for k in d}) == len(d)


_KEYS = st.one_of(st.text(max_size=4), st.integers(-20, 20), st.builds(_Key, st.text(max_size=4)))
_TREES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4).filter(_sortable_keys)
    ),
    max_leaves=12,
)


@settings(max_examples=60)
@given(inputs=st.dictionaries(st.text(max_size=4), _TREES, max_size=4), result=_TREES)
def test_the_body_and_digest_are_the_canonical_dump_of_what_json_holds(
    tmp_path_factory: pytest.TempPathFactory, inputs: dict[Any, Any], result: Any
) -> None:
    """The inputs and result are encoded once and spliced into the body; the splice must equal the
    canonical dump of the record as read back, also when keys were numbers or str subclasses (JSON makes
    them strings, which sort otherwise: ``10`` before ``9``)."""
    from perfgate.evidence import digest_inputs

    ledger = Ledger(tmp_path_factory.mktemp("ws"))
    record = _append(ledger, inputs=inputs, result={"r": result, "n": {10: "x", 9: "y"}})
    with sqlite3.connect(ledger.db_path) as conn:
        (body,) = conn.execute("SELECT body FROM evidence WHERE id = ?", (record.id,)).fetchone()
    assert body == canonical_json(record.model_dump(mode="json", exclude={"hash"}))
    assert record.input_digest == digest_inputs(record.inputs)
    assert EvidenceRecord.model_validate_json(body).inputs == record.inputs


def test_a_string_found_clean_is_scrubbed_again_under_other_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clean strings are remembered per secret set: a value clean for one scrubber is still a secret for
    a scrubber that knows it (from a request's argv, or from an environment changed since)."""
    value = "zq-not-yet-a-secret-81734"
    assert Scrubber().text(f"x {value}") == f"x {value}"
    assert _bare(Scrubber(secrets=[value]).text(f"x {value}")) == "x <redacted>"
    assert Scrubber().text(f"x {value}") == f"x {value}"
    monkeypatch.setenv("PERFGATE_TEST_API_TOKEN", value)
    assert _bare(Scrubber().text(f"x {value}")) == "x <redacted>"
    monkeypatch.delenv("PERFGATE_TEST_API_TOKEN")
    assert Scrubber().text(f"x {value}") == f"x {value}"


class _Out(BaseModel):
    evidence_id: str
    state: EvidenceState
    note: str


@pytest.mark.anyio
async def test_one_redaction_pass_scrubs_both_the_record_and_the_answer(workspace: Path) -> None:
    """The ledger's pass is the only one: the answer `commit` returns is rebuilt from the stored result,
    so a secret the inputs reveal (an env value) is gone from both."""
    ledger = Ledger(workspace)
    inputs = {"env": {"HF_TOKEN": SECRET}}
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=ledger, tool="t", inputs=inputs)
    ev = rt.evidence()
    out = await rt.commit(ev, _Out(evidence_id=ev.id, state=EvidenceState.EXECUTED, note=f"token {SECRET}"))
    assert SECRET not in out.note and "<redacted>" in _bare(out.note)
    record = ledger.get(ev.id)
    assert record is not None and record.result["note"] == out.note
    assert record.inputs["env"] == {"HF_TOKEN": placeholder("named", SECRET)}


@pytest.mark.parametrize(
    "carrier",
    [
        {"inputs": {"job": {"env": {"WANDB_API_KEY": "k3y-value-9f8e7d"}}}},
        {"inputs": {"runs": [{"argv": ["python", "t.py", "--api-key", "k3y-value-9f8e7d"]}]}},
        {"command": ["python", "t.py", "--token=k3y-value-9f8e7d"]},
    ],
    ids=["nested env", "argv in a list", "command"],
)
def test_a_secret_an_env_or_argv_reveals_is_scrubbed_everywhere(
    workspace: Path, carrier: dict[str, Any]
) -> None:
    """The plain scrubber's pass is kept only for records without env mappings or argv lists; one that
    carries them (at any depth, or as the command) is scrubbed again by a scrubber that knows their
    values, so the value goes wherever else it appears too."""
    draft: dict[str, Any] = {"result": {"log": "started with k3y-value-9f8e7d", "n": [1, "k3y-value-9f8e7d"]}}
    record = _append(Ledger(workspace), **{**draft, **carrier})
    stored = json.dumps(record.model_dump(mode="json"))
    assert "k3y-value-9f8e7d" not in stored and "<redacted>" in _bare(stored)
    assert _bare(record.result["log"]) == "started with <redacted>"


class _Aliased(BaseModel):
    evidence_id: str
    state: EvidenceState
    wire_name: int = Field(serialization_alias="wireName")


@pytest.mark.anyio
async def test_the_answer_shows_what_was_stored_and_names_fields_as_before(workspace: Path) -> None:
    """The answer reuses the dump its record stored (one dump instead of three) only for that very
    output; with an alias the structured result keeps the wire name and the text the field's name."""
    from types import SimpleNamespace

    from perfgate.serving.adapter import _answer  # pyright: ignore[reportPrivateUsage]

    spec: Any = SimpleNamespace(name="t", brief=None, output_model=_Out)
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="t")
    ev = rt.evidence()
    out = await rt.commit(ev, _Out(evidence_id=ev.id, state=EvidenceState.EXECUTED, note="n"))
    answer = _answer(spec, out, rt)
    record = rt.ledger.get(ev.id)
    assert record is not None and answer.structured_content == record.result == out.model_dump(mode="json")
    # The model's field order, not the stored (sorted) one.
    assert list(answer.structured_content) == list(out.model_dump(mode="json"))
    other = _Out(evidence_id=ev.id, state=EvidenceState.EXECUTED, note="another")  # not the committed one
    assert _answer(spec, other, rt).structured_content == other.model_dump(mode="json")
    aliased = _Aliased(evidence_id="ev-1", state=EvidenceState.EXECUTED, wire_name=3)
    answer = _answer(spec, aliased, rt)
    assert answer.structured_content == {"evidence_id": "ev-1", "state": "executed", "wireName": 3}
    text = answer.content[0].text  # pyright: ignore[reportAttributeAccessIssue]
    assert '"wire_name":3' in text and "wireName" not in text
    assert type(answer) is CallToolResult  # not the spec's model: the SDK validates it as before


@pytest.mark.anyio
async def test_the_sdk_validates_only_what_is_not_a_dump_of_the_output_model(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK validates a returned result's structured content against the output model; a tool's
    answer (the dump of an instance of that very model) skips that second pass, any other result
    (a hand-built one, a wrong shape) is still validated and refused."""
    from perfgate.serving.adapter import PerfgateTool, make_tool_function
    from perfgate.tools import compute_mfu

    checked: list[Any] = []
    real = FuncMetadata._output_adapter  # pyright: ignore[reportPrivateUsage]

    def counting(self: FuncMetadata, model: Any) -> Any:
        checked.append(model)
        return real(self, model)

    async with Client(server, mode="auto") as client:
        await client.call_tool("compute_mfu", MFU_ARGS)  # the first call builds the tool from its module
        monkeypatch.setattr(FuncMetadata, "_output_adapter", counting)
        result = await client.call_tool("compute_mfu", MFU_ARGS)  # the client validates it (schema)
    assert not result.is_error and checked == []
    tool = PerfgateTool.for_function(
        make_tool_function(compute_mfu.SPEC, None), name="compute_mfu", structured_output=True
    )
    checked.clear()  # (building the tool derives its schema through the same adapter)
    wrong = CallToolResult(content=[], structured_content={"evidence_id": 1})
    with pytest.raises(ValidationError):
        tool.fn_metadata.convert_result(wrong)
    assert [m.__name__ for m in checked] == ["ComputeMfuOutput"]


@pytest.mark.anyio
async def test_a_record_without_artifacts_leaves_no_folder(workspace: Path, server: Any) -> None:
    async with Client(server, mode="auto") as client:
        result = await client.call_tool("compute_mfu", MFU_ARGS)
    assert not result.is_error
    artifacts = workspace / ".perfgate" / "artifacts"
    assert not any(artifacts.iterdir())
    report = Ledger(workspace).verify()
    assert report.ok and not report.warnings, report


@pytest.mark.anyio
async def test_an_unknown_field_and_a_bad_value_are_both_reported(server: Any) -> None:
    """Arguments are validated once (by the SDK); its failure and the unknown-field check still come
    back together, one line each, without the SDK's prefix."""
    async with Client(server, mode="auto") as client:
        result = await client.call_tool("compute_mfu", {**MFU_ARGS, "flops_kind": "magic", "peek": 1})
        alone = await client.call_tool("compute_mfu", {**MFU_ARGS, "flops_kind": "magic"})
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("compute_mfu: 2 invalid arguments")
    assert "- peek: unknown field" in text and "- flops_kind:" in text
    lone = alone.content[0].text  # type: ignore[union-attr]
    assert lone.startswith("compute_mfu: 1 invalid argument\n- flops_kind:")
    assert "Error executing tool" not in text + lone


_JSON_TEXTS = ["[1, 2]", ' {"a": 1}', "null", "\n[]", "true", "1", '"x"', "NaN", "nope", "", "[", "{bad", "n"]


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["buckets", "flops_kind", "device", "precision", "peak_tflops", "other"]),
        st.one_of(st.sampled_from(_JSON_TEXTS), st.text(max_size=12), st.integers(), st.none()),
    )
)
def test_the_pre_parse_shortcut_gives_what_the_sdk_gives(arguments: dict[str, Any]) -> None:
    from perfgate.server import build_server

    tool = _compute_mfu_tool(build_server)
    sdk = FuncMetadata(arg_model=tool.fn_metadata.arg_model)
    assert tool.fn_metadata.pre_parse_json(arguments) == sdk.pre_parse_json(arguments)


_TOOL: list[Any] = []


def _real(tool: Any) -> Any:
    """The tool a listed one runs as: a catalog tool's is built from its module (on its first call)."""
    return tool.loaded() if isinstance(tool, CatalogTool) else tool


def _compute_mfu_tool(build: Any) -> Any:
    if not _TOOL:
        import tempfile

        server = build(ServerConfig.create(Path(tempfile.mkdtemp(prefix="perfgate-test-"))))
        _TOOL.extend(map(_real, server._tool_manager.list_tools()))  # pyright: ignore[reportPrivateUsage]
    return next(t for t in _TOOL if t.name == "compute_mfu")


_PROBES: list[Any] = [None, 0, -3, 1.5, True, "x", "", [], ["a"], [1.5, None], {}, {"a": 1}]


def _property_pairs(original: dict[str, Any], served: Any) -> list[tuple[dict[str, Any], Any]]:
    """(original subschema, served subschema) for every property at every depth: the original's
    ``$ref``s are followed (siblings merged, as `inline_refs` does) while walking both side by side."""
    defs: dict[str, Any] = original.get("$defs", {})
    pairs: list[tuple[dict[str, Any], Any]] = []

    def resolve(node: Any) -> Any:
        while isinstance(node, dict) and "$ref" in node:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **rest}
        return node

    def walk(before: Any, after: Any) -> None:
        before = resolve(before)
        if not isinstance(before, dict):
            return
        assert isinstance(after, dict) and "$ref" not in after
        for name, prop in before.get("properties", {}).items():
            pairs.append((prop, after["properties"][name]))
            walk(prop, after["properties"][name])
        if "items" in before:
            walk(before["items"], after["items"])
        for key in ("anyOf", "oneOf", "allOf"):
            for b, a in zip(before.get(key, []), after.get(key, []), strict=False):
                walk(b, a)
        if isinstance(before.get("additionalProperties"), dict):
            walk(before["additionalProperties"], after["additionalProperties"])

    walk(original, served)
    return pairs


def test_served_output_schemas_accept_exactly_what_the_sdk_schemas_accept(server: Any) -> None:
    """Served output schemas have their ``$ref``s inlined and pydantic's anyOf of bare types written as
    type lists; every property of every tool's output schema, at every depth, must accept and refuse the
    same values as the schema the SDK generated (with its ``$defs``)."""
    tools = server._tool_manager.list_tools()  # pyright: ignore[reportPrivateUsage]
    compared = 0
    for listed in tools:
        tool = _real(listed)
        meta = tool.fn_metadata
        assert listed.output_schema == meta.output_schema, tool.name  # the catalog serves the code's
        if meta.output_schema is None:
            continue
        original = FuncMetadata(arg_model=meta.arg_model, output_model=meta.output_model).output_schema
        assert original is not None
        assert meta.output_schema == compact_schema(inline_refs(original))
        assert "$ref" not in json.dumps(meta.output_schema), tool.name
        defs = {"$defs": original.get("$defs", {})}
        for before, after in _property_pairs(original, meta.output_schema):
            old = Draft202012Validator({**defs, **before})
            new = Draft202012Validator(after)
            for probe in _PROBES:
                assert old.is_valid(probe) == new.is_valid(probe), (tool.name, before, probe)
            compared += 1
    assert compared > 300


def test_inlining_keeps_a_recursive_schema_and_merges_only_annotations() -> None:
    """A model that refers to itself keeps its ``$ref``s (inlining would never end); a ``$ref`` whose
    siblings would overwrite a validating keyword of the definition is kept apart under ``allOf``."""
    recursive = {
        "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
        "$ref": "#/$defs/N",
    }
    assert inline_refs(recursive) == recursive
    schema = {
        "$defs": {"E": {"enum": ["a", "b"], "description": "model doc"}},
        "properties": {
            "plain": {"$ref": "#/$defs/E"},
            "described": {"$ref": "#/$defs/E", "description": "field doc"},
            "narrowed": {"$ref": "#/$defs/E", "enum": ["a"]},
        },
    }
    out = inline_refs(schema)
    assert "$defs" not in out
    assert out["properties"]["plain"] == {"enum": ["a", "b"], "description": "model doc"}
    assert out["properties"]["described"] == {"enum": ["a", "b"], "description": "field doc"}
    narrowed = Draft202012Validator(out["properties"]["narrowed"])
    assert narrowed.is_valid("a") and not narrowed.is_valid("b")


def test_plain_scrubbers_share_their_secrets_but_count_their_own_redactions() -> None:
    first, second = Scrubber(), Scrubber()
    assert _bare(first.text(f"token {SECRET}")) == "token <redacted>"
    assert (first.redactions, second.redactions) == (1, 0)
    assert _bare(second.text(f"a {SECRET} b {SECRET}")) == "a <redacted> b <redacted>"
    assert (first.redactions, second.redactions) == (1, 2)


def test_the_clean_string_sets_are_emptied_when_full_and_scrubbers_keep_working(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The remembered clean strings stay bounded in all: full, every set is emptied, and a scrubber made
    before starts its set again (never adding to one no longer counted or kept)."""
    from perfgate.security import scrubber

    monkeypatch.setattr(scrubber, "_CLEAN_MAX_ENTRIES", 5)
    monkeypatch.setattr(scrubber, "_CLEAN", {})
    monkeypatch.setattr(scrubber, "_clean_entries", 0)
    early = Scrubber()
    for i in range(12):
        assert early.text(f"clean text {i}") == f"clean text {i}"
        assert sum(len(v) for v in scrubber._CLEAN.values()) <= 5
    assert scrubber._CLEAN[early._clean_key] is early._clean  # pyright: ignore[reportPrivateUsage]
    assert "clean text 11" in scrubber._CLEAN[early._clean_key]  # pyright: ignore[reportPrivateUsage]
    assert _bare(early.text(f"x {SECRET}")) == "x <redacted>"
    assert _bare(Scrubber(secrets=["clean text 11"]).text("clean text 11")) == "<redacted>"


def test_a_draft_changed_to_a_wrong_type_is_refused_before_anything_is_stored(workspace: Path) -> None:
    """The body is written from the draft's values and read back as a record (strictly) before it is
    stored: a value of another type (set after the draft was validated) never reaches the ledger as a
    body that reads back as something else."""
    ledger = Ledger(workspace)
    first = _append(ledger, result={"n": 1})
    for field, value in (("profiled", 1), ("exit_code", "2"), ("started_at", 5)):
        draft = EvidenceDraft(id=Ledger.new_id(), tool="t", state=EvidenceState.EXECUTED)
        setattr(draft, field, value)
        with pytest.raises(ValueError, match="not a valid record"):
            ledger.append(draft)
        assert ledger.get(draft.id) is None
    second = _append(ledger, result={"n": 2})
    assert (second.seq, second.prev_hash) == (first.seq + 1, first.hash)
    assert [r.id for r in ledger.records()] == [first.id, second.id]
    assert ledger.verify().ok


def test_a_mac_is_the_hmac_of_its_purpose_and_message() -> None:
    """MACs start from a copy of the keyed HMAC: each must equal a fresh HMAC (nothing carried over)."""
    import hmac

    from perfgate.security.trustroot import SigningKey

    key = SigningKey(bytes(range(32)))
    for purpose, message in [("a", "m"), ("a", "m"), ("b", "m"), ("a", "é" * 100), ("a", "")]:
        expected = hmac.digest(key.secret, f"{purpose}\x00{message}".encode(), "sha256").hex()
        assert key.mac(purpose, message) == expected
        assert key.check(purpose, message, expected)
    assert not key.check("b", "m", key.mac("a", "m"))


def test_timestamps_follow_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The formatted second is reused within a second only."""
    import time

    from perfgate.evidence import ledger as ledger_module

    clock = iter([1_700_000_000_123_456_789, 1_700_000_000_999_999_000, 1_700_000_001_000_001_000])
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    assert ledger_module._utc_now() == "2023-11-14T22:13:20.123456+00:00"  # pyright: ignore[reportPrivateUsage]
    assert ledger_module._utc_now() == "2023-11-14T22:13:20.999999+00:00"  # pyright: ignore[reportPrivateUsage]
    assert Ledger.new_id().startswith("ev-20231114T221321-")


def test_the_connection_outlives_its_own_writes_but_not_a_replaced_index(workspace: Path) -> None:
    """After its own appends (the WAL grows, a checkpoint may rewrite the database) the connection is
    kept; an index file removed underneath it (another process believed itself the last user) reopens it."""
    ledger = Ledger(workspace)
    _append(ledger)
    conn = ledger._shared.conn  # pyright: ignore[reportPrivateUsage]
    for i in range(5):
        _append(ledger, result={"i": i})
    assert ledger._shared.conn is conn  # pyright: ignore[reportPrivateUsage]
    ledger.db_path.with_name(ledger.db_path.name + "-shm").unlink()
    later = _append(ledger, result={"i": "later"})
    assert ledger._shared.conn is not conn  # pyright: ignore[reportPrivateUsage]
    assert Ledger(workspace).get(later.id) is not None


@pytest.mark.parametrize(
    "replaced",
    [
        [],
        [{"ledger_id": "a" * 32, "seq": 3}],
        [{"ledger_id": None, "seq": None}, {"ledger_id": "b", "seq": 1}],
    ],
)
def test_the_anchor_text_is_the_compact_json_of_the_anchor(replaced: list[dict[str, Any]]) -> None:
    """Anchor slots are written field by field; the text must stay what encoding the anchor gives (also for
    a workspace path that is not ASCII, and with databases replaced before)."""
    from perfgate.evidence import anchor as anchor_module

    anchor = {
        "ledger_id": "0123456789abcdef" * 2,
        "workspace": '/home/ünï "q"/ws\\x',
        "seq": 12345678901,
        "hash": "f" * 64,
        "key_id": "0" * 16,
        "mac": "e" * 64,
        "replaced": replaced,
    }
    expected = json.dumps(anchor, separators=(",", ":")).encode()
    assert anchor_module._anchor_text(anchor) == expected  # pyright: ignore[reportPrivateUsage]


@pytest.mark.anyio
async def test_compute_mfu_states_its_fixed_aggregation_rule_once_in_the_schema(server: Any) -> None:
    """How buckets aggregate never changes between calls: the output schema says it, once; the answer
    (structured and text, kept in the agent's context) does not repeat the sentence every call."""
    async with Client(server, mode="auto") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        result = await client.call_tool("compute_mfu", MFU_ARGS)
    schema = tools["compute_mfu"].output_schema
    assert schema is not None
    assert "sum(flops_per_step * steps) / sum(step_time_s * steps)" in json.dumps(schema["properties"])
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None and "aggregation" not in result.structured_content
    assert "sum(" not in text and "aggregation" not in text


def _reference_shorten(value: Any, max_list: int | None, max_str: int | None) -> Any:
    """The answer's shortening as first written (plain comparisons, ``x == int(x)``)."""
    import math

    if isinstance(value, dict):
        return {
            str(k): _reference_shorten(v, max_list, max_str)
            for k, v in cast("dict[Any, Any]", value).items()
            if not (v is None or v == [] or v == {} or v == "")
        }
    if isinstance(value, list):
        items = cast("list[Any]", value)
        kept = items if max_list is None else items[:max_list]
        shown = [_reference_shorten(v, max_list, max_str) for v in kept]
        return shown + ([f"...+{len(items) - len(kept)} more"] if len(items) > len(kept) else [])
    if isinstance(value, str):
        return value if max_str is None or len(value) <= max_str else value[: max(max_str - 3, 0)] + "..."
    if isinstance(value, float) and not isinstance(value, bool):
        if not math.isfinite(value) or value == 0:
            return value
        if value == int(value) and abs(value) < 1e15:
            return int(value)
        return float(f"{value:.4g}")
    return value


_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_TREES = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(tree=st.dictionaries(st.text(max_size=4), _TREES, max_size=5), rounds=st.sampled_from([None, 3, 0]))
def test_the_answer_json_is_what_plain_json_dumps_of_the_plain_shortening_gives(
    tree: dict[str, Any], rounds: int | None
) -> None:
    """The answer's shortening dispatches on exact types and its JSON comes from an encoder made once:
    the text is byte for byte what the plain shortening and ``json.dumps`` write (NaN, infinities,
    integral floats, non-string keys, empty values dropped, lists cut)."""
    from perfgate.serving.answer import _dumps, _shorten  # pyright: ignore[reportPrivateUsage]

    expected = json.dumps(
        _reference_shorten(tree, rounds, rounds and 40), separators=(",", ":"), ensure_ascii=False
    )
    assert _dumps(_shorten(tree, rounds, rounds and 40)) == expected


def _head(ledger: Ledger) -> tuple[int, str]:
    seq, hash_ = ledger.head_path.read_text().split()
    return int(seq), hash_


def test_head_and_anchor_are_opened_once_not_per_append(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends after the first write HEAD and the anchor through the descriptors kept from it."""
    import os

    ledger = Ledger(workspace)
    _append(ledger, result={"i": 0})
    opened: list[str] = []
    real_open = os.open

    def counting(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    for i in range(3):
        last = _append(ledger, result={"i": i + 1})
    assert not {str(ledger.head_path), str(ledger.anchor_path)} & set(opened)
    assert _head(ledger) == (last.seq, last.hash) and _slot_seqs(ledger)[0] is not None
    anchor = ledger.anchor()
    assert anchor is not None and anchor["seq"] == last.seq


@pytest.mark.parametrize("change", ["replaced", "moved", "truncated", "symlink", "hardlink", "chmod"])
def test_a_head_file_changed_between_appends_is_written_as_before(
    workspace: Path, tmp_path: Path, change: str
) -> None:
    """HEAD is kept open between appends, but written through that descriptor only while the path still
    names the same plain file: replaced, moved away, truncated, turned into a link or given a second
    name, the next append leaves HEAD a plain file holding the newest record, and writes nothing
    through a link or into the file that was moved, exactly as reopening it every time did."""
    import os

    ledger = Ledger(workspace)
    _append(ledger, result={"i": 0})
    head = ledger.head_path
    outside = tmp_path / "outside"
    outside.write_text("not the ledger's\n")
    if change == "replaced":
        other = head.with_name("HEAD.new")
        other.write_text("0 " + "f" * 64 + "\n")
        os.replace(other, head)
    elif change == "moved":
        head.rename(head.with_name("HEAD.old"))
    elif change == "truncated":
        os.truncate(head, 0)
    elif change == "symlink":
        head.unlink()
        head.symlink_to(outside)
    elif change == "hardlink":
        os.link(head, outside.with_name("second-name"))
    else:
        head.chmod(0o600)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.parent != head.parent}
    last = _append(ledger, result={"i": 1})
    st = os.lstat(head)
    assert st.st_nlink == 1 and head.is_file() and not head.is_symlink()
    assert _head(ledger) == (last.seq, last.hash)
    assert outside.read_text() == "not the ledger's\n"
    for path, data in before.items():  # HEAD.old, the second name, the link's target: untouched
        if path != head and path.exists():
            assert path.read_bytes() == data, path
    assert ledger.verify().ok


@pytest.mark.parametrize("change", ["replaced-by-older-copy", "moved", "deleted"])
def test_an_anchor_file_changed_between_appends_is_written_as_before(workspace: Path, change: str) -> None:
    """The anchor file is kept open between appends too, and used only while its path names the same
    file: a copy put in its place, a moved or a deleted anchor is read and advanced at the path, as
    reopening it every time did (the moved file is never written again)."""
    import os

    ledger = Ledger(workspace)
    _append(ledger, result={"i": 0})
    anchor = ledger.anchor_path
    old = anchor.read_bytes()
    _append(ledger, result={"i": 1})
    moved = anchor.with_name("anchor.moved")
    if change == "replaced-by-older-copy":
        copy = anchor.with_name("anchor.copy")
        copy.write_bytes(old)
        os.replace(copy, anchor)
    elif change == "moved":
        anchor.rename(moved)
    else:
        anchor.unlink()
    kept = moved.read_bytes() if moved.exists() else None
    last = _append(ledger, result={"i": 2})
    current = ledger.anchor()
    assert current is not None and current["seq"] == last.seq
    if kept is not None:
        assert moved.read_bytes() == kept
    assert ledger.verify().ok


def test_a_forked_child_appends_through_its_own_descriptors(workspace: Path) -> None:
    """A child forked after appends does not use the HEAD and anchor descriptors it inherited (nor
    close them under its parent): it opens its own, and both go on appending."""
    import os

    ledger = Ledger(workspace)
    _append(ledger, result={"i": 0})
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            record = _append(ledger, result={"i": 1})
            code = 0 if _head(ledger) == (record.seq, record.hash) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    last = _append(ledger, result={"i": 2})
    assert last.seq == 3 and _head(ledger) == (3, last.hash)
    current = ledger.anchor()
    assert current is not None and current["seq"] == 3
    assert ledger.verify().ok


_SLOT_BYTES = st.binary(max_size=40) | st.sampled_from([b" ", b"\n", b"}", b"x"])


@settings(max_examples=300, deadline=None)
@given(
    old_text=st.binary(max_size=300),
    new_text=st.binary(min_size=1, max_size=300).filter(lambda b: not b.endswith((b" ", b"\n"))),
    intrusions=st.lists(st.tuples(st.integers(0, 8191), _SLOT_BYTES), max_size=3),
    whole=st.booleans(),
)
def test_an_anchor_slot_written_in_part_ends_up_holding_exactly_the_new_slot(
    old_text: bytes, new_text: bytes, intrusions: list[tuple[int, bytes]], whole: bool
) -> None:
    """Only the changed head of a slot is written over what the slot held (read under the anchor's lock):
    whatever that was (another anchor, a torn write, stray bytes in its padding, a shorter file), the slot
    must then hold the new slot byte for byte."""
    from perfgate.evidence import anchor as anchor_module

    size = 8192
    old = bytearray(old_text.ljust(size - 1) + b"\n")
    for at, chunk in intrusions:
        old[at : at + len(chunk)] = chunk
    old_bytes = bytes(old[:size]) if whole else bytes(old[: size // 2])
    new = new_text.ljust(size - 1) + b"\n"
    end = anchor_module._changed_end(old_bytes, new, len(new_text))  # pyright: ignore[reportPrivateUsage]
    assert new[:end] + old_bytes[end:] == new


def test_the_remembered_process_id_is_the_childs_after_a_fork(workspace: Path) -> None:
    """The ledger reads its process id without a system call; a forked child must still see its own (or it
    would write through the parent's connection and descriptors)."""
    from perfgate.evidence._held import this_pid

    assert this_pid() == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(write, str(this_pid()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.read(read, 50).decode() == str(pid)
    finally:
        os.close(read)


_BAD_VALUES: list[Any] = [
    None, "x", "[1", "[1, 2]", '{"a": 1}', "null", 1.5, -1, 0, True, [], {}, [{}], [None], [1, "a"],
    [{"name": 1}], [{"name": "b", "flops_per_step": 1e14}], {"a": 1}, "1e400", 1e308,
]  # fmt: skip


def _two_step_message(tool: Any, spec: Any, arguments: dict[str, Any]) -> str | None:
    """The argument error as the two validations gave it: the SDK's model of the flat parameters, then
    the tool's input model on what that one returned (None: both accept the arguments)."""
    from perfgate.serving.adapter import validation_message
    from perfgate.serving.failures import argument_message, field_errors

    try:
        kwargs = FuncMetadata.validate_arguments(tool.fn_metadata, arguments)
    except ValidationError as exc:
        return argument_message(spec.name, field_errors(exc, tool.documented))
    try:
        spec.input_model.model_validate(kwargs)
    except ValidationError as exc:  # refused inside the tool body: the SDK names the tool first
        return f"Error executing tool {spec.name}: {validation_message(spec.name, exc, spec.input_model)}"
    return None


@pytest.mark.anyio
async def test_arguments_validated_once_give_the_two_step_messages(workspace: Path) -> None:
    """Each tool's arguments are validated once, by its input model; every refusal must read exactly as
    when the SDK's parameter model refused first and the input model after (wrong types, missing fields,
    values JSON-encoded in strings, bad nested items, cross-field rules), and what both accepted must
    still be accepted."""
    from perfgate.server import build_server
    from perfgate.tools import registered_specs

    server = build_server(ServerConfig.create(workspace))
    tools = {t.name: _real(t) for t in server._tool_manager.list_tools()}  # pyright: ignore[reportPrivateUsage]
    cases: list[tuple[str, dict[str, Any]]] = [
        ("compute_mfu", {**MFU_ARGS, "device": None, "precision": None}),
        ("compute_mfu", {**MFU_ARGS, "peak_tflops": -1}),
        ("compute_mfu", {**MFU_ARGS, "buckets": [{"name": "b", "flops_per_step": 1e14}]}),
        ("compute_mfu", {**MFU_ARGS, "buckets": [{**MFU_ARGS["buckets"][0], "flops_id": "ev-1"}]}),
        ("compute_mfu", {**MFU_ARGS, "buckets": json.dumps(MFU_ARGS["buckets"])}),
        ("compute_mfu", {**MFU_ARGS, "buckets": [{**MFU_ARGS["buckets"][0], "steps": 0, "extra": 1}]}),
        ("compute_mfu", {**MFU_ARGS, "precision": "fp4", "flops_kind": "magic"}),
    ]
    checked = accepted = 0
    async with Client(server) as client:
        for spec in registered_specs(False):
            if spec.command is not None:  # gated tools still validate in two steps
                continue
            tool = tools[spec.name]
            properties = list(tool.parameters.get("properties", {}))
            tool_cases = [args for name, args in cases if name == spec.name] + [{}]
            tool_cases += [{p: v} for p in properties for v in _BAD_VALUES]
            tool_cases += [dict.fromkeys(properties, v) for v in _BAD_VALUES]
            for arguments in tool_cases:
                expected = _two_step_message(tool, spec, arguments)
                if expected is None:  # still accepted, as the same input
                    once = tool.fn_metadata.validate_arguments(arguments)
                    twice = FuncMetadata.validate_arguments(tool.fn_metadata, arguments)
                    assert list(once.values()) == [spec.input_model.model_validate(twice)]
                    accepted += 1
                    continue
                result = await client.call_tool(spec.name, arguments)
                assert result.is_error, (spec.name, arguments)
                assert "\n".join(getattr(c, "text", "") for c in result.content) == expected, (
                    spec.name,
                    arguments,
                )
                checked += 1
    assert checked > 500
    assert accepted >= 2  # the compute_mfu calls above that name a peak rightly


@pytest.mark.anyio
async def test_the_internal_input_keyword_cannot_be_sent_as_an_argument(workspace: Path) -> None:
    """The validated input reaches the tool function under an internal keyword; a client that sends that
    keyword itself (with a forged input, alone or beside valid arguments) is refused as an unknown field
    and nothing is recorded."""
    from perfgate.server import build_server
    from perfgate.serving.adapter import _INPUT  # pyright: ignore[reportPrivateUsage]

    server = build_server(ServerConfig.create(workspace))
    forged = {**MFU_ARGS, "peak_tflops": 1.0}
    async with Client(server) as client:
        for arguments in ({**MFU_ARGS, _INPUT: forged}, {_INPUT: forged}, {**MFU_ARGS, _INPUT: None}):
            result = await client.call_tool("compute_mfu", arguments)
            assert result.is_error, arguments
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            assert f"{_INPUT}: unknown field" in text
        assert not Ledger(workspace).records("compute_mfu", trusted_only=False)
        valid = await client.call_tool("compute_mfu", MFU_ARGS)  # the control: the same call without it
        assert not valid.is_error
        assert len(Ledger(workspace).records("compute_mfu")) == 1
