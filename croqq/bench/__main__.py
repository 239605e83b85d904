"""`python -m croqq.bench [--only PART,...] [--out bench/results.json]`: all benchmarks, or the parts
named (writer, sweep, duty, recovery, redis, reconcile, source, agent, hosts, tuning, capacity, cpu,
events, exporter, report).
The tuning benchmark takes `[--landscape FILE ...] [--budgets 30,150] [--seeds N] [--json]`
(`--json`: print only its report)."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import tempfile
import time
from pathlib import Path

from croqq.backends.landscape import load_landscape
from croqq.bench import (
    agent_bench,
    capacity_bench,
    cluster_bench,
    events_bench,
    exporter_bench,
    hosts_bench,
    reconcile_bench,
    redis_bench,
    report_bench,
    tuning_bench,
    writer_bench,
)
from croqq.errors import ConfigError
from croqq.logs import configure

log = logging.getLogger("croqq.bench")
PARTS = (
    "writer",
    "sweep",
    "duty",
    "recovery",
    "redis",
    "reconcile",
    "source",
    "agent",
    "hosts",
    "tuning",
    "capacity",
    "cpu",
    "events",
    "exporter",
    "report",
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m croqq.bench", description=__doc__)
    parser.add_argument(
        "--only", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS)
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument(
        "--landscape",
        type=Path,
        action="append",
        help="tuning: a recorded landscape (Kernel Tuner cache file, JSON or gzipped JSON), repeatable "
        f"(default: {tuning_bench.DEFAULT_LANDSCAPE.relative_to(tuning_bench.LANDSCAPES.parent)})",
    )
    parser.add_argument("--budgets", default="30,150", help="tuning: measured configurations per run")
    parser.add_argument("--seeds", type=int, default=20, help="tuning: runs per recorded landscape")
    parser.add_argument("--json", action="store_true", help="tuning: print only the tuning report (JSON)")
    args = parser.parse_args()
    parts = [p for p in args.only.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(PARTS)}")
    try:
        budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--budgets {args.budgets!r}: give comma-separated whole numbers, e.g. 30,150")
    if not budgets or min(budgets) < 2 or args.seeds < 1:
        parser.error("--budgets must be whole numbers >= 2 and --seeds at least 1")
    landscapes = args.landscape or [tuning_bench.DEFAULT_LANDSCAPE]
    for path in landscapes:
        try:
            load_landscape(path)
        except ConfigError as exc:
            parser.error(str(exc))
    configure("INFO")
    results: dict[str, object] = {
        "machine": f"{platform.node()} {platform.machine()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    work = Path(tempfile.mkdtemp(prefix="croqq-bench-"))
    try:
        if "writer" in parts:
            log.info("writer benchmark ...")
            results |= writer_bench.run(work / "writer")
        if "sweep" in parts:
            log.info("control-plane sweep benchmark (268 shapes x 30 iterations, 8 simulated GPUs) ...")
            results |= cluster_bench.sweep(work / "sweep")
        if "recovery" in parts:
            log.info("recovery benchmark (each worker kind killed mid-step, lease TTL 10 s) ...")
            results |= cluster_bench.recovery(work / "recovery")
        if "redis" in parts:
            log.info("Redis restart benchmark (embedded Redis SIGKILLed mid-run under the supervisor) ...")
            results |= redis_bench.redis_restart(work / "redis")
        if "reconcile" in parts:
            log.info("reconciliation benchmark (268 active shapes against git after Redis forgot) ...")
            results |= reconcile_bench.run(work / "reconcile")
        if "duty" in parts:
            log.info("GPU duty cycle (2 simulated GPUs, long-tailed agents, fixed depth 4 vs adaptive) ...")
            results |= cluster_bench.duty_cycle(work / "duty")
        if "source" in parts:
            log.info("source-level run (scripted agent, 8 shapes x 6 iterations, real nvcc compiles) ...")
            results |= agent_bench.source_run(work / "source")
        if "agent" in parts:
            log.info("agent overhead (2,000-line kernel, 100-iteration history) ...")
            results |= agent_bench.overhead()
        if "hosts" in parts:
            log.info("multi-host benchmark (five namespace hosts: fault recovery, bytes per iteration) ...")
            results |= hosts_bench.run(work / "hosts")
        if "tuning" in parts:
            log.info(
                "tuning quality (%d strategies, budgets %s, %d seeds) ...",
                len(tuning_bench.STRATEGIES),
                budgets,
                args.seeds,
            )
            results["tuning"] = tuning_bench.run(landscapes, budgets, args.seeds)
        if "capacity" in parts:
            log.info("fleet capacity (Redis commands/bytes/CPU per iteration, writer at 100k history) ...")
            results |= capacity_bench.capacity(work / "capacity")
        if "cpu" in parts:
            log.info("control-plane CPU per stored iteration against a bare Celery floor ...")
            results |= capacity_bench.cpu_cost(work / "cpu")
        if "events" in parts:
            log.info("task events' cost to Redis (the same sweep with events off, on, on with Flower) ...")
            results |= events_bench.events_cost(work / "events")
        if "report" in parts:
            log.info("croqq report on a 268-shape, 8,040-iteration repo (fixture through the writer) ...")
            results |= report_bench.run(work / "report")
        if "exporter" in parts:
            log.info(
                "exporter scrape time (64 GPUs registered, 268 shapes, %d scrapes) ...",
                exporter_bench.SCRAPES,
            )
            results |= exporter_bench.run(work / "exporter")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["tuning"] if args.json and "tuning" in results else results, indent=2))


if __name__ == "__main__":
    main()
