"""A refused keep's next line offers each choice once: no phrase of it repeats (every refusal the
record_decision tests can trigger, through the protocol)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from test_record_decision import CHEATS, Evidence, _drop, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio


def repeated_phrases(line: str, words: int = 2) -> list[str]:
    """Runs of ``words`` words that occur more than once in ``line`` (quotes, punctuation and figures ignored)."""
    tokens = re.findall(r"[a-z][a-z_]*", line.lower())  # words; figures (1e-05 twice) are no phrase
    runs = Counter(" ".join(tokens[i : i + words]) for i in range(len(tokens) - words + 1))
    return sorted(run for run, n in runs.items() if n > 1)


def test_the_phrase_check_finds_the_repetition_the_issue_quotes() -> None:
    quoted = "next: more launches; or decide 'revert'/'inconclusive', or decide 'revert', 'inconclusive' or 'blocked'"
    assert "decide revert" in repeated_phrases(quoted)


def _next_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("next:")]
    return line


COMPARISONS = {
    "verdict within_noise": {"verdict": "within_noise", "state": "executed"},
    "verdict insufficient_launches": {"verdict": "insufficient_launches", "state": "executed"},
    "verdict regressed": {"verdict": "regressed", "state": "passed"},
}


@pytest.mark.parametrize("case", sorted(CHEATS) + sorted(COMPARISONS))
async def test_no_refusals_next_line_repeats_a_phrase(server: Any, workspace: Path, case: str) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        if case in COMPARISONS:
            comparison = ev.comparison(ids["base"], ids["cand"], **COMPARISONS[case])
            links = [*_drop(links, "comparison"), {"id": comparison, "role": "comparison"}]
        else:
            links = CHEATS[case][1](ev, links, ids)
        result = await _keep(client, exp, links)
    assert result.is_error
    line = _next_line(_text(result))
    assert repeated_phrases(line) == [], line
    assert "decide" in line or "revert" in line  # the way out is still offered


def _lead(text: str) -> str:
    """The lines before the answer's JSON."""
    return text.split("\nresult", 1)[0]


async def test_the_lead_lines_give_the_ids_and_paths_the_next_call_takes(
    server: Any, workspace: Path
) -> None:
    async with Client(server) as client:
        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "more loader workers hide data waits",
                "classification": "system_optimization",
                "changed_variable": "num_workers",
            },
        )
    assert opened.structured_content is not None
    lead = _lead(_text(opened))
    assert f"experiment_id={opened.structured_content['experiment_id']}" in lead
    assert "decisions_md=.perfgate/decisions.md" in lead
    assert opened.structured_content["evidence_id"] in lead.splitlines()[0]


def test_an_artifact_name_is_not_offered_for_the_next_call() -> None:
    from pydantic import BaseModel

    from perfgate.serving.answer import answer_text

    class Out(BaseModel):
        evidence_id: str = "ev-1"
        state: str = "executed"
        experiment_id: str = "exp-2"
        step_series_artifact: str = "step_series.json"

    lead = _lead(answer_text("t", Out()))
    assert "experiment_id=exp-2" in lead and "step_series" not in lead
