"""Streaming Kineto trace reader and analyses (used by the ``analyze_trace`` and ``profile_segment`` tools).

Read one trace per rank with bounded memory (several ranks in parallel worker processes, `pool`),
then break device time down the way HTA does (idle, compute, non-compute), with finer kernel
categories, host-side launch and synchronization views, host step phases (`phases`), device idle
causes (`idle`), frequent kernel sequences (`sequences`), per-step times and the comparison across
ranks; `diagnose` turns these into ranked findings and `diff` compares two profiles. Durations are
microseconds throughout.

Typical use::

    from perfgate.traces import AnalysisOptions, analyze_traces, discover_trace_files

    report = analyze_traces(discover_trace_files([Path("traces/")]), AnalysisOptions(top_k=5))

Differences from HTA 0.5's temporal breakdown, all intended (with ``time_basis="hta_rounded"`` the
shared real traces agree with HTA within 0.06% of the span, except the last item):

- Exact times by default. HTA rounds every event of a trace with fractional timestamps to whole
  microseconds (start up, end down), which shortens each short kernel by up to 2 us; on
  nanosecond-resolution traces that moves compute time by 1-15%. ``hta_rounded`` reproduces it.
- Device work is recognized by event category (kernel, copies, memsets, MTIA ``mtia_ccp_events``),
  not by "has an integer ``stream`` arg": HTA also counts CPU ops that carry a ``stream`` arg (the
  Inductor launcher op in a Triton trace: 94 us of "compute" for a 1.8 us kernel), and drops MTIA
  device events that lack a stream id (we keep them: 0.06% of that trace's span).
- Stream waits recorded on the device (``cuda_sync`` "Stream Wait Event") are non-compute ``sync``
  time; HTA's name rule makes them compute.
- Communication also covers RCCL/MCCL/HCCL and collective names; copies are recognized by category
  too (MUSA ``Memcpy1/2/3``), so vendors HTA calls "UNKNOWN" are classified.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfgate.helpers.lazy import lazy_exports
from perfgate.traces.classify import CATEGORIES, KINDS, Category, Kind, classify_device
from perfgate.traces.errors import TraceError, TraceFormatError, TraceTooLargeError
from perfgate.traces.models import (
    AnalysisWindow,
    CategoryStats,
    Distribution,
    Finding,
    FlopsSummary,
    KernelStats,
    LaunchStats,
    OpStats,
    RankProfile,
    RankSkew,
    StepStats,
    StepSummary,
    SyncCall,
    SyncStats,
    TraceSetReport,
)

if TYPE_CHECKING:
    from perfgate.traces.analyze import (
        TRACE_SUFFIXES,
        AnalysisOptions,
        analyze_table,
        analyze_trace,
        discover_trace_files,
        load_table,
    )
    from perfgate.traces.reading.reader import TraceStream, isal_available
    from perfgate.traces.traceset import analyze_traces, combine

__all__ = [
    "CATEGORIES",
    "KINDS",
    "TRACE_SUFFIXES",
    "AnalysisOptions",
    "AnalysisWindow",
    "Category",
    "CategoryStats",
    "Distribution",
    "Finding",
    "FlopsSummary",
    "KernelStats",
    "Kind",
    "LaunchStats",
    "OpStats",
    "RankProfile",
    "RankSkew",
    "StepStats",
    "StepSummary",
    "SyncCall",
    "SyncStats",
    "TraceError",
    "TraceFormatError",
    "TraceSetReport",
    "TraceStream",
    "TraceTooLargeError",
    "analyze_table",
    "analyze_trace",
    "analyze_traces",
    "classify_device",
    "combine",
    "discover_trace_files",
    "isal_available",
    "load_table",
]

# The reader and the analysis (numpy, msgspec) load on first use; the result models above are all the
# trace tools' schemas need, so the server starts without them.
_LAZY: dict[str, str] = {
    "TRACE_SUFFIXES": "perfgate.traces.analyze",
    "AnalysisOptions": "perfgate.traces.analyze",
    "analyze_table": "perfgate.traces.analyze",
    "analyze_trace": "perfgate.traces.analyze",
    "analyze_traces": "perfgate.traces.traceset",
    "combine": "perfgate.traces.traceset",
    "discover_trace_files": "perfgate.traces.analyze",
    "load_table": "perfgate.traces.analyze",
    "TraceStream": "perfgate.traces.reading.reader",
    "isal_available": "perfgate.traces.reading.reader",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
