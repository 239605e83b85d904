"""Recovery after a SIGKILL of the embedded Redis under the supervisor (`croqq up`'s LocalCluster).

A small simulated cluster tunes a submission while its Redis is SIGKILLed a few times, each once progress
has resumed. Per kill: ``redis_back_s`` (until the restarted server answers PING) and ``redis_recovery_s``
(until the cluster stores its next iteration). The submission must still finish with nothing lost or
duplicated (``appendfsync always``)."""

from __future__ import annotations

import logging
import signal
import statistics
import time
from pathlib import Path

from croqq.chaos.invariants import repo_problems, stored_iterations
from croqq.delivery import keys
from croqq.processes.local import REDIS, LocalCluster
from croqq.processes.supervise import RESTART_BACKOFF_S, STABLE_S
from tests.localenv import run_dirs

log = logging.getLogger(__name__)
SHAPES, MAX_ITER = 48, 30
SETTLE_S = STABLE_S + 2.0  # each kill is a first crash: the supervisor restarts at its shortest backoff
RECOVERY_TIMEOUT_S = 120.0


def _env(work: Path, ttl_s: float) -> dict[str, str]:
    return {
        "CROQQ_BROKER_URL": "",
        **run_dirs(work),
        "CROQQ_SIM_GPUS": "4",
        "CROQQ_PIPELINE_DEPTH": "4",
        "CROQQ_LEASE_TTL_S": str(ttl_s),
        "CROQQ_RECONCILE_EVERY_S": str(min(1.0, ttl_s / 5)),
        "CROQQ_HEALTH_WAIT_S": str(min(3.0, ttl_s / 2)),
        "CROQQ_RECHECK_EVERY_S": str(ttl_s),
        "CROQQ_GPU_OFFLINE_S": str(6 * ttl_s),
        "CROQQ_TIME_SCALE": "0",
    }


def _stored(cluster: LocalCluster) -> int:
    return int(cluster.client.hget(keys.STATS, "stored") or 0)


def _kill_once(cluster: LocalCluster) -> tuple[float, float]:
    """SIGKILL Redis; return (seconds until it answers again, seconds until the next iteration is stored)."""
    assert cluster.supervisor is not None and cluster.redis is not None
    killed_at = time.monotonic()
    cluster.supervisor.signal(REDIS, signal.SIGKILL)
    cluster.supervisor.children[REDIS].popen.wait()  # type: ignore[union-attr]
    while not cluster.redis.answers():
        time.sleep(0.01)
    back = time.monotonic() - killed_at
    baseline = _stored(cluster)
    deadline = killed_at + RECOVERY_TIMEOUT_S
    while _stored(cluster) <= baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    return back, time.monotonic() - killed_at


def redis_restart(work: Path, kills: int = 4, ttl_s: float = 10.0) -> dict[str, object]:
    back: list[float] = []
    recovery: list[float] = []
    with LocalCluster(_env(work, ttl_s), log_level="WARNING") as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=MAX_ITER, limit=SHAPES)
        for i in range(kills):
            time.sleep(SETTLE_S)
            if cluster.snapshot(sub).finished:
                log.warning("the submission finished after %d of %d Redis kills", i, kills)
                break
            up_s, resumed_s = _kill_once(cluster)
            log.info("redis kill %d: answering after %.2fs, progress after %.2fs", i + 1, up_s, resumed_s)
            back.append(up_s)
            recovery.append(resumed_s)
        restarts = cluster.supervisor.children[REDIS].restarts if cluster.supervisor else 0
        cluster.wait_done(sub, timeout_s=900)
    repo = work / "results"
    rows = stored_iterations(repo)
    return {
        "redis_lease_ttl_s": ttl_s,
        "redis_restart_backoff_s": RESTART_BACKOFF_S[0],
        "redis_kills": len(recovery),
        "redis_restarts": restarts,
        "redis_back_s": [round(s, 2) for s in back],
        "redis_recovery_s": [round(s, 2) for s in recovery],
        "redis_recovery_p50_s": round(statistics.median(recovery), 2) if recovery else None,
        "redis_recovery_max_s": round(max(recovery), 2) if recovery else None,
        "redis_rounds_expected": SHAPES * (MAX_ITER + 1),
        "redis_rounds_lost": max(0, SHAPES * (MAX_ITER + 1) - len(rows)),
        "redis_duplicates": sum(n - 1 for n in rows.values() if n > 1),
        "redis_repo_problems": len(repo_problems(repo)),
    }
