"""PNG plots for evidence records (matplotlib, optional: the `plots` extra).

Every function returns PNG bytes, or raises `PlotsUnavailable` when matplotlib is missing; callers
record "plots are off" and carry on. The key plots of the trace tools (`breakdown_png`, `top_ops_png`)
and of `audit_samples` (`coverage_png`) are drawn by `perfgate.report.raster` instead: they come back
with every answer, so they must
cost milliseconds and need no matplotlib. Figures use the Agg backend and are closed after rendering, so
plotting from a server's worker threads neither opens windows nor leaks memory.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DPI",
    "FIGSIZE_IN",
    "PlotsUnavailable",
    "ab_distribution_png",
    "breakdown_png",
    "coverage_png",
    "plots_available",
    "step_times_png",
    "tensor_errors_png",
    "top_ops_png",
]

FIGSIZE_IN = (8.0, 4.5)
DPI = 100  # 800 x 450 pixels: readable in a report, small enough to hand to an agent
_COLORS = {
    "compute": "#4C72B0",
    "communication": "#DD8452",
    "memory": "#55A868",
    "idle": "#C7C7C7",
}


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed: ``pip install 'perfgate[plots]'``."""


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable(
            "plots are off: install the plots extra (pip install 'perfgate[plots]')"
        ) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _render(fig: Any) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=DPI)
    finally:
        plt.close(fig)
    return buf.getvalue()


def step_times_png(
    series: Mapping[int, Sequence[float]], warmup_steps: int, title: str = "Step time per step"
) -> bytes:
    """Step time (ms) against step index, one line per rank; warm-up shaded, measured window marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE_IN)
    longest = 0
    for rank in sorted(series):
        values = list(series[rank])
        longest = max(longest, len(values))
        ax.plot(range(len(values)), values, marker=".", linewidth=1, label=f"rank {rank}")
    if warmup_steps > 0:
        ax.axvspan(-0.5, warmup_steps - 0.5, color="#EEEEEE", label="warm-up (excluded)")
    if longest > warmup_steps:
        ax.axvline(warmup_steps - 0.5, color="#333333", linestyle="--", linewidth=1)
        ax.annotate(
            "measured window",
            xy=(warmup_steps, 1.0),
            xycoords=("data", "axes fraction"),
            va="top",
            fontsize=8,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    return _render(fig)


def ab_distribution_png(
    baseline_ms: Sequence[float],
    candidate_ms: Sequence[float],
    speedup: float | None,
    interval: tuple[float, float] | None,
    title: str = "Baseline vs candidate step times",
) -> bytes:
    """Step-time distributions side by side, with the speedup and its bootstrap interval in the title."""
    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=FIGSIZE_IN, gridspec_kw={"width_ratios": [3, 1]})
    data = [list(baseline_ms), list(candidate_ms)]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks([1, 2], ["baseline", "candidate"])
    ax.set_ylabel("step time (ms)")
    ax.grid(alpha=0.3, axis="y")
    if speedup is not None and interval is not None:
        lo, hi = interval
        ax2.errorbar(
            [0], [speedup], yerr=[[speedup - lo], [hi - speedup]], fmt="o", capsize=6, color="#4C72B0"
        )
        ax2.axhline(1.0, color="#999999", linestyle="--", linewidth=1)
        ax2.set_xticks([])
        ax2.set_ylabel("speedup (95% interval)")
        ax.set_title(f"{title}: speedup {speedup:.3f} [{lo:.3f}, {hi:.3f}]")
    else:
        ax2.axis("off")
        ax.set_title(title)
    return _render(fig)


def breakdown_png(
    ranks: Sequence[Mapping[str, Any]], title: str = "Where device time goes, per rank"
) -> bytes:
    """The trace tools' breakdown (`perfgate.report.raster.breakdown_png`: no matplotlib needed)."""
    from perfgate.report import raster  # numpy: imported when drawn, not at server start

    return raster.breakdown_png(ranks, title)


def top_ops_png(ops: Sequence[tuple[str, float]], title: str = "Host time by CPU op (self time)") -> bytes:
    """Host self time by op for CPU-only traces (`perfgate.report.raster.top_ops_png`)."""
    from perfgate.report import raster

    return raster.top_ops_png(ops, title)


def tensor_errors_png(
    histograms: Mapping[str, tuple[Sequence[float], Sequence[int]]], title: str = "Absolute error"
) -> bytes:
    """Histogram of |candidate - reference| per mismatching tensor (log-spaced bin edges, counts)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE_IN)
    for key, (edges, counts) in list(histograms.items())[:8]:
        centers = [math.sqrt(max(edges[i], 1e-300) * max(edges[i + 1], 1e-300)) for i in range(len(counts))]
        ax.step(centers, list(counts), where="mid", label=key)
    ax.set_xscale("log")
    ax.set_yscale("symlog")
    ax.set_xlabel("|candidate - reference|")
    ax.set_ylabel("elements")
    ax.set_title(title)
    if histograms:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _render(fig)


def coverage_png(
    matrix: Sequence[Sequence[float]],
    epochs: Sequence[int],
    ranks: Sequence[int],
    title: str = "Sample coverage",
) -> bytes:
    """Heat map of the fraction of expected samples seen, epoch x rank (`perfgate.report.raster.coverage_png`:
    it comes back with every `audit_samples` answer, so no matplotlib)."""
    from perfgate.report import raster

    return raster.coverage_png(matrix, epochs, ranks, title)
