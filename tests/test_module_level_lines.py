"""Lines right at module level (issue 59): a loop with no function around it is named by its own lines.

tests/fixtures/module_loop.py all-reduces its gradients in a loop of the module-level training loop. The
loop's frame is named by the line the profiler started at (``opt.step()``, where the harness starts it):
the loop must be reported at the lines that run its ops, not there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.traces import RankProfile, analyze_traces
from perfgate.traces.models import OpLoop

pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "fixtures" / "module_loop.py"


def site_line(name: str) -> int:
    for number, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if re.search(rf"# site: {name}\b", line):
            return number
    raise AssertionError(f"no '# site: {name}' in {SCRIPT}")


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> RankProfile:
    work = tmp_path_factory.mktemp("module_loop")
    # fmt: off
    command = [
        sys.executable, "-m", "perfgate.harness", "--record-dir", str(work / "records"),
        "--warmup-steps", "1", "--measure-steps", "3", "--profile-dir", str(work / "profile"),
        "--profile-warmup", "1", "--profile-active", "2", "--profile-with-stack", "--profile-with-modules",
        "--", str(SCRIPT), "8",
    ]
    # fmt: on
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=600, check=False)
    path = work / "profile" / "rank0.pt.trace.json"
    assert path.is_file(), done.stderr[-3000:]
    return analyze_traces([path.resolve()]).ranks[0]


def _loop_of(profile: RankProfile, op: str) -> OpLoop:
    assert profile.code is not None and profile.code.stacks
    loops = [lp for lp in profile.code.loops if op in lp.ops]
    assert loops, profile.code.loops
    return loops[0]


def test_a_module_level_loop_is_reported_at_its_own_lines(profile: RankProfile) -> None:
    loop = _loop_of(profile, "c10d::allreduce_")
    assert loop.owner is not None
    own = f"module_loop.py:{site_line('all_reduce')}-{site_line('divide')} <module>"
    assert loop.owner.location == own, loop.owner
    assert loop.owner.label == f"<module> (module_loop.py:{site_line('all_reduce')}-{site_line('divide')})"
    # Not the line the loop's frame is named by (where the profiler started: the optimizer step).
    assert f":{site_line('step')} " not in (loop.owner.location or "")


def test_a_loop_inside_one_line_of_the_module_is_named_by_that_line(profile: RankProfile) -> None:
    """The model's layers run one after the other inside the forward line: that line, not a span."""
    loop = _loop_of(profile, "aten::linear")
    assert loop.owner is not None and loop.owner.location == f"module_loop.py:{site_line('forward')} <module>"
