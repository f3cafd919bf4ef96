"""The skill stays true to the product: tool names, tool fields, links, states and roles it teaches."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from perfgate.decisions.experiments import Classification, Role
from perfgate.evidence import EvidenceState
from perfgate.skills.catalog import (
    REFERENCES,
    SKILL_DIR,
    SKILL_FILE,
    SKILL_NAME,
    TOOL_REFERENCE_PREFIX,
    Reference,
    skill_files,
)
from perfgate.skills.prompts import PROMPTS
from perfgate.tools import REGISTRY

# Every registered tool is taught and every tool the skill calls is registered.
KNOWN_TOOLS = frozenset(spec.name for spec in REGISTRY)

# A tool call in the skill is a bare snake_case name followed by "(": `compare_tensors(atol=...)`.
# Library calls are written with their module (`torch.compile(...)`), which the look-behind excludes.
_CALL = re.compile(r"(?<![\w.])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\(")
_KEYWORD = re.compile(r"([A-Za-z_]\w*)\s*=(?!=)")
_LINK = re.compile(r"\]\(([^)\s]+\.md)\)")

SAMPLE_ARGS = {
    "command": "torchrun --nproc-per-node 8 train.py --config base.yaml",
    "goal": "tokens/s",
    "constraints": "no more than 2 GPU hours",
    "claim": "1.4x from torch.compile",
    "change": "torch.compile(model)",
    "evidence_ids": "ev-1, ev-2",
    "cuda_reference": "captures/cuda",
    "model": "32 layers, 8 experts, top-2",
    "cluster": "2 nodes x 8 H100",
}


def _texts() -> dict[str, str]:
    """Everything an agent reads: the markdown files and every prompt rendered with sample arguments."""
    texts = {rel: path.read_text(encoding="utf-8") for rel, path in skill_files().items()}
    for spec in PROMPTS:
        params = typing.get_type_hints(spec.render)
        args = {name: SAMPLE_ARGS[name] for name in params if name != "return"}
        texts[f"prompt:{spec.name}"] = spec.render(**args)
    return texts


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start``, skipping brackets and quoted strings."""
    depth = 0
    quote: str | None = None
    for i in range(start, min(len(text), start + 3000)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and text[i - 1] in "=[{(:, \n":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise AssertionError(f"unbalanced call starting at {text[start - 30 : start + 60]!r}")


def _top_level_parts(args: str) -> list[str]:
    parts: list[str] = []
    depth, quote, current = 0, None, ""
    for i, ch in enumerate(args):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (i == 0 or args[i - 1] in "=[{(:, \n"):
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += ch
    parts.append(current.strip())
    return [p for p in parts if p]


def _calls(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(tool name, keyword names, positional arguments other than `...`) for each call in ``text``."""
    found: list[tuple[str, list[str], list[str]]] = []
    for match in _CALL.finditer(text):
        open_at = match.end() - 1
        inner = text[open_at + 1 : _closing(text, open_at)]
        keywords: list[str] = []
        positional: list[str] = []
        for part in _top_level_parts(inner):
            if part == "...":
                continue
            kw = _KEYWORD.match(part)
            if kw:
                keywords.append(kw.group(1))
            else:
                positional.append(part)
        found.append((match.group(1), keywords, positional))
    return found


def _input_model(name: str) -> type[BaseModel] | None:
    """The registered tool's input model (None for a name that is not a tool)."""
    return next((spec.input_model for spec in REGISTRY if spec.name == name), None)


def _fields(model: type[BaseModel]) -> set[str]:
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias}
    return names


def test_every_call_in_the_skill_names_a_known_tool() -> None:
    unknown = {
        (where, name)
        for where, text in _texts().items()
        for name, _, _ in _calls(text)
        if name not in KNOWN_TOOLS
    }
    assert not unknown, (
        f"calls to unknown tools {sorted(unknown)}; fix the name, or write library calls with their "
        "module (torch.compile(...)) so they are not read as tool calls"
    )


def test_every_known_tool_is_named_in_skill_md_and_called_somewhere() -> None:
    skill = (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8")
    assert not [t for t in sorted(KNOWN_TOOLS) if f"`{t}`" not in skill]
    called = {name for text in _texts().values() for name, _, _ in _calls(text)}
    assert sorted(KNOWN_TOOLS - called) == []


def test_tool_calls_use_only_the_tools_input_fields() -> None:
    problems: list[str] = []
    checked: set[str] = set()
    for where, text in _texts().items():
        for name, keywords, positional in _calls(text):
            if positional:
                problems.append(f"{where}: {name}(...) passes {positional} without a field name")
            model = _input_model(name)
            if model is None:
                continue  # the module has not landed yet: nothing to check against
            checked.add(name)
            bad = [k for k in keywords if k not in _fields(model)]
            if bad:
                problems.append(f"{where}: {name} has no input field(s) {bad}")
    assert not problems, "\n".join(problems)
    # At least the foundation tools are checked, so this test cannot pass vacuously.
    assert {"compute_mfu", "record_decision"} <= checked


def test_the_call_reader_sees_fields_and_positionals() -> None:
    text = 'x = torch.compile(m)\ncompare_tensors(reference="a.npz", candidate=f(x, y), atol=1e-5, ..., overrides=[{"pattern": "g/*", "atol": 1}])\nbad_call("pos")'
    assert _calls(text) == [
        ("compare_tensors", ["reference", "candidate", "atol", "overrides"], []),
        ("bad_call", [], ['"pos"']),
    ]


def test_every_reference_is_linked_from_skill_md_and_every_file_is_catalogued() -> None:
    skill = (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8")
    linked = set(_LINK.findall(skill))
    assert {ref.relative_path for ref in REFERENCES} <= linked
    on_disk = {f"references/{p.name}" for p in (SKILL_DIR / "references").glob("*.md")}
    assert on_disk == {ref.relative_path for ref in REFERENCES}


def test_every_markdown_link_resolves() -> None:
    for rel, path in skill_files().items():
        for target in _LINK.findall(path.read_text(encoding="utf-8")):
            assert (path.parent / target).resolve().is_file(), f"{rel} links to missing {target}"


def test_skill_md_has_agent_skill_front_matter() -> None:
    lines = (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "---"
    end = lines.index("---", 1)
    fields = dict(line.split(": ", 1) for line in lines[1:end])
    assert set(fields) == {"name", "description"}
    assert fields["name"] == SKILL_NAME
    description = fields["description"]
    assert 100 < len(description) <= 1024
    # A plain YAML scalar may not contain ": " or " #", nor start with a YAML indicator.
    assert ": " not in description and " #" not in description
    assert description[0].isalnum()


def test_skill_md_teaches_every_evidence_state_role_and_classification() -> None:
    skill = (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8")
    for state in EvidenceState:
        assert f"| `{state.value}` |" in skill, f"SKILL.md's state table lacks {state.value}"
    for role in typing.get_args(Role):
        assert f"`{role}`" in skill, f"SKILL.md does not list the role {role}"
    correctness = (SKILL_DIR / "references" / "correctness.md").read_text(encoding="utf-8")
    for classification in typing.get_args(Classification):
        assert f"`{classification}`" in correctness


TOPICS = [ref for ref in REFERENCES if not ref.name.startswith(TOOL_REFERENCE_PREFIX)]


@pytest.mark.parametrize("ref", TOPICS, ids=lambda r: r.name)
def test_each_reference_is_one_focused_topic(ref: Reference) -> None:
    lines = ref.path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == f"# {ref.title}"
    assert 50 <= len(lines) <= 170, f"{ref.name} has {len(lines)} lines: split or trim it"


def test_package_data_ships_every_skill_file() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["perfgate"]
    package_root = SKILL_DIR.parent
    for path in skill_files().values():
        rel = path.relative_to(package_root)
        assert any(rel.match(g) for g in globs), f"{rel} is not covered by package-data {globs}"


def _section(text: str, heading: str) -> str:
    """The section under ``heading``, its lines joined into one (a phrase may wrap)."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return " ".join(text[start : end if end != -1 else len(text)].split())


FIRST_READ_LINES = 47
"""The front matter, the introduction, the working rules and "When to use it": what an agent reads before
the loop. A rule the agent needs later goes where it is needed, not here."""


def test_the_seed_rules_sit_where_the_agent_needs_them_and_the_first_read_does_not_grow() -> None:
    skill = (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8")
    first, _, _ = skill.partition("\n## The loop")
    assert len(first.splitlines()) <= FIRST_READ_LINES
    loop = _section(skill, "## The loop")
    edit_step = loop[loop.index("6. **One change.**") : loop.index("7. **Correctness.**")]
    assert "repository's own instructions" in edit_step  # read before the first edit
    specialists = _section(skill, "## Other skills and tools")
    assert "known skill roots" in specialists and "`.claude/skills/`" in specialists  # discovery
    assert "fixed thresholds" in specialists and "MoE recipes" in specialists and "inference" in specialists
    reporting = _section(skill, "## Reporting")
    assert "Stop when" in reporting and "`within_noise`" in reporting  # stop criteria
    assert "Before reporting a blocker, finish the authorised work that does not depend on it" in reporting
    casebook = " ".join((SKILL_DIR / "references" / "casebook.md").read_text(encoding="utf-8").split())
    assert "documentation of the version `collect_env` reported" in casebook  # docs of the installed version
