"""The report's figures (matplotlib, Agg, no pyplot state), each returned as a PNG ``data:`` URI.

PNG rather than SVG: these plots have few points but the duty heatmap is an image either way, a PNG of a
small line plot is about as big as its SVG (matplotlib writes SVG text as paths), and PNG drawing is the
cheaper of the two for Agg. Figures are built with ``matplotlib.figure.Figure`` and dropped after
``savefig``: no figure manager keeps them alive, so nothing needs closing.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from croqq.report.duty import Duty
from croqq.report.model import FAIL_PREFIX, ShapeData
from croqq.report.sweeps import SweepLine

DPI = 80
COLORS = {"BASELINE": "#1f77b4", "KEEP": "#2ca02c", "DISCARD": "#8c8c8c", "FAIL": "#d62728"}
MARKERS = {"BASELINE": "s", "KEEP": "^", "DISCARD": "o", "FAIL": "x"}
FAIL_COLORS = ["#d62728", "#ff9896", "#a50f15", "#fb6a4a"]
ATTEMPT_COLORS = ["#ff7f0e", "#9467bd", "#e377c2", "#bcbd22", "#17becf"]


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _size_label(value: int) -> str:
    return f"{value // 1024}K" if value >= 1024 and value % 1024 == 0 else str(value)


def _sweep_axes(ax: Axes, line: SweepLine, pts: Sequence[tuple[int, ShapeData]], vendor: str) -> None:
    xs = [x for x, _ in pts]
    ax.plot(xs, [s.best_tflops for _, s in pts], "o-", color=COLORS["KEEP"], label="best")
    ax.plot(xs, [s.baseline_tflops for _, s in pts], "s--", color=COLORS["BASELINE"], label="baseline")
    measured = [(x, s.vendor_tflops) for x, s in pts if s.vendor_tflops]
    if measured:
        ax.plot(*zip(*measured, strict=True), "d:", color="#444444", label=vendor)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [_size_label(x) for x in xs], fontsize=7, rotation=45)
    ax.minorticks_off()
    ax.set_title(line.label, fontsize=9)
    ax.set_xlabel(line.var, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, alpha=0.3)


def sweep_figure(
    title: str, lines: Sequence[tuple[SweepLine, Sequence[tuple[int, ShapeData]]]], vendor: str
) -> str:
    """One scenario: a panel per sweep line, best and baseline TFLOPS (and the vendor's) over the size."""
    fig = Figure(layout="constrained", figsize=(max(3.3 * len(lines), 5.0), 2.7))  # room for the title
    axes = fig.subplots(1, len(lines), squeeze=False)[0]
    for ax, (line, pts) in zip(axes, lines, strict=True):
        _sweep_axes(ax, line, pts, vendor)
    axes[0].set_ylabel("TFLOPS", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _png(fig)


def _kind(decision: str) -> str:
    return "FAIL" if decision.startswith(FAIL_PREFIX) else decision


def shape_figure(shape: ShapeData, vendor: str) -> str:
    """TFLOPS per iteration, marked by decision, with the best-so-far staircase."""
    fig = Figure(layout="constrained", figsize=(7.5, 3.0))
    ax = fig.subplots()
    pts = shape.points
    for kind in ("BASELINE", "KEEP", "DISCARD", "FAIL"):
        mine = [p for p in pts if _kind(p.decision) == kind]
        if mine:
            ax.scatter(
                [p.iteration for p in mine],
                [p.tflops for p in mine],
                marker=MARKERS[kind],
                color=COLORS[kind],
                s=28,
                label=f"{kind} ({len(mine)})",
                zorder=3,
            )
    best = [p.best_after for p in pts]
    ax.step([p.iteration for p in pts], best, where="post", color="black", lw=1.2, label="best so far")
    if shape.vendor_tflops:
        ax.axhline(shape.vendor_tflops, color="#444444", ls=":", label=f"{vendor} {shape.vendor_tflops:.0f}")
    speedup = f", {shape.speedup:.2f}x baseline" if shape.speedup else ""
    attempts = sum(shape.attempts.values())
    tries = f"{attempts} attempt" + ("" if attempts == 1 else "s")
    ax.set_title(f"{shape.key} ({shape.status}{speedup}, {tries})", fontsize=9)
    ax.set_xlabel("iteration", fontsize=8)
    ax.set_ylabel("TFLOPS", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _png(fig)


def outcome_figure(groups: Sequence[tuple[str, dict[str, int]]]) -> str:
    """Stacked horizontal bars, one per group (dtype): iterations by decision, then attempts by kind."""
    segments = sorted({name for _, counts in groups for name in counts}, key=_segment_order)
    fig = Figure(layout="constrained", figsize=(9.0, max(2.2, 0.8 + 0.45 * len(groups))))
    ax = fig.subplots()
    labels = [label for label, _ in groups]
    left = [0] * len(groups)
    fails, attempts = iter(FAIL_COLORS * 4), iter(ATTEMPT_COLORS * 4)
    for name in segments:
        widths = [counts.get(name, 0) for _, counts in groups]
        color = COLORS.get(name) or next(fails if name.startswith(FAIL_PREFIX) else attempts)
        ax.barh(labels, widths, left=left, color=color, label=name, edgecolor="white")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("iterations (baselines not counted) and attempts", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, ncol=1 + len(segments) // 9, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _png(fig)


def _segment_order(name: str) -> tuple[int, str]:
    rank = {"KEEP": 0, "DISCARD": 1}
    if name in rank:
        return (rank[name], name)
    return (2, name) if name.startswith(FAIL_PREFIX) else (3, name)


TIME_UNITS = (("seconds", 1.0, 600.0), ("minutes", 60.0, 36_000.0), ("hours", 3600.0, float("inf")))


def duty_figure(d: Duty) -> str:
    """A heatmap: one row per GPU, one column per time bin, colour = busy fraction."""
    span_s = d.bin_s * len(d.fractions[0])
    unit, per = next((u, n) for u, n, most in TIME_UNITS if span_s <= most)  # the run's own scale
    fig = Figure(layout="constrained", figsize=(9.0, 1.3 + 0.28 * len(d.gpus)))
    ax = fig.subplots()
    image = ax.imshow(
        d.fractions,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0.0,
        vmax=1.0,
        extent=(0.0, span_s / per, len(d.gpus) - 0.5, -0.5),
    )
    ax.set_yticks(range(len(d.gpus)), [f"{g[:20]} ({d.mean(i):.0%})" for i, g in enumerate(d.gpus)])
    ax.tick_params(labelsize=7)
    start = datetime.fromtimestamp(d.start, UTC).strftime("%Y-%m-%d %H:%M UTC")
    ax.set_xlabel(f"{unit} since {start} (bins of {d.bin_s / per:.3g} {unit})", fontsize=8)
    fig.colorbar(image, ax=ax, label="busy fraction", fraction=0.03, pad=0.01)
    return _png(fig)
