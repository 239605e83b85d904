"""Rich rendering of a cluster snapshot: shapes per dtype, throughput and ETA, and what each GPU does."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table

from croqq.work.progress import RateMeter, Snapshot


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def render(snap: Snapshot, meter: RateMeter | None = None, title: str = "croqq") -> Group:
    shapes = Table(title=title, title_justify="left")
    for col in ("dtype", "done", "active", "pending", "error", "iterations"):
        shapes.add_column(col, justify="right" if col != "dtype" else "left")
    rows = [*sorted(snap.dtypes.items()), ("all", snap.total)]
    for name, p in rows:
        pct = 100.0 * p.iters_done / p.iters_total if p.iters_total else 0.0
        shapes.add_row(
            name,
            str(p.done),
            str(p.active),
            str(p.pending),
            str(p.error),
            f"{p.iters_done}/{p.iters_total} ({pct:.1f}%)",
        )
    c = snap.counters
    rate = meter.rate if meter else 0.0
    eta = meter.eta_s(snap) if meter else None
    line = (
        f"{rate:.1f} iter/s   ETA {duration(eta)}   KEEP {c.get('KEEP', 0)}  DISCARD {c.get('DISCARD', 0)}  "
        f"FAIL {c.get('FAIL', 0)}  attempts {c.get('attempts', 0)} "
        f"(compile {c.get('attempts:compile', 0)}, check {c.get('attempts:check', 0)}, "
        f"agent {c.get('attempts:agent', 0)}, repeat {c.get('attempts:repeat', 0)})   "
        f"re-dispatched {c.get('redispatch', 0)}  "
        f"quarantines {c.get('quarantines', 0)}  migrations {c.get('migrations', 0)}"
    )
    gpus = Table(show_edge=False)
    for col in ("gpu", "status", "shapes", "busy", "now"):
        gpus.add_column(col)
    for g in snap.gpus:
        status = f"{g.status}: {g.reason}" if g.reason else g.status
        shapes_of = f"{g.active}/{g.depth}" if g.depth else str(g.active)  # active / pipeline depth
        gpus.add_row(g.uuid, status, shapes_of, duration(g.busy_s), g.current or "idle")
    return Group(shapes, line, gpus, *_agents(snap), *_problems(snap))


def _problems(snap: Snapshot, limit: int = 10) -> list[Table]:
    """Alarms, workers whose host refuses work, and parked shapes with their reason (nothing when none)."""
    out = []
    if snap.alarms:
        table = Table(title="ALARMS (croqq waits for these to pass; each says what to do)", show_edge=False)
        for col in ("alarm", "where", "since"):
            table.add_column(col, no_wrap=True)
        table.add_column("what", overflow="fold")  # whole: it says what to do
        for a in snap.alarms:
            table.add_row(a.name, a.source, time.strftime("%H:%M:%S", time.localtime(a.at)), a.message)
        out.append(table)
    if snap.host_problems:
        table = Table(
            title="workers refusing work (fix the host, then start the worker again)", show_edge=False
        )
        for col in ("worker", "since", "reason"):
            table.add_column(col)
        for p in snap.host_problems:
            table.add_row(p.worker, time.strftime("%H:%M:%S", time.localtime(p.at)), p.reason[:120])
        out.append(table)
    parked = sorted((sid, s) for sid, s in snap.shapes.items() if s.status == "error")
    if parked:
        table = Table(
            title=f"parked shapes ({len(parked)}; `croqq retry --errors` resumes them)", show_edge=False
        )
        for col in ("shape", "iters", "reason"):
            table.add_column(col)
        for sid, s in parked[:limit]:
            table.add_row(sid.rsplit("/", 1)[-1], f"{s.current_iter}/{s.max_iter}", s.error[:120])
        out.append(table)
    return out


def _agents(snap: Snapshot) -> list[Table | str]:
    """Agent health and budget lines (nothing when no agent ran)."""
    out: list[Table | str] = []
    budget = snap.budget
    if budget is not None and (budget.max_calls or budget.max_usd):
        limits = (
            f"{budget.calls}/{budget.max_calls or '-'} calls, ${budget.usd:.2f}/${budget.max_usd or 0:.2f}"
        )
        out.append(
            f"agent budget: {limits}"
            + (f"  SPENT: ideation stopped ({budget.spent})" if budget.spent else "")
        )
    if not snap.agents:
        return out
    table = Table(show_edge=False)
    for col in ("agent", "health", "calls", "failures", "agent time", "cost", "last error"):
        table.add_column(col)
    for a in snap.agents:
        state = "healthy" if a.healthy else (f"backed off {a.backoff_s:.0f}s" if a.backoff_s else "failing")
        table.add_row(
            a.name,
            state,
            str(a.calls),
            str(a.failures),
            duration(a.wall_s),
            f"${a.cost_usd:.2f}",
            a.last_error[:80] if not a.healthy else "",
        )
    return [*out, table]


def summary_table(snap: Snapshot, limit: int = 20) -> Table:
    """The best speedups at the end of a run."""
    table = Table(title="best results (top speedups over baseline)", title_justify="left")
    for col in ("shape", "iters", "baseline TFLOPS", "best TFLOPS", "speedup"):
        table.add_column(col, justify="right" if col != "shape" else "left")
    ranked = sorted(
        snap.shapes.items(),
        key=lambda kv: kv[1].best_tflops / kv[1].baseline_tflops if kv[1].baseline_tflops else 0.0,
        reverse=True,
    )
    for sid, s in ranked[:limit]:
        speedup = s.best_tflops / s.baseline_tflops if s.baseline_tflops else 0.0
        table.add_row(
            sid.rsplit("/", 1)[-1],
            f"{s.current_iter}/{s.max_iter}",
            f"{s.baseline_tflops:.1f}",
            f"{s.best_tflops:.1f}",
            f"{speedup:.2f}x",
        )
    return table


def progress_line(snap: Snapshot, meter: RateMeter | None, elapsed_s: float) -> str:
    """One line for a log or a pipe: time, iterations, rate, ETA, shapes, decisions, GPUs."""
    t, c = snap.total, snap.counters
    pct = 100.0 * t.iters_done / t.iters_total if t.iters_total else 0.0
    busy = sum(1 for g in snap.gpus if g.current)
    healthy = sum(1 for g in snap.gpus if g.status == "healthy")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snap.at))
    return (
        f"{stamp} progress: {t.iters_done}/{t.iters_total} iterations ({pct:.1f}%) after "
        f"{duration(elapsed_s)}, {meter.rate if meter else 0.0:.2f} iter/s, "
        f"ETA {duration(meter.eta_s(snap) if meter else None)}; shapes done {t.done} active {t.active} "
        f"pending {t.pending} error {t.error}; KEEP {c.get('KEEP', 0)} DISCARD {c.get('DISCARD', 0)} "
        f"FAIL {c.get('FAIL', 0)} attempts {c.get('attempts', 0)}; GPUs {len(snap.gpus)} "
        f"({healthy} healthy, {busy} busy)"
    )
