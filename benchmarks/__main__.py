"""`python -m benchmarks [--only PART,...] [--baseline REV] [--out bench/results.json]`: all benchmarks, or
the parts named. The figures go to --out (JSON) and as one line to the history (benchmarks/history.jsonl:
commit, date, machine, parts, figures). The writer benchmark measures the store of `--baseline` (a git
revision, default HEAD) beside this tree's. The tuning benchmark takes `[--landscape FILE ...]
[--budgets 30,150] [--seeds N] [--sim-shapes N] [--landscape-set DIR ...] [--transfer-sets sim-f16,...]
[--transfer-seeds N] [--json]` (`--json`: print only its report)."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    agent_bench,
    capacity_bench,
    cluster_bench,
    compile_bench,
    events_bench,
    exporter_bench,
    history,
    hosts_bench,
    import_bench,
    integrity_bench,
    reconcile_bench,
    redis_bench,
    report_bench,
    transfer_bench,
    tuning_bench,
    writer_bench,
)
from croqq.backends.landscape import load_landscape
from croqq.errors import ConfigError
from croqq.logs import configure

log = logging.getLogger("benchmarks")

Part = Callable[[Path, argparse.Namespace], dict[str, Any]]
# name -> (what the log says it runs, the part: work folder and arguments -> figures), in running order
PARTS: dict[str, tuple[str, Part]] = {
    "writer": ("writer benchmark", lambda w, a: writer_bench.run(w, a.baseline)),
    "sweep": ("control-plane sweep (every shape, 8 simulated GPUs)", lambda w, a: cluster_bench.sweep(w)),
    "recovery": ("recovery (each worker kind killed mid-step)", lambda w, a: cluster_bench.recovery(w)),
    "redis": (
        "Redis restart (SIGKILLed mid-run under the supervisor)",
        lambda w, a: redis_bench.redis_restart(w),
    ),
    "reconcile": ("reconciliation against git after Redis forgot", lambda w, a: reconcile_bench.run(w)),
    "duty": ("GPU duty cycle (fixed vs adaptive depth)", lambda w, a: cluster_bench.duty_cycle(w)),
    "duty-compile": (
        "GPU duty cycle with CUTLASS-length builds (fixed vs adaptive depth)",
        lambda w, a: cluster_bench.duty_compile(w),
    ),
    "source": (
        "source-level run (scripted agent, real nvcc compiles)",
        lambda w, a: agent_bench.source_run(w),
    ),
    "source-cutlass": (
        "the cutlass family at source level, 4 shapes x 4 iterations (scripted agent, real nvcc)",
        lambda w, a: agent_bench.cutlass_source_run(w),
    ),
    "agent": ("agent overhead per IDEATE step", lambda w, a: agent_bench.overhead()),
    "compile": (
        "compile time per kernel family (sampled knob settings the rules accept, real nvcc)",
        lambda w, a: compile_bench.run(
            w,
            a.compile_samples,
            *(tuple(filter(None, v.split(","))) for v in (a.compile_dsls, a.compile_dtypes)),
        ),
    ),
    "hosts": (
        "multi-host (namespace hosts: fault recovery, bytes per iteration)",
        lambda w, a: hosts_bench.run(w),
    ),
    "tuning": (
        "tuning quality",
        lambda w, a: _tuning(a),
    ),
    "capacity": (
        "fleet capacity (Redis commands/bytes/CPU per iteration)",
        lambda w, a: capacity_bench.capacity(w),
    ),
    "cpu": (
        "control-plane CPU per stored iteration vs a bare Celery floor",
        lambda w, a: capacity_bench.cpu_cost(w),
    ),
    "events": ("task events' cost to Redis", lambda w, a: events_bench.events_cost(w)),
    "report": ("croqq report on a full results repo", lambda w, a: report_bench.run(w)),
    "exporter": ("exporter scrape time", lambda w, a: exporter_bench.run(w)),
    "import": ("croqq import of a 2,000-row log and a 100-shape tree", lambda w, a: import_bench.run(w)),
    "integrity": ("results repo check at 10k iterations", lambda w, a: integrity_bench.run(w)),
}


def _tuning(args: argparse.Namespace) -> dict[str, Any]:
    """The tuning report (the transfer result beside ``landscapes``) and its flat figures."""
    report = tuning_bench.run(args.landscape, args.budgets, args.seeds, sim_limit=args.sim_shapes)
    report["transfer"] = transfer_bench.run(args.transfer_sets, args.landscape_set, args.transfer_seeds)
    for line in tuning_bench.describe(report) + transfer_bench.describe(report["transfer"]):
        log.info("%s", line)
    return {"tuning": report, **tuning_bench.flat_figures(report)}


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--only", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS)
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"), help="this run's figures")
    parser.add_argument(
        "--history", type=Path, default=history.HISTORY, help="JSONL file that gets one line per run"
    )
    parser.add_argument(
        "--landscape",
        type=Path,
        action="append",
        help="tuning: a recorded landscape (Kernel Tuner cache file, JSON or gzipped JSON), repeatable "
        f"(default: {tuning_bench.DEFAULT_LANDSCAPE.relative_to(tuning_bench.LANDSCAPES.parent)})",
    )
    parser.add_argument(
        "--baseline",
        default="HEAD",
        help="writer: the git revision whose store is measured beside this tree's (default: HEAD)",
    )
    parser.add_argument("--budgets", default="30,150", help="tuning: measured configurations per run")
    parser.add_argument(
        "--seeds",
        type=int,
        default=60,
        help="tuning: runs per recorded landscape (60: a within-5%% share of 20 runs has a standard error "
        "near 0.09, too wide to rank strategies by it)",
    )
    parser.add_argument(
        "--sim-shapes", type=int, help="tuning: tune only the first N shapes of the simulated sweep (0: none)"
    )
    parser.add_argument(
        "--landscape-set",
        type=Path,
        action="append",
        default=[],
        help="tuning: a folder of Kernel Tuner cache files, one per problem (problem_size [M, N, K]), "
        "for the transfer benchmark; repeatable",
    )
    parser.add_argument(
        "--transfer-sets",
        default=",".join(transfer_bench.sim_sets()),
        help="tuning: simulated sweeps for the transfer benchmark (default: %(default)s; '' for none)",
    )
    parser.add_argument(
        "--transfer-seeds", type=int, default=transfer_bench.SEEDS, help="tuning: transfer runs per shape"
    )
    parser.add_argument("--json", action="store_true", help="tuning: print only the tuning report (JSON)")
    parser.add_argument(
        "--compile-samples",
        type=int,
        default=compile_bench.SAMPLES,
        help="compile: knob settings compiled per family and dtype (CUTLASS: about a minute each on 2 cores)",
    )
    parser.add_argument(
        "--compile-dsls", default="", help="compile: only these families (default: every one)"
    )
    parser.add_argument(
        "--compile-dtypes", default="", help="compile: only these dtypes (default: every one of each family)"
    )
    args = parser.parse_args()
    args.parts = [p for p in args.only.split(",") if p]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        parser.error(f"--only {args.only!r}: unknown benchmark(s) {unknown}; choose from {', '.join(PARTS)}")
    try:
        args.budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--budgets {args.budgets!r}: give comma-separated whole numbers, e.g. 30,150")
    if not args.budgets or min(args.budgets) < 2 or args.seeds < 1 or args.transfer_seeds < 1:
        parser.error("--budgets must be whole numbers >= 2 and --seeds and --transfer-seeds at least 1")
    if args.sim_shapes is not None and args.sim_shapes < 0:
        parser.error("--sim-shapes must be 0 or more")
    args.transfer_sets = [s for s in args.transfer_sets.split(",") if s.strip()]
    unknown_sets = sorted(set(args.transfer_sets) - set(transfer_bench.sim_sets()))
    if unknown_sets:
        parser.error(
            f"--transfer-sets: unknown {unknown_sets}; choose from {', '.join(transfer_bench.sim_sets())}"
        )
    args.landscape = args.landscape or [tuning_bench.DEFAULT_LANDSCAPE]
    try:
        for path in args.landscape:
            load_landscape(path)
        for folder in args.landscape_set:
            transfer_bench.landscape_set(folder)
    except ConfigError as exc:
        parser.error(str(exc))
    return args


def run_parts(
    names: list[str], args: argparse.Namespace, parts: dict[str, tuple[str, Part]] = PARTS
) -> dict[str, Any]:
    """Run the parts named, in the table's order, each in its own folder of a scratch directory."""
    figures: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="croqq-bench-"))
    try:
        for name, (what, part) in parts.items():
            if name in names:
                log.info("%s: %s ...", name, what)
                figures |= part(work / name, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def main() -> None:
    args = _args()
    configure("INFO")
    figures = run_parts(args.parts, args)
    line = history.append(args.history, args.parts, figures)
    results = {key: line[key] for key in ("commit", "dirty", "date", "machine", "cpus")} | figures
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    log.info("figures in %s; one line appended to %s", args.out, args.history)
    print(json.dumps(results["tuning"] if args.json and "tuning" in results else results, indent=2))


if __name__ == "__main__":
    main()
