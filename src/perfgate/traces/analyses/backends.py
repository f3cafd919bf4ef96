"""Which execution backends a trace shows ran: graph replays and the MoE token-exchange backend.

Read from names the table already interned, so the cost is one count over each name column (host calls,
device activity), never another pass over the events:

- graph replays: host runtime/driver calls ``cudaGraphLaunch`` (``cuGraphLaunch``), ``hipGraphLaunch``,
  ``musaGraphLaunch`` (``muGraphLaunch``), with or without CUPTI's ``_v10000``-style version suffix;
- the token exchange, from device kernel names: DeepEP's kernels live in the ``deep_ep::`` namespace
  (``deep_ep::intranode::dispatch<...>``, ``deep_ep::internode_ll::combine<...>``), HybridEP's in
  ``hybrid_ep::``; an all-to-all through the collective library shows as its all-to-all or grouped
  send/receive kernels (``ncclDevKernel_SendRecv``), an all-gather dispatcher as all-gather kernels.

Send/receive kernels also carry pipeline-parallel traffic and all-gather kernels FSDP's, so those two
families say "consistent with", never "only": a gate reads DeepEP or HybridEP by their own namespaces and
an all-to-all dispatcher by the absence of both.
"""

from __future__ import annotations

import re
from typing import Literal

from perfgate.traces.models import Backends, ExchangeKernels
from perfgate.traces.reading._group import I64, unique_counts
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.table import EventTable

__all__ = ["EXCHANGES", "Exchange", "backends_seen", "exchange_of"]

Exchange = Literal["deepep", "hybridep", "alltoall", "allgather"]
EXCHANGES: tuple[Exchange, ...] = ("deepep", "hybridep", "alltoall", "allgather")
"""Token-exchange families, most specific first: the first one a trace shows is its dispatcher."""

_GRAPH_LAUNCH = re.compile(r"^(cuda|cu|hip|musa|mu)GraphLaunch(_v\d+|_ptsz)?$")
_CCL = ("nccl", "rccl", "mccl", "hccl", "xccl")
_ALLTOALL = ("alltoall", "all_to_all", "sendrecv", "send_recv")
_ALLGATHER = ("allgather", "all_gather")
_NAMES_SHOWN = 3
_NAME_CHARS = 160


def exchange_of(name: str) -> Exchange | None:
    """The token-exchange family a device kernel's name belongs to, or None."""
    low = name[:512].lower()
    if "deep_ep::" in low:
        return "deepep"
    if "hybrid_ep::" in low:
        return "hybridep"
    if not any(c in low for c in _CCL):
        return None
    if any(w in low for w in _ALLTOALL):
        return "alltoall"
    if any(w in low for w in _ALLGATHER):
        return "allgather"
    return None


def _short(name: str) -> str:
    """A kernel's name without its parameter list (the namespace and template arguments say enough)."""
    cut = name.find("(")
    return (name[:cut] if cut > 0 else name)[:_NAME_CHARS]


def backends_seen(table: EventTable, host_ids: I64, host_counts: I64) -> Backends:
    """Graph launches and token-exchange kernels in ``table``; ``host_ids``/``host_counts`` are the
    table's host-call name ids and how often each occurs (counted once, shared with the backend check)."""
    names = table.names
    launches = 0
    launch_names: list[str] = []
    for n, c in zip(int_list(host_ids), int_list(host_counts), strict=True):
        if _GRAPH_LAUNCH.match(names[n]):
            launches += c
            launch_names.append(names[n])
    found: dict[Exchange, tuple[int, list[str]]] = {}
    if len(table.device):
        ids, counts = unique_counts(table.device.i("name"))
        for n, c in zip(int_list(ids), int_list(counts), strict=True):
            family = exchange_of(names[n])
            if family is None:
                continue
            total, shown = found.get(family, (0, []))
            if len(shown) < _NAMES_SHOWN:
                shown.append(_short(names[n]))
            found[family] = (total + c, shown)
    exchanges = [
        ExchangeKernels(backend=f, kernels=found[f][0], names=found[f][1]) for f in EXCHANGES if f in found
    ]
    return Backends(
        graph_launches=launches,
        graph_launch_calls=sorted(launch_names),
        token_exchange=exchanges,
        dispatcher=exchanges[0].backend if exchanges else None,
    )
