"""Agent-supplied regular expressions run in linear time, and the log pattern is part of what is approved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.logparse import compile_pattern, parse_step_log
from perfgate.benchmarking.reading.userregex import (
    MAX_PATTERN_CHARS,
    UserRegexError,
    compile_user_regex,
)
from perfgate.evidence import Ledger
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools.run_benchmark_window import command
from perfgate.tools.run_benchmark_window_models import RunBenchmarkWindowInput

PATTERN = r"step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)"


def test_nested_quantifiers_match_in_linear_time() -> None:
    # Python's re needs ~2**n steps here (years at n=200); a regression hangs this test into its timeout.
    evil = compile_user_regex(r"(a+)+$", field="log_pattern")
    assert evil.search("a" * 200 + "!") is None
    nested = compile_pattern(r"step (?P<step>(\d+)+)+ (x+x+)+y step_time_ms (?P<step_time_ms>[0-9.]+)")
    lines = ["step " + "1" * 5000 + " " + "x" * 5000 + " z", "step 3 xxy step_time_ms 12.5"]
    assert parse_step_log(lines, nested) == [(3, 12.5)]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (r"(?P<step>\d+) (?P<step_time_ms>\1)", "Backreferences"),
        (r"(?=step)(?P<step>\d+)(?P<step_time_ms>\d+)", "Lookaround is not supported"),
        (r"(?P<step>\d+", "missing )"),
        (r"(?P<step>\d+)", "lacks the named group(s) ['step_time_ms']"),
    ],
)
def test_unusable_patterns_are_refused_with_the_reason(pattern: str, expected: str) -> None:
    with pytest.raises(BenchmarkError) as info:
        compile_pattern(pattern)
    assert str(info.value).startswith("log_pattern ")
    assert expected in str(info.value)


def test_an_overlong_pattern_is_refused_before_compiling() -> None:
    with pytest.raises(
        UserRegexError, match=r"the limit is 2000 \(benchmarking.reading.userregex.MAX_PATTERN_CHARS\)"
    ):
        compile_user_regex("a" * (MAX_PATTERN_CHARS + 1), field="log_pattern")


def test_lines_with_huge_or_non_finite_numbers_are_skipped() -> None:
    lines = [
        "step " + "9" * 5000 + " step_time_ms 1.0",
        "step 1 step_time_ms nan",
        "step 2 step_time_ms inf",
        "step 3 step_time_ms 1" + "0" * 400,
        "step 4 step_time_ms 7.5",
    ]
    assert parse_step_log(
        lines, compile_pattern(r"step (?P<step>\d+) step_time_ms (?P<step_time_ms>\S+)")
    ) == [(4, 7.5)]


def test_the_log_pattern_is_bound_to_the_approval_digest(tmp_path: Path) -> None:
    rt = ToolRuntime(
        config=ServerConfig.create(tmp_path), ledger=Ledger(tmp_path), tool="run_benchmark_window"
    )

    def request(pattern: str) -> str:
        inp = RunBenchmarkWindowInput.model_validate(
            {"command": ["python", "train.py"], "timing": "log", "log_pattern": pattern, "repeats": 1}
        )
        req = command(inp, rt)
        assert json.dumps(pattern) in req.describe()  # the human sees it
        return req.digest

    assert request(PATTERN) != request(PATTERN.replace("step_time_ms ", "ms "))
