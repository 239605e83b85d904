"""Cluster benchmarks on the real local cluster (Redis server, Celery worker processes, git writer).

- ``sweep_seconds``: `submit --dtype all` (268 shapes x 30 iterations + baselines) on 8 simulated GPUs
  with zero step time, from submission to the last STORE; ``overhead_ms_p50``/``_p99``: per iteration,
  the wall time from the previous STORE of the shape (for its first, from when it got a GPU slot) to this
  one minus the steps' own execution time (queueing behind the GPU's other shapes, messaging, ledger
  transactions, git).
- ``duty_cycle``: 4 simulated GPUs, step durations ideate 60 s, implement 20 s, measure 10 s (profile
  15 s), time-scaled by 1/100; the fraction of wall time the GPUs spend measuring or profiling over a
  steady window, with the shapes pipelined (``pipeline_depth`` shapes per GPU); ``sequential_duty_cycle``
  is the same cluster with one shape per GPU (the one-agent, one-GPU loop), in the same run.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

from croqq.delivery import keys
from croqq.processes.local import LocalCluster
from croqq.work import stats

log = logging.getLogger(__name__)

DUTY_WARMUP_S = 8.0
DUTY_WINDOW_S = 30.0
PIPELINED_DEPTH = 12


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100.0 * (len(ordered) - 1)))]


def sweep(work: Path, gpus: int = 8, max_iter: int = 30) -> dict[str, float]:
    env = {
        "CROQQ_RUN_DIR": str(work / "run"),
        "CROQQ_RESULTS_REPO": str(work / "results"),
        "CROQQ_SIM_GPUS": str(gpus),
        "CROQQ_TIME_SCALE": "0",
    }
    with LocalCluster(env, log_level="WARNING") as cluster:
        cluster.wait_gpus()
        start = time.monotonic()
        sub = cluster.submit("all", max_iter=max_iter)
        snap = cluster.wait_done(sub, timeout_s=1800)
        seconds = time.monotonic() - start
        overhead = stats.overhead_samples(cluster.client)
        counters = stats.counters(cluster.client)
    iterations = snap.total.iters_done
    log.info("sweep: %d iterations in %.1fs", iterations, seconds)
    return {
        "sweep_seconds": round(seconds, 1),
        "sweep_iterations": iterations,
        "sweep_iters_per_s": round(iterations / seconds, 1),
        "sweep_compile_failed_attempts": counters.get("attempts", 0),
        "overhead_ms_p50": round(statistics.median(overhead), 1) if overhead else 0.0,
        "overhead_ms_p99": round(_percentile(overhead, 99), 1),
    }


def _duty(work: Path, depth: int, gpus: int) -> float:
    env = {
        "CROQQ_RUN_DIR": str(work / "run"),
        "CROQQ_RESULTS_REPO": str(work / "results"),
        "CROQQ_SIM_GPUS": str(gpus),
        "CROQQ_TIME_SCALE": "0.01",
        "CROQQ_SIM_IDEATE_S": "60",
        "CROQQ_SIM_IMPLEMENT_S": "20",
        "CROQQ_SIM_MEASURE_S": "10",
        "CROQQ_SIM_PROFILE_S": "15",
        "CROQQ_PIPELINE_DEPTH": str(depth),
        "CROQQ_IDEATE_CONCURRENCY": str(max(4, 3 * depth * gpus // 2)),
        "CROQQ_BUILD_CONCURRENCY": str(max(2, depth * gpus // 2)),
        "CROQQ_BUILD_POOL": "threads",
    }
    with LocalCluster(env, log_level="WARNING") as cluster:
        cluster.wait_gpus()
        cluster.submit("all", max_iter=30)
        time.sleep(DUTY_WARMUP_S)
        uuids = sorted(cluster.client.smembers(keys.GPUS))
        before = sum(stats.busy(cluster.client, u).get("busy_s", 0.0) for u in uuids)
        t0 = time.monotonic()
        time.sleep(DUTY_WINDOW_S)
        after = sum(stats.busy(cluster.client, u).get("busy_s", 0.0) for u in uuids)
        window = time.monotonic() - t0
    duty = (after - before) / (window * len(uuids))
    log.info("duty cycle at depth %d: %.3f", depth, duty)
    return round(duty, 4)


def duty_cycle(work: Path, gpus: int = 4) -> dict[str, float]:
    return {
        "duty_cycle": _duty(work / "pipelined", PIPELINED_DEPTH, gpus),
        "sequential_duty_cycle": _duty(work / "sequential", 1, gpus),
        "duty_pipeline_depth": PIPELINED_DEPTH,
    }


def recovery(work: Path, ttl_s: float = 10.0) -> dict[str, object]:
    """Kill each worker kind once mid-step (default lease TTL) and time until its step is finished
    elsewhere; Celery alone would redeliver only after the visibility timeout."""
    from croqq.chaos.faults import KILLS
    from croqq.chaos.stress import StressConfig, run
    from croqq.processes.app import visibility_timeout_s
    from croqq.settings import Settings

    kinds = [kind for kind, (barrier, _) in KILLS.items() if barrier is not None]
    cfg = StressConfig(
        agents_per_dsl=24,
        round_target=12,
        seed=11,
        run_name="recovery",
        dsls=["cuda"],
        kinds=kinds,
        fault_count=len(kinds),
        out_root=work,
        lease_ttl_s=ttl_s,
        log_level="WARNING",
    )
    summary = run(cfg).summary
    return {
        "recovery_lease_ttl_s": ttl_s,
        "recovery_kills_landed": sum(summary["faults_injected"].values()),
        "recovery_kills_by_kind": summary["faults_injected"],
        "recovery_kill_p50_s": summary["recovery_p50_s"],
        "recovery_kill_max_s": summary["recovery_max_s"],
        "recovery_rounds_lost": summary["rounds_lost"],
        "recovery_duplicates": summary["duplicates"],
        "celery_visibility_timeout_s": visibility_timeout_s(Settings()),
    }
