"""Which rank this process is, as the launcher told it through the environment."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankInfo", "rank_from_env"]

# Launchers disagree on names; the first variable present wins. torchrun and most wrappers set
# RANK/LOCAL_RANK/WORLD_SIZE; Open MPI and PMI-based launchers (mpirun, srun --mpi) set their own.
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@dataclass(frozen=True)
class RankInfo:
    """Position of this process in a (possibly single-process) job."""

    rank: int
    local_rank: int
    world_size: int
    hostname: str
    pid: int


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


def rank_from_env(env: Mapping[str, str] | None = None) -> RankInfo:
    """Read rank, local rank and world size from launcher variables (defaults: 0, 0, 1)."""
    source = os.environ if env is None else env
    rank = _first_int(source, _RANK_VARS, 0)
    return RankInfo(
        rank=rank,
        local_rank=_first_int(source, _LOCAL_RANK_VARS, rank),
        world_size=max(1, _first_int(source, _WORLD_VARS, 1)),
        hostname=socket.gethostname(),
        pid=os.getpid(),
    )
