"""Shared fixtures: a temporary workspace, a server on it, and the shared real traces when present."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

REPO = Path(__file__).resolve().parents[1]

# A trust root for the whole session too, before any fixture runs (module-scoped fixtures run before the
# per-test `trust_root` below): no test may touch the real user's ~/.local/state or ~/.config.
_SESSION_TRUST = Path(tempfile.mkdtemp(prefix="perfgate-test-trust-"))
os.environ["PERFGATE_STATE_DIR"] = str(_SESSION_TRUST / "state")
os.environ["PERFGATE_CONFIG_DIR"] = str(_SESSION_TRUST / "config")
os.environ.pop("PERFGATE_POLICY", None)
atexit.register(shutil.rmtree, _SESSION_TRUST, True)

# Property tests: the same inputs every run (a failure reproduces; a run does not pass or fail by the
# draw), and no verdicts from the clock: a per-example deadline and the too-slow health check fire on a
# loaded machine, not on a bug. A test's own @settings still wins for what it sets (test_fuzz.py).
settings.register_profile(
    "perfgate", derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("perfgate")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    """Both protocol generations: 2026-07-28 (per-request) and 2025-11-25 (initialize handshake)."""
    return str(request.param)


@pytest.fixture(autouse=True)
def fresh_parse_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with an empty cache of parsed traces (`perfgate.traces.reading.parsecache`): a trace one
    test read is read again by the next."""
    from perfgate.traces.reading import parsecache

    monkeypatch.setattr(parsecache, "_cache", None)


@pytest.fixture(autouse=True)
def trust_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> TrustRoot:
    """Every test gets its own trust root (keys, approvals, anchors, operator policy) in a temp dir.

    Set through the environment, so subprocesses (`perfgate` on the command line, servers over stdio)
    see it too; nothing is ever written to the real user's ~/.local/state or ~/.config.
    """
    base = tmp_path_factory.mktemp("trust")
    monkeypatch.setenv("PERFGATE_STATE_DIR", str(base / "state"))
    monkeypatch.setenv("PERFGATE_CONFIG_DIR", str(base / "config"))
    monkeypatch.delenv("PERFGATE_POLICY", raising=False)
    return TrustRoot.locate()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def server(workspace: Path):
    return build_server(ServerConfig.create(workspace))


def shared_dir() -> Path | None:
    """The read-only shared folder beside the repo (or $PERFGATE_SHARED_DIR), if present."""
    candidate = Path(os.environ.get("PERFGATE_SHARED_DIR", REPO.parent / "shared"))
    return candidate if candidate.is_dir() else None


@pytest.fixture
def hta_traces() -> Path:
    """The shared real Kineto traces; the test is skipped when they are absent."""
    base = shared_dir()
    traces = base / "data" / "traces" / "hta" if base else None
    if traces is None or not traces.is_dir():
        pytest.skip("shared traces (../shared/data/traces/hta) are not present")
    return traces


@pytest.fixture(scope="session")
def slurm_partition() -> str:
    """The partition of a running Slurm with an idle node on this machine (``.ci/run`` starts a
    single-node one with scripts/slurm-single-node.sh); the test is skipped, saying why, without one."""
    import subprocess

    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm munge; scripts/slurm-single-node.sh)")
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"sinfo could not reach slurmctld ({exc}); start it with scripts/slurm-single-node.sh")
    if out.returncode != 0:
        why = out.stderr.strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"sinfo failed ({why[0]}); start Slurm with scripts/slurm-single-node.sh (as root)")
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in ("idle", "mix"):
            return parts[0].rstrip("*")
    pytest.skip(
        f"Slurm has no idle node (sinfo: {out.stdout.strip() or 'nothing'}); see scripts/slurm-single-node.sh"
    )
