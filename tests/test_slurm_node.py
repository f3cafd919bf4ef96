"""The single-node Slurm that scripts/slurm-single-node.sh starts: two tasks get Slurm's rank variables."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_two_tasks_run_with_slurm_rank_variables(slurm_partition: str) -> None:
    out = subprocess.run(
        [
            "srun",
            f"--partition={slurm_partition}",
            "--ntasks=2",
            "--time=1",
            "--quiet",
            "--",
            "sh",
            "-c",
            "echo $SLURM_PROCID/$SLURM_NTASKS/$SLURM_LOCALID",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert sorted(out.stdout.split()) == ["0/2/0", "1/2/1"]


def test_the_start_script_is_idempotent(slurm_partition: str) -> None:
    """A second start on a running node changes nothing and succeeds (CI may run it twice)."""
    import os

    if os.geteuid() != 0:
        import pytest

        pytest.skip("the start script needs root")
    done = subprocess.run(
        [str(REPO / "scripts" / "slurm-single-node.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "already up" in done.stderr
