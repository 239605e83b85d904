"""Benchmarks on the real local cluster (Redis server, Celery worker processes, git writer).

- ``sweep``: every scheduled shape on simulated GPUs with zero step time, from submission to the last
  STORE, and croqq's overhead per iteration (wall time between a shape's STOREs minus its steps' own time);
- ``recovery``: each worker kind killed mid-step, the time until the cluster stores again;
- ``duty_cycle``: simulated GPUs whose agents think for long, widely varying times (time-scaled), the
  share of wall time each GPU spends measuring, with a fixed pipeline depth and with the adaptive depth
  (:mod:`croqq.placement.depth`) in one invocation, and how often a GPU had nothing to run (``starved``);
- ``duty_compile``: the same, each build taking a CUTLASS compile's real time (time-scaled): the adaptive
  depth counts a build's seconds, claim to result, as it counts an agent's."""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

from croqq.delivery import clock, keys
from croqq.placement import depth
from croqq.processes.local import LocalCluster
from croqq.work import stats

log = logging.getLogger(__name__)

DUTY_GPUS = 2
# 1/25: a GPU worker spends ~20-30 ms per step on its own bookkeeping on a busy 2-core machine, which no
# depth can hide; at 1/25 that is ~5% of a (0.4 s) measurement
DUTY_TIME_SCALE = 0.04
DUTY_WARMUP_S = {"fixed": 30.0, "adaptive": 150.0}  # the adaptive depth learns over ~8 agent cycles
DUTY_WINDOW_S = 60.0
FIXED_DEPTH = 4  # today's default pipeline_depth
DUTY_CANDIDATES = 4  # the batch run beside N = 1
AGENT_MEDIAN_S, AGENT_P90_S = 264.0, 900.0
CUTLASS_COMPILE_S = 50.0  # one cutlass-family compile on a 2-core build host (compile benchmark, p50)
AGENT_SIGMA = math.log(AGENT_P90_S / AGENT_MEDIAN_S) / 1.2816  # z of the 90th percentile


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


def _busy_now(client: Any, uuids: list[str]) -> tuple[float, list[float]]:
    """Redis's time and each GPU's busy seconds up to it, its step in progress included (a confirmation
    measures for seconds: counted only once it ends, it would blur the window's edges)."""
    now = clock.now(client)
    pipe = client.pipeline()
    for uuid in uuids:
        pipe.hget(keys.gpu_busy(uuid), "busy_s")
        pipe.hmget(keys.gpu(uuid), "current", "since")
    replies = pipe.execute()
    busy = []
    for total, (current, since) in zip(replies[::2], replies[1::2], strict=True):
        running = max(0.0, now - float(since)) if current and since else 0.0
        busy.append(float(total or 0.0) + running)
    return now, busy


def _measured(client: Any, uuids: list[str]) -> int:
    """Kernels measured so far on these GPUs (each candidate of a batch counts)."""
    pipe = client.pipeline(transaction=False)
    for uuid in uuids:
        pipe.hget(keys.gpu_busy(uuid), "measurements")
    return sum(int(n or 0) for n in pipe.execute())


def _starved(client: Any, uuids: list[str]) -> list[bool]:
    """Per GPU: nothing running and nothing waiting in its queue (what a deeper pipeline would fix; the
    rest of a GPU's idle time is its worker's own per-step work)."""
    pipe = client.pipeline(transaction=False)
    for uuid in uuids:
        pipe.hget(keys.gpu(uuid), "current")
        pipe.llen(client.hget(keys.gpu(uuid), "queue") or "")
    replies = pipe.execute()
    return [not current and not queued for current, queued in zip(replies[::2], replies[1::2], strict=True)]


def _duty(work: Path, mode: str, gpus: int, candidates: int = 1, build_s: float = 20.0) -> dict[str, object]:
    """One duty-cycle run: per-GPU duty over the window, the kernels measured per (simulated) second in it,
    and the depths the coordinator chose in it (``build_s``: one build's simulated seconds)."""
    env = {
        "CROQQ_RUN_DIR": str(work / "run"),
        "CROQQ_RESULTS_REPO": str(work / "results"),
        "CROQQ_SIM_GPUS": str(gpus),
        "CROQQ_TIME_SCALE": repr(DUTY_TIME_SCALE),
        "CROQQ_SIM_IDEATE_S": repr(AGENT_MEDIAN_S),
        "CROQQ_SIM_IDEATE_SIGMA": repr(AGENT_SIGMA),
        "CROQQ_SIM_IMPLEMENT_S": repr(build_s),
        "CROQQ_SIM_MEASURE_S": "10",
        "CROQQ_SIM_PROFILE_S": "15",
        "CROQQ_PIPELINE_DEPTH_MODE": mode,
        "CROQQ_PIPELINE_DEPTH": str(FIXED_DEPTH),
        "CROQQ_IDEATE_CONCURRENCY": str(gpus * 80),  # an agent per shape: only the depth limits
        "CROQQ_BUILD_CONCURRENCY": str(4 * gpus),
        "CROQQ_BUILD_POOL": "threads",
    }
    with LocalCluster(env, log_level="WARNING") as cluster:
        cluster.wait_gpus()
        cluster.submit("all", max_iter=30, candidates=candidates)
        client = cluster.client
        uuids = sorted(client.smembers(keys.GPUS))
        time.sleep(DUTY_WARMUP_S[mode])
        t0, before = _busy_now(client, uuids)
        kernels0 = _measured(client, uuids)
        seen: list[list[int]] = []
        idle = [0] * len(uuids)
        while clock.now(client) - t0 < DUTY_WINDOW_S:
            seen.append([depth.current(client, u) for u in uuids])
            for i, starved in enumerate(_starved(client, uuids)):
                idle[i] += starved
            time.sleep(1.0)
        t1, after = _busy_now(client, uuids)
        kernels = _measured(client, uuids) - kernels0
    duty = [round((a - b) / (t1 - t0), 4) for a, b in zip(after, before, strict=True)]
    log.info("duty cycle, %s depth: %s (depths %s)", mode, duty, seen[-1])
    return {
        "mean": round(sum(duty) / len(duty), 4),
        "measurements_per_s": round(kernels / ((t1 - t0) / DUTY_TIME_SCALE), 4),
        "per_gpu": duty,
        "depths": seen[-1],
        "depth_range": [min(min(d) for d in seen), max(max(d) for d in seen)],
        "starved": [round(n / len(seen), 3) for n in idle],
    }


def duty_cycle(work: Path, gpus: int = DUTY_GPUS) -> dict[str, object]:
    """Fixed depth (today's default) and adaptive depth, the same cluster in the same run; and adaptive
    depth with ``DUTY_CANDIDATES`` candidates per iteration (a MEASURE is then a batch that holds the GPU
    that many times as long, and an IDEATE that many agent calls in parallel)."""
    fixed = _duty(work / "fixed", "fixed", gpus)
    adaptive = _duty(work / "adaptive", "adaptive", gpus)
    batch = _duty(work / "candidates", "adaptive", gpus, candidates=DUTY_CANDIDATES)
    return {
        "duty_cycle": adaptive["mean"],
        "duty_cycle_fixed_depth": fixed["mean"],
        f"duty_cycle_candidates_{DUTY_CANDIDATES}": batch["mean"],
        f"duty_candidates_{DUTY_CANDIDATES}_per_gpu": batch["per_gpu"],
        f"duty_candidates_{DUTY_CANDIDATES}_depths": batch["depths"],
        f"duty_candidates_{DUTY_CANDIDATES}_starved": batch["starved"],
        "duty_measurements_per_s": adaptive["measurements_per_s"],
        f"duty_measurements_per_s_candidates_{DUTY_CANDIDATES}": batch["measurements_per_s"],
        "duty_adaptive_per_gpu": adaptive["per_gpu"],
        "duty_fixed_per_gpu": fixed["per_gpu"],
        "duty_adaptive_depths": adaptive["depths"],
        "duty_adaptive_depth_range": adaptive["depth_range"],
        "duty_adaptive_starved": adaptive["starved"],
        "duty_fixed_starved": fixed["starved"],
        "duty_fixed_depth": FIXED_DEPTH,
        "duty_agent_think_s": f"lognormal, median {AGENT_MEDIAN_S:g} s, p90 {AGENT_P90_S:g} s",
        "duty_time_scale": DUTY_TIME_SCALE,
    }


def duty_compile(work: Path, gpus: int = DUTY_GPUS, build_s: float = CUTLASS_COMPILE_S) -> dict[str, object]:
    """Fixed and adaptive depth, the same cluster in the same run, each build taking ``build_s``."""
    fixed = _duty(work / "fixed", "fixed", gpus, build_s=build_s)
    adaptive = _duty(work / "adaptive", "adaptive", gpus, build_s=build_s)
    return {
        "duty_compile_build_s": build_s,
        "duty_compile_adaptive": adaptive["mean"],
        "duty_compile_fixed_depth": fixed["mean"],
        "duty_compile_adaptive_per_gpu": adaptive["per_gpu"],
        "duty_compile_fixed_per_gpu": fixed["per_gpu"],
        "duty_compile_adaptive_depth_range": adaptive["depth_range"],
        "duty_compile_adaptive_starved": adaptive["starved"],
        "duty_compile_fixed_starved": fixed["starved"],
    }


def recovery(work: Path, ttl_s: float = 10.0) -> dict[str, object]:
    """Kill each worker kind once mid-step (default lease TTL) and time until its step is finished
    elsewhere; Celery alone would redeliver only after the visibility timeout."""
    from kombu.transport.redis import Channel

    from croqq.chaos.faults import KILLS
    from croqq.chaos.stress import StressConfig, run

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
        "recovery_kill_target_s": 2 * ttl_s,  # a killed step is finished elsewhere within 2x the lease TTL
        "recovery_rounds_lost": summary["rounds_lost"],
        "recovery_duplicates": summary["duplicates"],
        "celery_visibility_timeout_s": Channel.visibility_timeout,  # kombu's default, for Celery alone
    }
