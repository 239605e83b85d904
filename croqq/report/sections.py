"""What the report shows, section by section, from the repo model: the tables at once, the figures as
jobs (drawn afterwards, one progress tick each, since drawing is where the time goes).

Sections (their element ids): ``summary`` (per run and dtype: shapes done/active/pending, iterations,
outcomes, speedups over baseline and the vendor library), ``sweeps`` (per scenario, a panel per sweep
line: best and baseline TFLOPS over the swept size, and cuBLAS where measured), ``shapes`` (TFLOPS per
iteration of the chosen shapes), ``outcomes`` (the outcome mix per dtype), ``duty`` (GPU duty over time)
and ``table`` (every shape, folded).

Per-shape plots are drawn only for the shapes asked for with ``--key`` and the ``--top`` N by speedup over
their baseline: one plot per scheduled shape is a page nobody scrolls through, and drawing is where the
time goes. The folded table lists every shape's numbers.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from croqq.domain.manifest import Manifest
from croqq.report import duty, plots
from croqq.report.html import Image, Section, Table
from croqq.report.model import FAIL_PREFIX, RepoData, RunData, ShapeData
from croqq.report.sweeps import points, sweep_lines

VENDOR = "cuBLAS"


@dataclass(frozen=True)
class Job:
    """One figure to draw into ``section``."""

    section: Section
    id: str
    alt: str
    caption: str
    draw: Callable[[], str]

    def run(self) -> None:
        self.section.images.append(Image(self.id, self.draw(), self.alt, self.caption))


def _slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(parts)).strip("-")


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _tf(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


def _dtypes(run: RunData, manifest: Manifest) -> list[str]:
    order = {d: i for i, d in enumerate(manifest.dtypes)}
    have = {s.dtype for s in run.shapes.values()} | set(run.pending.values())
    return sorted(have, key=lambda d: (order.get(d, len(order)), d))


def _best(shapes: list[ShapeData], ratio: Callable[[ShapeData], float | None]) -> str:
    rated = [(r, s.key) for s in shapes if (r := ratio(s)) is not None]
    if not rated:
        return "-"
    top, key = max(rated)
    return f"{_x(statistics.median(r for r, _ in rated))} / {_x(top)} ({key})"


def summary(data: RepoData, manifest: Manifest) -> Section:
    rows = []
    for run in data.runs:
        for dtype in _dtypes(run, manifest):
            shapes = [s for s in run.shapes.values() if s.dtype == dtype]
            decisions = [p.decision for s in shapes for p in s.points if p.iteration > 0]
            rows.append(
                [
                    run.label,
                    dtype,
                    str(sum(s.status == "done" for s in shapes)),
                    str(sum(s.status == "active" for s in shapes)),
                    str(sum(d == dtype for d in run.pending.values())),
                    str(sum(len(s.points) for s in shapes)),
                    str(decisions.count("KEEP")),
                    str(sum(d.startswith(FAIL_PREFIX) for d in decisions)),
                    str(sum(sum(s.attempts.values()) for s in shapes)),
                    str(sum(s.siblings for s in shapes)),
                    _best(shapes, lambda s: s.speedup),
                    _best(shapes, lambda s: s.vs_vendor),
                ]
            )
    header = ["run", "dtype", "done", "active", "pending", "iterations", "KEEP", "FAIL", "attempts"]
    header += ["siblings measured"]
    header += ["best / baseline: median / max", f"best / {VENDOR}: median / max"]
    return Section(
        "summary",
        "Summary",
        "Per run and dtype. Iterations include each shape's baseline (iteration 0); siblings measured are "
        "the other candidates measured beside an iteration's chosen one (--candidates N); pending shapes "
        "were submitted but have stored nothing yet.",
        tables=[Table(header, rows)],
    )


def shape_table(data: RepoData) -> Section:
    shapes = sorted(data.shapes(), key=lambda s: (-(s.speedup or 0.0), s.key))
    rows = [
        [
            s.key,
            f"{s.gpu}/{s.dsl}",
            s.status,
            f"{s.current_iter}/{s.max_iter}",
            _tf(s.baseline_tflops),
            _tf(s.best_tflops),
            _tf(s.vendor_tflops),
            _x(s.speedup),
            _x(s.vs_vendor),
            str(sum(s.attempts.values())),
            str(s.siblings),
            str(s.imported),
        ]
        for s in shapes
    ]
    header = ["key", "run", "status", "iter/max", "baseline", "best", VENDOR, "x baseline", f"x {VENDOR}"]
    table = Table(
        [*header, "attempts", "siblings", "imported iters"],
        rows,
        collapsed=f"all {len(rows)} shapes, by speedup (TFLOPS)",
    )
    return Section("table", "Every shape", tables=[table])


def _best_row(rows: list[dict[str, object]]) -> str:
    """The highest TFLOPS of a history log's non-reference rows, with its id as written."""
    measured = [r for r in rows if isinstance(r.get("tflops"), int | float) and not r.get("reference")]
    best = max(measured, key=lambda r: float(r["tflops"]), default=None)  # type: ignore[arg-type]
    return f"{_tf(float(best['tflops']))} ({best['original_id']})" if best else "-"  # type: ignore[arg-type]


def imported_history(data: RepoData) -> Section:
    """Logs `croqq import` kept as read-only history (what croqq cannot tune), beside the shapes: imported
    iterations of tunable shapes are in every shape's figures and table like croqq's own."""
    rows = [
        [
            log.source,
            log.key,
            f"{run.gpu}/{run.dsl}",
            str(len(log.rows)),
            _best_row(log.rows),
            _tf(log.reference_tflops),
            log.why,
        ]
        for run in data.runs
        for log in run.imported
    ]
    header = ["source", "key", "run", "rows", "best (id)", "reference", "why history"]
    tables = [Table(header, rows, collapsed=f"{len(rows)} imported log(s) kept as history")] if rows else []
    notes = [] if rows else ["No imported log is kept as history."]
    return Section("imported", "Imported history", tables=tables, notes=notes)


def sweeps(data: RepoData, manifest: Manifest) -> tuple[Section, list[Job]]:
    section = Section(
        "sweeps",
        "Scenario sweeps",
        f"Best and baseline TFLOPS along each sweep line of the manifest's scenarios (log2 size axis), with "
        f"{VENDOR} (measured with each shape's baseline) where there is one. A line without any stored "
        "shape is left out.",
    )
    lines, jobs = sweep_lines(manifest), []
    for run in data.runs:
        for dtype in _dtypes(run, manifest):
            by_dims = {s.dims: s for s in run.shapes.values() if s.dtype == dtype}
            for scenario in manifest.scenarios:
                drawn = [(ln, pts) for ln in lines if ln.scenario == scenario if (pts := points(ln, by_dims))]
                if not drawn:
                    continue
                title = f"{scenario} · {dtype} · {run.label}"
                jobs.append(
                    Job(
                        section,
                        _slug("sweep", run.gpu, run.dsl, dtype, scenario),
                        f"sweep {title}",
                        "",
                        partial(plots.sweep_figure, title, drawn, VENDOR),
                    )
                )
    if not jobs:
        section.notes.append("No stored shape lies on a scenario sweep line of the manifest.")
    return section, jobs


def chosen_shapes(data: RepoData, keys: tuple[str, ...], top: int) -> list[ShapeData]:
    """The ``--key`` shapes, then the ``top`` highest speedups not among them."""
    everything = data.shapes()
    asked = [s for key in keys for s in everything if s.key == key]
    rated = [s for s in everything if s.speedup is not None and s not in asked]
    rated.sort(key=lambda s: (-(s.speedup or 0.0), s.key))
    return asked + rated[:top]


def shapes(data: RepoData, keys: tuple[str, ...], top: int) -> tuple[Section, list[Job]]:
    chosen = chosen_shapes(data, keys, top)
    why = f"the {top} highest speedups over their baseline" if top else ""
    which = " and ".join(p for p in (f"--key {', '.join(keys)}" if keys else "", why) if p) or "none chosen"
    section = Section(
        "shapes",
        "Shapes, iteration by iteration",
        f"TFLOPS of every measured iteration (KEEP, DISCARD, FAIL at 0, the baseline) and the best-so-far "
        f"staircase. Shown: {which}; `croqq report --key KEY` draws any other.",
    )
    jobs = [
        Job(
            section,
            _slug("shape", s.gpu, s.dsl, s.key),
            f"iterations of {s.key}",
            f"{s.gpu} / {s.dsl}",
            partial(plots.shape_figure, s, VENDOR),
        )
        for s in chosen
    ]
    return section, jobs


def outcomes(data: RepoData, manifest: Manifest) -> tuple[Section, list[Job]]:
    groups: list[tuple[str, dict[str, int]]] = []
    for run in data.runs:
        for dtype in _dtypes(run, manifest):
            counts: dict[str, int] = {}
            for s in run.shapes.values():
                if s.dtype != dtype:
                    continue
                for p in s.points:
                    if p.iteration > 0:
                        counts[p.decision] = counts.get(p.decision, 0) + 1
                for kind, n in s.attempts.items():
                    counts[f"attempt:{kind}"] = counts.get(f"attempt:{kind}", 0) + n
            if counts:
                groups.append((dtype if len(data.runs) == 1 else f"{dtype} · {run.label}", counts))
    section = Section(
        "outcomes",
        "Outcome mix",
        "Measured iterations by decision and attempts (no iteration id: compile failures, refused or failed "
        "agent answers) by kind, per dtype.",
    )
    if not groups:
        section.notes.append("No iteration after the baselines yet.")
        return section, []
    return section, [
        Job(section, "outcomes-mix", "outcome mix per dtype", "", lambda: plots.outcome_figure(groups))
    ]


def gpu_duty(data: RepoData) -> tuple[Section, list[Job]]:
    section = Section(
        "duty",
        "GPU duty",
        "Per GPU, the fraction of each time bin in which a BASELINE, MEASURE or PROFILE step held it (from "
        "the interval each measurement and profile records; the percentage is the mean over the run).",
    )
    busy = [b for s in data.shapes() for b in s.busy]
    d = duty.duty(busy)
    if d is None:
        section.notes.append(
            "Not drawn: this repo's records carry no GPU step intervals (measure.gpu_started_at and "
            "gpu_busy_s; repos written before croqq recorded them)."
        )
        return section, []
    return section, [Job(section, "duty-heatmap", "GPU duty over time", "", lambda: plots.duty_figure(d))]
