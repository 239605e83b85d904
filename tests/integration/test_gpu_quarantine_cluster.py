"""Real GPU worker processes (supervised `croqq gpu-worker`, beat and a coordinator): a faulty GPU starts
quarantined, stays quarantined when its worker is killed and restarted, and is lifted by the re-check only
once its cool-down is over."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from croqq.delivery import keys
from croqq.patience import wait_until
from croqq.placement import registry
from croqq.probes.sim import SimProbe, clear_faults, inject_fault
from croqq.processes.local import LocalCluster

pytestmark = pytest.mark.slow
COOLDOWN_S = 600.0  # longer than any restart takes; the test ends it on Redis's clock
RECHECK_EVERY_S = 2.0  # cluster_env's CROQQ_RECHECK_EVERY_S


def rewind_quarantine(client: redis.Redis, uuid: str, seconds: float) -> None:
    """Let ``seconds`` of the cool-down pass: move the stored quarantine time back (Redis's clock)."""
    sec, usec = client.time()
    client.hset(keys.gpu(uuid), "quarantined_at", repr(sec + usec / 1e6 - seconds))


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
        clear_faults(redis_client, sick)  # healthy again: only the cool-down keeps it out now

        assert cluster.supervisor is not None
        cluster.supervisor.signal("gpu0", signal.SIGKILL)

        def restarted() -> registry.GpuEntry | None:
            entry = registry.get_gpu(redis_client, sick)
            return entry if entry is not None and entry.owner != first.owner else None

        wait_until(restarted, 180, "gpu0's worker to start again")
        time.sleep(2 * RECHECK_EVERY_S)  # at least: re-checks ran while it cools down
        again = registry.get_gpu(redis_client, sick)
        assert again is not None
        assert (again.status, again.reason, again.quarantined_at) == (
            registry.QUARANTINED,
            first.reason,
            first.quarantined_at,
        )

        rewind_quarantine(redis_client, sick, COOLDOWN_S + 0.1)  # the cool-down is over

        def healthy() -> bool:
            entry = registry.get_gpu(redis_client, sick)
            return entry is not None and entry.status == registry.HEALTHY

        wait_until(healthy, 180, "the re-check to lift the quarantine")
