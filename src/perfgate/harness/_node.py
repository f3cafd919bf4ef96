"""What a rank can see of its node: host, Slurm placement, devices, interconnect (read once, outside windows)."""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["node_facts", "slurm_rank_env"]

_DEVICE_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
)
_NCCL_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NET", "GLOO_SOCKET_IFNAME")


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def node_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """Host name, Slurm job/step/node of this rank, device visibility, RDMA devices and NICs.

    ``interconnect`` lists RDMA devices (/sys/class/infiniband: InfiniBand, RoCE, EFA); ``network``
    the non-loopback interfaces. Both are what this process can see, not what the job uses.
    """
    src = dict(os.environ) if env is None else env
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return {
        "hostname": socket.gethostname(),
        "slurm_job_id": src.get("SLURM_JOB_ID"),
        "slurm_step_id": src.get("SLURM_STEP_ID"),
        "slurm_node": src.get("SLURMD_NODENAME"),
        "slurm_node_index": src.get("SLURM_NODEID"),
        "cpus": cpus,
        "visible_devices": {k: src[k] for k in _DEVICE_VARS if k in src},
        "interconnect": _listdir("/sys/class/infiniband"),
        "network": [n for n in _listdir("/sys/class/net") if n != "lo"],
        "comm_env": {k: src[k] for k in _NCCL_VARS if k in src},
    }


def _tasks_on_first_node(value: str) -> int | None:
    """``SLURM_STEP_TASKS_PER_NODE`` is like ``2(x3),1``; the count on this rank's node when uniform."""
    head = value.split(",")[0].split("(")[0]
    return int(head) if head.isdigit() else None


def slurm_rank_env(env: dict[str, str]) -> dict[str, str]:
    """torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) from a Slurm job step's, for a process srun started directly (one task per rank).

    Empty when this is no Slurm step or a launcher already set RANK (torchrun under srun: torchrun
    numbers its workers itself). MASTER_ADDR/MASTER_PORT are only filled where absent: perfgate's
    Slurm launcher sets them to the first node of the allocation; a single-node step falls back to
    127.0.0.1 and a port derived from the job id.
    """
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env or "RANK" in env:
        return {}
    out = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1",
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
    }
    per_node = _tasks_on_first_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    if per_node is not None:
        out["LOCAL_WORLD_SIZE"] = str(per_node)
    if "MASTER_ADDR" not in env and env.get("SLURM_STEP_NUM_NODES", "1") == "1":
        out["MASTER_ADDR"] = "127.0.0.1"
    if "MASTER_PORT" not in env:
        job = env.get("SLURM_JOB_ID", "0")
        out["MASTER_PORT"] = str(20000 + int(job) % 20000 if job.isdigit() else 29500)
    return out
