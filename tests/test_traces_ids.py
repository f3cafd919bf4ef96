"""Integer ids of a trace (correlation, stream, device) are read exactly by every reader path.

float64 holds integers exactly only up to 2**53: ids that differ below its resolution must still pair
each kernel with its own launch, and an id no int64 holds is reported, never read as a wrong value.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces import AnalysisOptions, analyze_trace, pool
from perfgate.traces.analyze import analyze_table
from perfgate.traces.models import RankProfile

SMALL = AnalysisOptions(chunk_bytes=1 << 10, read_block_bytes=1 << 10)
"""Batches of a few events: the parts of a split read meet many times inside the trace."""

BEYOND = 2**64 - 1
"""A uint64 id (all ones): no int64 holds it."""
# (correlation id, launching API, the kernel's stream, its device). The first two ids are one float64
# (2**53), so are the next two (2**62); 2**63 - 1 rounds to 2**63, beyond int64, through a float. The
# last two kernels' streams collide in a key of device * 1_000_003 + stream.
PAIRS: list[tuple[int, str, int, int]] = [
    (2**53, "cudaLaunchKernel", 2**53, 0),
    (2**53 + 1, "cuLaunchKernel", 2**53 + 1, 0),
    (2**62 + 1, "cudaLaunchKernelExC", 7, 0),
    (2**62 + 2, "cuLaunchKernelEx", 7, 0),
    (2**63 - 1, "cudaGraphLaunch", 7, 0),
    (5, "cudaLaunchCooperativeKernel", 0, 1),
    (6, "hipLaunchKernel", 1_000_003, 0),
]


def _trace(path: Path, rank: int = 0) -> Path:
    """The launches and kernels of `PAIRS` (and one more of id `BEYOND`), spread among CPU ops: the split
    reads of the tests meet before, between and after them."""
    pairs: list[list[dict[str, Any]]] = []
    for i, (corr, api, stream, device) in enumerate([*PAIRS, (BEYOND, "cudaLaunchKernel", 7, 0)]):
        at = 1000.0 * i
        launch = {"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1, "ts": at, "dur": 3.5,
                  "args": {"correlation": corr}}  # fmt: skip
        kernel = {"ph": "X", "cat": "kernel", "name": f"sgemm_{i}", "pid": 0, "tid": 7, "ts": at + 10 + i,
                  "dur": 20.25, "args": {"correlation": corr, "stream": stream, "device": device}}  # fmt: skip
        pairs.append([launch, kernel])
    events: list[dict[str, Any]] = []
    rng = random.Random(5)
    for i in range(400):
        if i % 50 == 25 and pairs:
            events.extend(pairs.pop(0))
        at = rng.uniform(0, 8000)
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op_{i % 13}", "pid": 1, "tid": 1,
                       "ts": at, "dur": 0.5, "args": {"External id": 2**53 + i}})  # fmt: skip
    assert not pairs
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": rank}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def _paired_exactly(profile: RankProfile) -> None:
    launch = profile.launch
    # Each kernel is paired with its own launch: each API once, the delays are 10..16 us, not 1000s.
    assert launch.launches == len(PAIRS)
    assert launch.api_counts == {api: 1 for _, api, _, _ in PAIRS}
    assert launch.launch_delay_us is not None
    delay = launch.launch_delay_us
    assert (delay.count, delay.mean_us, delay.max_us) == (len(PAIRS), 13, 16)
    assert launch.unmatched_device_events == 1  # the kernel of id BEYOND
    # (0, 2**53), (0, 2**53 + 1), (0, 7), (1, 0), (0, 1_000_003): five streams, none merged.
    assert profile.streams == 5
    unheld = [w for w in profile.warnings if w.startswith("args.correlation")]
    assert unheld == [
        f"args.correlation of 2 events is beyond the 64-bit integer range (e.g. {BEYOND}): it cannot be "
        "held exactly and is read as absent, so their kernels and runtime calls are not paired with each "
        "other (launch statistics omit them)"
    ]
    assert profile.warnings[0] == unheld[0]  # first: it changes what the rest means


def test_ids_below_float64_resolution_pair_kernels_with_their_own_launches(tmp_path: Path) -> None:
    path = _trace(tmp_path / "ids.json")
    _paired_exactly(analyze_trace(path))
    _paired_exactly(analyze_trace(path, SMALL))


def test_every_split_read_pairs_the_same_ids(tmp_path: Path) -> None:
    # Two parts meeting at `at`, and three (this process again from `then`): the ids lie in every part.
    path = _trace(tmp_path / "ids.json")
    one = analyze_trace(path, SMALL).model_dump()
    for at, then in [(0.3, None), (0.15, 0.55), (0.5, 0.8), (0.05, 0.97)]:
        read = pool.load_split(path, SMALL, at=at, then=then)
        assert read is not None, (at, then)
        table, stream, used = read
        assert used and (then is None or stream.resume_meet is not None)
        assert table.unheld_ints == {"correlation": (2, str(BEYOND))}
        profile = analyze_table(table, stream.header, stream, path, SMALL)
        _paired_exactly(profile)
        assert profile.model_dump() == one


def test_a_rank_set_read_in_parallel_pairs_the_same_ids(tmp_path: Path) -> None:
    paths = [_trace(tmp_path / f"rank{r}.json", rank=r) for r in range(2)]
    profiles = pool.analyze_many(paths, SMALL, workers=2)  # one in this process, one in a worker
    assert [p.rank for p in profiles] == [0, 1]
    for profile in profiles:
        _paired_exactly(profile)


@pytest.mark.anyio
async def test_the_answer_leads_with_the_id_no_int64_holds(workspace: Path) -> None:
    _trace(workspace / "rank0.json")
    async with Client(build_server(ServerConfig.create(workspace, read_only=True))) as client:
        result = await client.call_tool("analyze_trace", {"trace_paths": ["rank0.json"]})
    assert not result.is_error, result.content
    out: Any = result.structured_content
    assert out["ranks"][0]["launch"]["api_counts"] == {api: 1 for _, api, _, _ in PAIRS}
    assert out["warnings"][0].startswith("rank 0: args.correlation of 2 events is beyond the 64-bit")
    lead = result.content[0].text.split("\nresult")[0]  # type: ignore[union-attr]
    assert (
        f"warnings (1): rank 0: args.correlation of 2 events is beyond the 64-bit integer range (e.g. {BEYOND})"
        in lead
    )


def test_ids_held_only_as_strings_or_beyond_int64_are_reported_by_field(tmp_path: Path) -> None:
    # An unknown category is routed by its args: an id beyond int64 reads as absent there too.
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 0, "dur": 2,
         "args": {"correlation": "9007199254740993"}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 2,
         "args": {"correlation": 9007199254740993, "stream": "18446744073709551616", "device": -(2**63) - 1}},
        {"ph": "X", "cat": "vendor_thing", "name": "v", "pid": 0, "tid": 7, "ts": 9, "dur": 1,
         "args": {"correlation": 3, "stream": 2**70}},
        {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": 7, "ts": 11, "dur": 1,
         "args": {"correlation": 4, "stream": 1e30}},
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    profile = analyze_trace(path)
    assert profile.launch.launches == 1 and profile.launch.unmatched_device_events == 0
    warned = {w.split(" of ")[0]: w for w in profile.warnings if w.startswith("args.")}
    assert set(warned) == {"args.stream", "args.device"}
    assert "args.stream of 3 events" in warned["args.stream"] and "(e.g. 1e+30)" in warned["args.stream"]
    assert (
        "args.device of 1 event is" in warned["args.device"]
        and "their device is unknown" in warned["args.device"]
    )


_INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(st.tuples(_INT64, _INT64), max_size=30), st.booleans())
def test_stream_keys_are_equal_exactly_when_the_pairs_are_and_ordered_as_them(
    pairs: list[tuple[int, int]], narrow: bool
) -> None:
    from perfgate.traces.reading._group import pair_keys

    if narrow:  # ids of a real trace: the keys are numbers over the ids' ranges
        pairs = [(a % 5 - 1, b % 70) for a, b in pairs]
    major = np.array([a for a, _ in pairs], np.int64)
    minor = np.array([b for _, b in pairs], np.int64)
    keys = pair_keys(major, minor).tolist()
    assert len(keys) == len(pairs)
    for i in range(len(pairs)):
        for j in range(len(pairs)):
            assert (keys[i] < keys[j]) == (pairs[i] < pairs[j])


@pytest.mark.parametrize("values", [[2**53, 2**53 + 1, None], [2**63 - 1, 1.5], [7, 2**53 + 1]])
def test_an_int_column_holds_ids_beyond_float64_exactly(values: list[Any]) -> None:
    from perfgate.traces.reading.table import _ints  # pyright: ignore[reportPrivateUsage]

    expected = [-1 if v is None else int(v) for v in values]
    assert _ints(values).tolist() == expected
