"""Findings name the code: the nn.Module, the source line, the loop, the backward passes per step.

The traces are tiny CPU training jobs recorded by the suite's own script (tests/fixtures/code_jobs.py,
torch.profiler with with_stack=True and the harness's module ranges), committed under
tests/fixtures/traces/code/ (recording on every run costs tens of seconds on a busy 2-core machine
and makes shares depend on the machine's load). The lines each finding must name are read from the
``# site:`` comments of that script.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfgate.traces import Finding, analyze_traces
from perfgate.traces.analyses import code
from perfgate.traces.analyses.code import MISSING_STACKS, find_loops, module_names, nearest, user_frame

FIXTURES = Path(__file__).parent / "fixtures"
JOBS = FIXTURES / "code_jobs.py"
CODE = FIXTURES / "traces" / "code"
PLANTED = FIXTURES / "traces" / "planted"


def site_line(name: str) -> int:
    """The line of ``code_jobs.py`` marked ``# site: name``."""
    for number, line in enumerate(JOBS.read_text().splitlines(), 1):
        if re.search(rf"# site: {name}\b", line):
            return number
    raise AssertionError(f"no '# site: {name}' in {JOBS}")


def findings(job: str) -> list[Finding]:
    return analyze_traces([CODE / f"{job}.json.gz"]).findings


def named(found: list[Finding], wall: str) -> Finding:
    """The finding of ``wall`` among the first three (the decision lines an agent reads)."""
    top = [f for f in found[:3] if f.wall == wall]
    assert top, [(f.wall, f.summary) for f in found]
    return top[0]


def test_a_per_sample_loop_is_named_by_its_module_line_and_iterations() -> None:
    f = named(findings("per_sample"), "host_overhead")
    line = site_line("per_sample")
    assert f.summary.startswith(
        f"rank 0: GatedMix.forward (code_jobs.py:{line}): a Python loop of 64 iterations"
    )
    owner = f.code[0]
    assert (owner.module, owner.module_path, owner.location) == (
        "GatedMix",
        "Net.mix",
        f"code_jobs.py:{line} forward",
    )
    assert f.figures["loop_iterations_per_step"] == 64
    assert "batched tensor ops" in f.candidate
    # the owner carries the loop's time, not zeros: the loop is most of the finding's time at stake
    assert owner.us_per_step > 0 and 0.3 < owner.share <= 1.0, (owner.us_per_step, owner.share)


def test_a_micro_batch_accumulation_loop_counts_its_backward_passes_and_names_the_line() -> None:
    found = findings("accumulate")
    f = named(found, "small_micro_batch")
    line = site_line("accumulate")
    assert f.figures["backward_passes_per_step"] == 32
    assert f.summary.startswith(
        f"rank 0: accumulate (code_jobs.py:{line}): 32 backward() passes per optimizer step"
    )
    assert "same global batch" in f.guard and "reduction order" in f.guard
    # The module each micro-batch runs is named too, and the loop of 32 iterations is the host overhead.
    assert any(c.module == "Net" for c in f.code)
    loop = named(found, "host_overhead")
    assert f"code_jobs.py:{line}" in loop.summary and "32 iterations" in loop.summary


def test_an_eval_pass_names_the_model_and_the_line_that_runs_it() -> None:
    f = named(findings("eval_pass"), "evaluation_in_step")
    site = f.code[0]
    assert (site.module, site.module_path) == ("Net", "Net")
    assert site.location == f"code_jobs.py:{site_line('eval_model')} forward"
    assert site.call_site == f"code_jobs.py:{site_line('eval_call')} evaluate"
    assert site.region == "validation"  # the user's record_function range around the pass
    assert f.summary.startswith(f"rank 0: Net.forward (code_jobs.py:{site_line('eval_model')}), called from")


def test_a_data_loader_wait_names_the_dataset_code_it_runs() -> None:
    found = findings("slow_loader")
    f = named(found, "input_pipeline")
    # The Dataset's own ops run without grad inside the fetch: data loading, not an evaluation pass.
    assert all(g.wall != "evaluation_in_step" for g in found)
    line = site_line("slow_loader")
    assert f.code[0].location == f"code_jobs.py:{line} __getitem__"
    assert f.code[0].share > 0.9 and f"__getitem__ (code_jobs.py:{line})" in f.summary


def test_a_trace_without_stacks_finds_the_loop_and_says_which_option_names_the_code() -> None:
    report = analyze_traces([PLANTED / "tiny_ops_rank0.json.gz"])
    view = report.ranks[0].code
    assert view is not None and not view.stacks and view.missing == MISSING_STACKS
    f = named(report.findings, "host_overhead")
    assert "a Python loop of 64 iterations of 4 ops" in f.summary and "with_stack=true" in f.summary
    assert f.code == []


def test_nearest_finds_the_innermost_marked_ancestor_at_any_depth() -> None:
    # A chain 0 <- 1 <- ... <- 99 with marks at 10 and 60, and a second root.
    parent = np.array([-1, *range(99), -1], np.int64)
    target = np.zeros(101, bool)
    target[[10, 60]] = True
    got = nearest(parent, target)
    expected = [-1] * 11 + [10] * 50 + [60] * 39 + [-1]
    assert got.tolist() == expected


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        # A loop over 6 layers of 3 ops between a prologue and an epilogue.
        ([9, 8] + [1, 2, 3] * 6 + [7], [(2, 3, 6)]),
        # A per-element loop of one op, then a loop of two: each found with its own body.
        ([5] * 10 + [1, 2] * 5, [(0, 1, 10), (10, 2, 5)]),
        # Three repetitions are not a loop; an irregular sequence has none.
        ([1, 2, 1, 2, 1, 2], []),
        ([1, 2, 3, 1, 3, 2, 2, 1, 3, 3], []),
        # A body whose halves are alike is not cut in two: the body is the full period.
        ([1, 1, 2] * 5, [(0, 3, 5)]),
    ],
)
def test_find_loops_finds_each_run_of_a_repeated_body(
    sequence: list[int], expected: list[tuple[int, int, int]]
) -> None:
    assert find_loops(np.array(sequence, np.int32)) == expected


def _loops_one_body_at_a_time(
    names: np.ndarray, min_iterations: int, max_body: int
) -> list[tuple[int, int, int]]:
    """find_loops as it was written first: each body's repeats counted by its own pass (the reference)."""
    covered = np.zeros(names.size, bool)
    out: list[tuple[int, int, int]] = []
    for body in range(1, min(max_body, names.size // min_iterations) + 1):
        same = names[body:] == names[:-body]
        if np.count_nonzero(same) < body * (min_iterations - 1):
            continue
        edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
        starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        for s, e in zip(starts.tolist(), stops.tolist(), strict=True):
            if e - s < body * (min_iterations - 1):
                continue
            iterations = (e - s + body) // body
            span = covered[s : s + iterations * body]
            if np.count_nonzero(span) * 2 > span.size:
                continue
            span[:] = True
            out.append((s, body, iterations))
    return out


@given(
    pieces=st.lists(
        st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=9), st.integers(1, 7)), max_size=8
    ),
    max_body=st.integers(1, 12),
    rows=st.sampled_from([3, 8192]),
)
def test_find_loops_counts_every_body_at_once_as_one_at_a_time(
    pieces: list[tuple[list[int], int]], max_body: int, rows: int
) -> None:
    # Sequences of repeated bodies (some long enough to be loops), blocks of positions as small as 3.
    names = np.array([v for body, times in pieces for _ in range(times) for v in body], np.int32)
    saved = code._REPEAT_ROWS  # pyright: ignore[reportPrivateUsage]
    code._REPEAT_ROWS = rows  # pyright: ignore[reportPrivateUsage]
    try:
        found = find_loops(names, max_body=max_body)
    finally:
        code._REPEAT_ROWS = saved  # pyright: ignore[reportPrivateUsage]
    assert found == _loops_one_body_at_a_time(names, 4, max_body)


def test_frames_and_modules_are_read_from_their_event_names() -> None:
    assert user_frame("model.py(41): forward") == ("model.py", "41", "forward")
    assert user_frame("/jobs/run/train.py(7): <module>") == ("/jobs/run/train.py", "7", "<module>")
    for library in (
        "torch/nn/modules/module.py(1782): _call_impl",
        "typing.py(2268): cast",
        "perfgate/harness/hooks.py(134): timed_backward",
        "<built-in method tanh of Tensor object at 0x7f>",
        "/usr/lib/python3.11/json/decoder.py(337): decode",
        "/work/.perfgate/state/harness/b6ac98a0/perfgate/harness/hooks.py(151): timed_backward",
        "/opt/conda/pkgs/torch/nn/modules/module.py(1782): _call_impl",
    ):
        assert user_frame(library) is None, library
    assert module_names("nn.Module: GatedMix_0") == ("GatedMix", None)
    assert module_names("nn.Module: Net.blocks.3 (Block)") == ("Block", "Net.blocks.3")
    assert module_names("aten::mm") is None


def test_module_ranges_name_modules_by_their_place_in_the_model_and_close_when_forward_raises() -> None:
    torch = pytest.importorskip("torch")
    from perfgate.harness.module_ranges import ModuleRanges

    class Boom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU(), Boom()))
    ranges = ModuleRanges()
    opened: list[str] = []
    original = torch.ops.profiler._record_function_enter_new

    def spy(name: str, args: object = None) -> object:
        opened.append(name)
        return original(name, args)

    ranges.install()
    try:
        torch.ops.profiler._record_function_enter_new = spy  # pyright: ignore[reportAttributeAccessIssue]
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.randn(2, 4))
    finally:
        torch.ops.profiler._record_function_enter_new = original  # pyright: ignore[reportAttributeAccessIssue]
        ranges.remove()
    assert opened == [
        "nn.Module: Sequential (Sequential)",
        "nn.Module: Sequential.0 (Linear)",
        "nn.Module: Sequential.1 (Sequential)",
        "nn.Module: Sequential.1.0 (ReLU)",
        "nn.Module: Sequential.1.1 (Boom)",
    ]
    # Every range closed although forward raised, and no hook is left behind.
    assert ranges._local.stack == []  # pyright: ignore[reportPrivateUsage]
    model[0](torch.randn(2, 4))
    assert len(opened) == 5


def test_one_backward_per_step_is_no_micro_batch_finding() -> None:
    # The per-sample job runs one backward() per step: its many tiny ops are host overhead, not a loop of
    # micro-batches.
    report = analyze_traces([CODE / "per_sample.json.gz"])
    view = report.ranks[0].code
    assert view is not None and view.backward_passes_per_step == 1
    assert all(f.wall != "small_micro_batch" for f in report.findings)


def test_autograd_node_ops_written_beside_their_range_do_not_split_a_backward_pass(hta_traces: Path) -> None:
    # This A100 trace writes node ops (AddBackward0) next to, not inside, their evaluate_function range:
    # one backward() per step all the same.
    view = analyze_traces([hta_traces / "trace_diff_control_control.json.gz"]).ranks[0].code
    assert view is not None and view.backward_passes_per_step == 1
