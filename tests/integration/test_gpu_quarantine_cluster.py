"""Real GPU worker processes (supervised `croqq gpu-worker`, beat and a coordinator): a faulty GPU starts
quarantined, stays quarantined when its worker is killed and restarted, and is lifted by the re-check only
once its cool-down is over."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
import redis

from croqq.placement import registry
from croqq.probes.sim import SimProbe, clear_faults, inject_fault
from croqq.processes.local import LocalCluster

pytestmark = pytest.mark.slow
COOLDOWN_S = 8.0


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def redis_now(client: redis.Redis) -> float:
    sec, usec = client.time()
    return float(sec + usec / 1e6)


def test_a_faulty_gpu_starts_quarantined_survives_a_worker_restart_and_returns_after_its_cooldown(
    cluster_env: dict[str, str], redis_client: redis.Redis
) -> None:
    sick = SimProbe(count=2).discover()[0].uuid
    inject_fault(redis_client, sick, "xid", value=79)
    env = {**cluster_env, "CROQQ_PROBE": "sim", "CROQQ_QUARANTINE_COOLDOWN_S": str(COOLDOWN_S)}
    roles = {"coordinator": ["coordinator"], "beat": ["beat"]}
    with LocalCluster(env, roles=roles) as cluster:
        cluster.wait_gpus()
        first = registry.get_gpu(redis_client, sick)
        assert first is not None and first.status == registry.QUARANTINED
        assert first.reason == "failed its health check at start: XID error(s) [79]"
        clear_faults(redis_client, sick)

        assert cluster.supervisor is not None
        cluster.supervisor.signal("gpu0", signal.SIGKILL)

        def restarted() -> bool:
            entry = registry.get_gpu(redis_client, sick)
            return entry is not None and entry.owner != first.owner

        wait_for("gpu0's worker to start again", restarted)
        again = registry.get_gpu(redis_client, sick)
        assert again is not None and redis_now(redis_client) - first.quarantined_at < COOLDOWN_S
        assert (again.status, again.reason, again.quarantined_at) == (
            registry.QUARANTINED,
            first.reason,
            first.quarantined_at,
        )

        def healthy() -> bool:
            entry = registry.get_gpu(redis_client, sick)
            return entry is not None and entry.status == registry.HEALTHY

        wait_for("the re-check to lift the quarantine", healthy, timeout_s=COOLDOWN_S + 30)
        assert redis_now(redis_client) - first.quarantined_at >= COOLDOWN_S
