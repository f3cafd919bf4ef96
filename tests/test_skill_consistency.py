"""The skill says what the code does, no more and no less.

Read from the code, not from a copy of its vocabulary: the keep gates (the gate registry's rows,
cross-checked against what ``record_decision`` returns), the
states each tool module can set, the generated tool schemas, and the identifiers the source knows.
Then the skill is held to them in both directions: it may not name a gate, state, field or rule the
code lacks, and the code may not enforce a gate or set a state the skill does not mention. Three rules
the skill once got wrong are probed by running the code (launch counting, non-finite tensors, the
profiled flag of trace analysis), and the skill must state whichever behaviour the code shows.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from perfgate.decisions.gates.registry import GATES
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.harness.dump import dump_tensors
from perfgate.skills.catalog import SKILL_DIR, SKILL_FILE, skill_files
from perfgate.tools import REGISTRY

SRC = Path(__file__).resolve().parents[1] / "src" / "perfgate"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
_IDENT = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_STATES = {s.value for s in EvidenceState}

# Names the skill teaches that belong to other software (PyTorch, DataLoader and DDP/FSDP arguments,
# torch_musa functions) or are free-text examples, not perfgate vocabulary. Anything else the skill
# writes as a snake_case identifier must exist in perfgate's schemas or source.
EXTERNAL: dict[str, str] = {
    **dict.fromkeys(["deep_ep", "hybrid_ep"], "DeepEP's and HybridEP's CUDA kernel namespaces"),
    **dict.fromkeys(
        ["save_checkpoint", "load_checkpoint"],
        "a training project's own checkpoint functions (Megatron-LM, DeepSpeed), read in the files a change touched",
    ),
    **dict.fromkeys(
        ["num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "non_blocking"],
        "torch DataLoader / Tensor.to arguments",
    ),
    **dict.fromkeys(
        [
            "bucket_cap_mb",
            "gradient_as_bucket_view",
            "find_unused_parameters",
            "static_graph",
            "reshard_after_forward",
            "fully_shard",
            "use_reentrant",
            "expandable_segments",
            "weights_only",
        ],
        "torch DDP / FSDP / checkpoint / allocator / torch.load options",
    ),
    **dict.fromkeys(
        ["device_type", "get_device_properties", "mem_get_info"], "torch.autocast / torch.musa functions"
    ),
    "example_batch": "a placeholder variable in a code example",
    "my_key": "a placeholder contract key in an example",
    "moe_token_dispatcher": "an example changed_variable value (free text)",
}


def _skill_texts() -> dict[str, str]:
    return {rel: path.read_text(encoding="utf-8") for rel, path in skill_files().items()}


def _skill() -> str:
    return (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end != -1 else len(text)]


# ----------------------------------------------------------------------------------------- gates


def gate_names_in_code() -> set[str]:
    """Every gate the keep evaluates: the registry's rows (`perfgate.decisions.gates.registry`), the only
    place a gate gets its name."""
    return {row.name for row in GATES}


def gate_names_in_skill() -> set[str]:
    table = _section(_skill(), "What a keep must pass")
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))


def test_the_skill_lists_exactly_the_gates_the_code_evaluates() -> None:
    code, skill = gate_names_in_code(), gate_names_in_skill()
    assert not code - skill, f"gates the code enforces but SKILL.md does not list: {sorted(code - skill)}"
    assert not skill - code, f"gates SKILL.md lists but the code does not have: {sorted(skill - code)}"


def _record(ledger: Ledger, tool: str, state: str, result: dict[str, Any], inputs: dict[str, Any]) -> str:
    eid = Ledger.new_id()
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool=tool,
            state=EvidenceState(state),
            inputs=inputs,
            result={"evidence_id": eid, "state": state, **result},
        )
    )
    return eid


def _window(ledger: Ledger, launches: list[int]) -> str:
    windows = [{"launch": launch, "index": i} for i, launch in enumerate(launches)]
    return _record(
        ledger,
        "run_benchmark_window",
        "executed",
        {
            "median_step_ms": 10.0,
            "peak_memory_bytes": 1000,
            "environment_fingerprint": {"device": "cpu"},
            "windows": windows,
            "windows_measured": len(windows),
        },
        {"command": ["python", "train.py"], "contract": {"invariants": {"model": "m"}, "execution": {}}},
    )


async def _gates_shown(workspace: Path, server: Any, launches: list[int] | None) -> dict[str, str]:
    """Gate name -> status that record_decision('show') returns for a system optimization whose sides
    are each one window record with windows from ``launches`` (no comparison at all when None)."""
    ledger = Ledger(workspace)
    links: list[dict[str, str]] = []
    if launches is not None:
        base, cand = _window(ledger, launches), _window(ledger, launches)
        comp = _record(
            ledger,
            "compare_benchmarks",
            "passed",
            {"status": "comparable", "verdict": "improved", "speedup": 1.3, "reasons": []},
            {"baseline": [base], "candidate": [cand], "declared_changes": []},
        )
        links = [{"id": comp, "role": "comparison"}]
    async with Client(server, mode="auto") as client:
        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "h",
                "classification": "system_optimization",
                "changed_variable": "v",
                "evidence": links,
            },
        )
        assert opened.structured_content is not None, opened.content
        shown = await client.call_tool(
            "record_decision", {"action": "show", "experiment_id": opened.structured_content["experiment_id"]}
        )
    assert shown.structured_content is not None, shown.content
    return {g["name"]: g["status"] for g in shown.structured_content["gates"]}


@pytest.mark.anyio
async def test_the_gates_record_decision_returns_are_the_registrys(workspace: Path, server: Any) -> None:
    shown = await _gates_shown(workspace, server, [0, 1, 2])
    assert "window_count" in shown and "ledger_integrity" in shown
    assert set(shown) <= gate_names_in_code(), "record_decision returns gates the registry does not list"


@pytest.mark.anyio
async def test_how_the_skill_counts_windows_is_how_the_gate_counts_them(workspace: Path, server: Any) -> None:
    one_launch = (await _gates_shown(workspace, server, [0, 0, 0]))["window_count"]
    three = (await _gates_shown(workspace, server, [0, 1, 2]))["window_count"]
    assert three == "passed"
    skill = re.sub(r"\s+", " ", _skill()).lower()
    counted_once = "same-process windows count once" in skill or "same_process` windows count once" in skill
    if one_launch == "failed":
        assert counted_once, "the gate counts one launch's windows once; SKILL.md must say so"
        assert "one launch is one noise sample" not in skill
    else:
        assert not counted_once, "the gate counts same-process windows separately; SKILL.md says otherwise"


# ---------------------------------------------------------------------------------------- states


def states_a_tool_sets(module: Path) -> set[str]:
    """States a tool module can give its evidence: EvidenceState members in ``state=`` arguments, in
    assignments to names containing 'state', and in functions returning an EvidenceState."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    found: set[str] = set()

    def collect(node: ast.AST) -> None:
        for n in ast.walk(node):
            if (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "EvidenceState"
            ):
                found.add(n.attr.lower())

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "state":
            collect(node.value)
            found.update(_domain_states(tree, node.value))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "state" in t.id.lower() for t in targets):
                collect(node.value)
        elif (
            isinstance(node, ast.FunctionDef)
            and node.returns is not None
            and "EvidenceState" in ast.unparse(node.returns)
        ):
            collect(node)
    return found


def _domain_states(tree: ast.Module, value: ast.expr) -> set[str]:
    """``EvidenceState(f(...))`` where ``f`` is imported from a domain module: the string literals ``f``
    returns there (the tool is an adapter; the domain decides the state)."""
    if not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "EvidenceState"
        and value.args
        and isinstance(value.args[0], ast.Call)
        and isinstance(value.args[0].func, ast.Name)
    ):
        return set()
    name = value.args[0].func.id
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            source = SRC.parent / Path(*node.module.split(".")).with_suffix(".py")
            for fn in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(fn, ast.FunctionDef) and fn.name == name:
                    return {
                        c.value
                        for r in ast.walk(fn)
                        if isinstance(r, ast.Return) and r.value is not None
                        for c in ast.walk(r.value)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in _STATES
                    }
    return set()


def test_the_state_table_lists_exactly_the_evidence_states() -> None:
    table = _section(_skill(), "Evidence states")
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))
    assert listed == _STATES


_STATE_FROM = {"run_benchmark_pair": "compare_benchmarks"}
"""Tools whose state is that of a record written by another tool's code (the pair's comparison)."""


def test_each_tool_row_names_exactly_the_states_that_tool_can_set() -> None:
    table = _section(_skill(), "Which tool answers which question")
    problems: list[str] = []
    checked = 0
    for spec in REGISTRY:
        rows = [
            line
            for line in table.splitlines()
            if f"| [`{spec.name}`](references/tool-{spec.name}.md) |" in line
        ]
        assert len(rows) == 1, f"SKILL.md's tool table needs one row for {spec.name}"
        said = {w for w in re.findall(r"[a-z_]+", rows[0].rsplit("|", 2)[-2].lower()) if w in _STATES}
        module = SRC / "tools" / f"{spec.name}.py"
        if not module.is_file():
            continue
        sets = states_a_tool_sets(module)
        if spec.name in _STATE_FROM:  # its answer carries the state of the record another tool's code wrote
            sets |= states_a_tool_sets(SRC / "tools" / f"{_STATE_FROM[spec.name]}.py")
        checked += 1
        if said != sets:
            problems.append(f"{spec.name}: SKILL.md says {sorted(said)}, the code sets {sorted(sets)}")
    assert checked >= 10
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------- vocabulary


def _schema_vocabulary() -> set[str]:
    words: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "properties" and isinstance(value, dict):
                    words.update(value)
                if key == "enum" and isinstance(value, list):
                    words.update(str(v) for v in value)
                if key == "const":
                    words.add(str(value))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for path in (SRC / "schemas").glob("*.json"):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return words


def _source_identifiers() -> set[str]:
    """Identifier-like string literals and defined names anywhere in perfgate's source."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _IDENT.fullmatch(node.value)
            ):
                names.add(node.value)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def test_every_identifier_the_skill_names_exists_in_the_code() -> None:
    known = _schema_vocabulary() | _source_identifiers() | {s.name for s in REGISTRY} | set(EXTERNAL)
    unknown: dict[str, set[str]] = {}
    for rel, text in _skill_texts().items():
        for span in _CODE_SPAN.findall(text):
            for ident in re.findall(r"(?<![\w.\-/])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w(])", span):
                if ident not in known:
                    unknown.setdefault(ident, set()).add(rel)
    assert not unknown, (
        "the skill names identifiers perfgate does not have (fix the text, or list a name that belongs to "
        f"other software in EXTERNAL): {dict(sorted(unknown.items()))}"
    )


def test_every_verdict_and_decision_the_code_returns_is_explained() -> None:
    skill = _skill()
    for tool, field in (("compare_benchmarks", "verdict"), ("record_decision", "decision")):
        schema = json.loads((SRC / "schemas" / f"{tool}.output.json").read_text(encoding="utf-8"))
        prop = schema["properties"][field]
        values = {v for option in prop.get("anyOf", [prop]) for v in option.get("enum", [])}
        assert values, f"{tool}.{field} has no enum in its schema"
        assert not [v for v in values if f"`{v}`" not in skill], f"SKILL.md does not explain every {field}"


# ------------------------------------------------------------------------ rules probed by running


@pytest.mark.anyio
async def test_what_the_skill_says_of_matching_infinities_is_what_compare_tensors_does(
    workspace: Path, server: Any
) -> None:
    same = {"w": np.array([1.0, np.inf, -np.inf], dtype=np.float32)}
    dump_tensors(workspace / "a.safetensors", same)
    dump_tensors(workspace / "b.safetensors", same)
    async with Client(server, mode="auto") as client:
        result = await client.call_tool(
            "compare_tensors",
            {"reference": "a.safetensors", "candidate": "b.safetensors", "atol": 0, "rtol": 0},
        )
    assert result.structured_content is not None, result.content
    fails = result.structured_content["status"] != "match"
    correctness = re.sub(r"\s+", " ", (SKILL_DIR / "references" / "correctness.md").read_text()).lower()
    says_fails = "any nan or inf on either side fails the tensor" in correctness
    assert says_fails == fails, (
        f"compare_tensors {'fails' if fails else 'passes'} identical infinities by default; correctness.md "
        f"{'says they fail' if says_fails else 'does not say they fail'}"
    )


@pytest.mark.anyio
async def test_what_the_skill_says_of_the_profiled_flag_is_what_trace_analysis_returns(
    workspace: Path, server: Any
) -> None:
    trace = FIXTURES / "traces" / "musa_s4000_rank1.json"
    shutil.copy(trace, workspace / trace.name)
    async with Client(server, mode="auto") as client:
        result = await client.call_tool("profile_segment", {"mode": "analyze", "trace_paths": [trace.name]})
    assert result.structured_content is not None, result.content
    analyze_profiled = result.structured_content["profiled"]
    texts = " ".join(re.sub(r"\s+", " ", t).lower() for t in _skill_texts().values())
    if not analyze_profiled:
        assert "always flagged profiled" not in texts
        assert '`mode="analyze"` on existing traces is not' in _skill()
    else:
        assert "is not flagged" not in texts


def test_the_required_invariants_the_skill_names_are_the_ones_the_gate_requires() -> None:
    vocabulary = pytest.importorskip("perfgate.benchmarking.workload.vocabulary")
    required: tuple[str, ...] = vocabulary.REQUIRED_INVARIANTS
    row = next(line for line in _skill().splitlines() if line.startswith("| `required_invariants` |"))
    assert set(re.findall(r"`([a-z_]+)`", row)) - {"required_invariants"} == set(required)


def test_the_task_quality_advice_names_the_tools_the_gate_accepts() -> None:
    binding = pytest.importorskip("perfgate.decisions.binding")
    accepted = set(binding.QUALITY_KINDS.values())
    section = _section(
        (SKILL_DIR / "references" / "correctness.md").read_text(encoding="utf-8"), "Task quality"
    )
    called = set(re.findall(r"(?<![\w.])([a-z]+(?:_[a-z]+)+)\(", section))
    assert accepted <= called, f"correctness.md's task-quality section must show {sorted(accepted - called)}"
    assert called <= accepted, (
        f"correctness.md's task-quality section shows {sorted(called - accepted)}, which the task_quality "
        "gate does not accept"
    )


# ------------------------------------------------------------------------------------ long runs


async def _runs_finished(workspace: Path, server: Any, links: list[dict[str, str]]) -> tuple[str, str]:
    """(status, reason) of the runs_finished gate for a system optimization with ``links`` attached."""
    async with Client(server, mode="auto") as client:
        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "h",
                "classification": "system_optimization",
                "changed_variable": "v",
                "evidence": links,
            },
        )
        assert opened.structured_content is not None, opened.content
        shown = await client.call_tool(
            "record_decision", {"action": "show", "experiment_id": opened.structured_content["experiment_id"]}
        )
    assert shown.structured_content is not None, shown.content
    (gate,) = [g for g in shown.structured_content["gates"] if g["name"] == "runs_finished"]
    return gate["status"], gate["reason"]


@pytest.mark.anyio
async def test_what_the_skill_says_of_unfinished_runs_is_what_the_keep_gate_does(
    workspace: Path, server: Any
) -> None:
    """A keep citing a detached run whose result is not recorded is refused, however the run is cited."""
    assert "A keep citing a run whose result is not recorded is refused (`runs_finished`)" in re.sub(
        r"\s+", " ", _skill()
    )
    ledger = Ledger(workspace)
    run_id = "run-0123456789abcdef"
    inputs = {"command": ["python", "train.py"], "detach": True}
    start = _record(ledger, "run_benchmark_window", "planned", {"run_id": run_id, "windows": []}, inputs)
    done = _window(ledger, [0, 1, 2])
    comparison = _record(
        ledger,
        "compare_benchmarks",
        "passed",
        {"status": "comparable", "verdict": "improved", "speedup": 1.3, "reasons": []},
        {"baseline": [done], "candidate": [start], "declared_changes": []},
    )
    health = _record(ledger, "check_training_health", "passed", {}, {"evidence_id": start})
    # attached in any role, or named by an attached comparison or health check: refused
    for links in (
        [{"id": start, "role": "candidate"}],
        [{"id": start, "role": "note"}],
        [{"id": comparison, "role": "comparison"}],
        [{"id": health, "role": "quality"}],
    ):
        status, reason = await _runs_finished(workspace, server, links)
        assert status == "failed" and run_id in reason and "not observed" in reason, (links, reason)
    # another run's result, or a second start record of the same run, is no observation of its end
    _record(ledger, "run_benchmark_window", "executed", {"run_id": "run-fedcba9876543210"}, inputs)
    _record(ledger, "run_benchmark_window", "planned", {"run_id": run_id}, inputs)
    assert (await _runs_finished(workspace, server, [{"id": start, "role": "candidate"}]))[0] == "failed"
    # benchmark_run(action="result") recorded it: the end was observed
    _record(ledger, "run_benchmark_window", "executed", {"run_id": run_id, "windows": []}, inputs)
    for links in ([{"id": start, "role": "candidate"}], [{"id": comparison, "role": "comparison"}]):
        assert (await _runs_finished(workspace, server, links))[0] == "passed"
