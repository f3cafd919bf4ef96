"""A trace read once is not read again for the next call on the same bytes, and the answer is exactly the
uncached one: same profile for every option set, a renamed copy analysed under its own name, an edited or
replaced file read again, the limits still refusing, the budget held."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces import AnalysisOptions, TraceTooLargeError, analyze_trace, pool
from perfgate.traces.reading import parsecache
from perfgate.traces.reading.parsecache import CACHE_ENV, ParseCache, Parsed, parse_cache, table_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
TRACES = [
    FIXTURES / "musa_s4000_rank1.json",
    FIXTURES / "rocm_mi300x_rank-3.json",
    *sorted((FIXTURES / "planted").glob("*.json.gz")),
]
OPTION_SETS = [
    AnalysisOptions(),
    AnalysisOptions(time_basis="hta_rounded"),
    AnalysisOptions(include_last_step=True, top_k=3),
]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_a_kept_parse_gives_exactly_the_uncached_answer(trace: Path, tmp_path: Path) -> None:
    path = tmp_path / trace.name
    shutil.copy(trace, path)
    cache = parse_cache()
    for options in OPTION_SETS:
        expected = analyze_trace(path, options).model_dump()
        # The first call reads and keeps the parse, the later ones read the kept table: none changes it.
        for _ in range(3):
            (got,) = pool.analyze_many([path], options)
            assert got.model_dump() == expected
    assert cache.hits == 3 * len(OPTION_SETS) - 1


def test_a_copy_is_the_same_entry_an_edit_is_not(tmp_path: Path) -> None:
    source = FIXTURES / "rocm_mi300x_rank-3.json"
    first, copy = tmp_path / "run_rank-3.json", tmp_path / "other_rank-5.json"
    shutil.copy(source, first)
    shutil.copy(source, copy)
    cache = parse_cache()
    pool.analyze_many([first])
    (renamed,) = pool.analyze_many([copy])
    assert cache.hits == 1
    # What depends on the path is the new path's: the rank in its name, the path itself.
    assert renamed.model_dump() == analyze_trace(copy).model_dump()
    assert renamed.path == str(copy)
    # One byte of whitespace more is another file: read again, and its answer is its own.
    copy.write_bytes(source.read_bytes() + b" ")
    (edited,) = pool.analyze_many([copy])
    assert cache.hits == 1
    assert edited.model_dump() == analyze_trace(copy).model_dump()


def test_the_limits_still_refuse_a_trace_read_under_larger_ones(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json.gz"
    shutil.copy(FIXTURES / "planted" / "slow_rank_rank0.json.gz", path)
    (profile,) = pool.analyze_many([path])
    assert profile.event_counts["events"] > 10
    with pytest.raises(TraceTooLargeError, match="more than 10 events"):
        pool.analyze_many([path], AnalysisOptions(max_events=10))
    assert parse_cache().hits == 0


def test_a_file_that_changes_while_it_is_read_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank0.json.gz"
    shutil.copy(FIXTURES / "planted" / "slow_rank_rank0.json.gz", path)
    stamps = iter(range(100))
    monkeypatch.setattr(pool, "file_stamp", lambda _: (next(stamps), 0, 0, 0))  # a new stamp at each look
    expected = analyze_trace(path).model_dump()
    assert pool.analyze_many([path])[0].model_dump() == expected
    assert pool.analyze_many([path])[0].model_dump() == expected
    assert parse_cache().hits == 0 and parse_cache().held_bytes == 0


def test_the_budget_evicts_the_least_recently_used_and_refuses_what_exceeds_it(tmp_path: Path) -> None:
    paths = [FIXTURES / "planted" / name for name in ("slow_rank_rank0.json.gz", "tiny_ops_rank0.json.gz")]
    parsed: list[Parsed] = []
    for path in paths:
        table, header, stream = pool.load_table(path, AnalysisOptions())
        parsed.append(Parsed(table, header, stream.decoded_bytes, stream.lenient_skipped))
    sizes = [table_bytes(p.table) for p in parsed]
    cache = ParseCache(max(sizes) + min(sizes) // 2)  # room for one of them, not both
    keys = [("a", 1, 1), ("b", 1, 1)]
    assert cache.put(keys[0], parsed[0]) and cache.put(keys[1], parsed[1])
    assert cache.get(keys[0]) is None and cache.get(keys[1]) is parsed[1]
    assert cache.held_bytes == sizes[1]
    assert not ParseCache(min(sizes) - 1).put(keys[0], parsed[sizes.index(min(sizes))])


@pytest.mark.parametrize(("value", "enabled"), [("0", False), ("-3", False), ("nan", True), ("x", True)])
def test_the_budget_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, enabled: bool
) -> None:
    monkeypatch.setenv(CACHE_ENV, value)
    assert parse_cache().enabled is enabled


def test_turned_off_every_call_reads_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "0")
    path = tmp_path / "rank0.json.gz"
    shutil.copy(FIXTURES / "planted" / "slow_rank_rank0.json.gz", path)
    reads: list[Path] = []
    real = pool.analyze_trace

    def spy(p: Path, options: AnalysisOptions) -> Any:
        reads.append(p)
        return real(p, options)

    monkeypatch.setattr(pool, "analyze_trace", spy)
    pool.analyze_many([path])
    pool.analyze_many([path])
    assert reads == [path, path]
    assert parsecache.parse_cache().held_bytes == 0


@pytest.mark.anyio
async def test_a_second_tool_call_on_the_same_trace_answers_the_same(workspace: Path) -> None:
    shutil.copy(FIXTURES / "planted" / "slow_rank_rank1.json.gz", workspace / "rank1.json.gz")
    answers: list[Any] = []
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        for _ in range(2):
            result = await client.call_tool("analyze_trace", {"trace_paths": ["rank1.json.gz"]})
            assert not result.is_error and result.structured_content is not None
            answers.append(result.structured_content)
    assert parse_cache().hits == 1
    assert answers[0]["evidence_id"] != answers[1]["evidence_id"]
    assert answers[0]["ranks"] == answers[1]["ranks"]
    assert answers[0]["findings"] == answers[1]["findings"]
