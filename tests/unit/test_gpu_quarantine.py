"""A GPU worker checks its GPU's health before it takes work, and a quarantine outlives worker restarts:
only a passing re-check once the cool-down is over, or `croqq gpu release`, puts the GPU back in service.

The workers here are the start-up half of `croqq gpu-worker` (`claim_gpu`: lease, health check in a spawned
process, registry, placement) without the Celery consumer; faults are injected into the simulated probe
through the test's Redis, where the spawned check reads them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from croqq.delivery import keys
from croqq.delivery.leases import Lease
from croqq.delivery.messages import SubmitMessage
from croqq.domain.schedule import build_schedule
from croqq.placement import registry
from croqq.probes.sim import SimProbe, clear_faults, inject_fault
from croqq.processes.boot import claim_gpu
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.processes.startcheck import start_problems
from croqq.settings import Settings
from croqq.work import housekeeping
from tests.output import error_line

Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture
GPU_TYPE = "sm90_Simulated_H100_SXM"
SICK, WELL = (g.uuid for g in SimProbe(count=2).discover())
COOLDOWN_S = 600.0  # long: the steps of a test never outlast it on a loaded machine
XID_REASON = "failed its health check at start: XID error(s) [79]"


@pytest.fixture
def rt(redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    settings = Settings(
        broker_url=redis_server.url,
        probe="sim",
        sim_gpus=2,
        pipeline_depth=2,
        lease_ttl_s=600.0,  # the test's workers hold their GPU leases without a heartbeat
        quarantine_cooldown_s=COOLDOWN_S,
        run_dir=tmp_path / "run",
        results_repo=tmp_path / "results",
    )
    yield Runtime(settings, publisher=lambda records, pipe: None)


def submit(rt: Runtime, shapes: int) -> None:
    msg = SubmitMessage(
        submission="s1",
        gpu_type=GPU_TYPE,
        dsl="cuda",
        mode="from_current_best",
        max_iter=3,
        shapes=build_schedule(rt.manifest, "f16")[:shapes],
    )
    rt.intake.submit(msg)


def start_worker(rt: Runtime, uuid: str) -> Lease:
    lease, _ = claim_gpu(rt.settings, uuid, int(uuid.rsplit("-", 1)[1]), GPU_TYPE, rt.placement)
    return lease


def gpu(rt: Runtime, uuid: str) -> registry.GpuEntry:
    entry = registry.get_gpu(rt.client, uuid)
    assert entry is not None
    return entry


def shapes_on(rt: Runtime, uuid: str) -> int:
    return int(rt.client.scard(keys.active(uuid)))


def pending(rt: Runtime) -> int:
    return int(rt.client.zcard(keys.pending(GPU_TYPE)))


def rewind_quarantine(rt: Runtime, uuid: str, seconds: float) -> None:
    """Let ``seconds`` of the cool-down pass: move the stored quarantine time back (Redis's clock)."""
    sec, usec = rt.client.time()
    rt.client.hset(keys.gpu(uuid), "quarantined_at", repr(sec + usec / 1e6 - seconds))


def test_a_gpu_failing_its_start_check_is_quarantined_gets_no_shapes_and_stays_so_across_restarts(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    submit(rt, 3)
    inject_fault(redis_client, SICK, "xid", value=79)
    sick = start_worker(rt, SICK)
    entry = gpu(rt, SICK)
    assert (entry.status, entry.reason) == (registry.QUARANTINED, XID_REASON)
    assert entry.quarantined_at > 0 and entry.owner == sick.owner
    assert shapes_on(rt, SICK) == 0 and pending(rt) == 3
    start_worker(rt, WELL)
    assert gpu(rt, WELL).status == registry.HEALTHY
    assert (shapes_on(rt, WELL), shapes_on(rt, SICK), pending(rt)) == (2, 0, 1)

    clear_faults(redis_client, SICK)  # healthy again, but the quarantine stays until a re-check lifts it
    sick.release()
    start_worker(rt, SICK)
    again = gpu(rt, SICK)
    assert (again.status, again.reason, again.quarantined_at) == (
        registry.QUARANTINED,
        XID_REASON,
        entry.quarantined_at,
    )
    assert shapes_on(rt, SICK) == 0 and pending(rt) == 1
    assert redis_client.hget(keys.STATS, "quarantines") == "1"


def test_a_quarantined_gpu_comes_back_only_after_its_cooldown(
    rt: Runtime, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from croqq.processes.app import app

    sent: list[str] = []
    monkeypatch.setattr(app, "send_task", lambda name, args, **kw: sent.append(args[0]["gpu_uuid"]))
    inject_fault(redis_client, SICK, "overheat")
    start_worker(rt, SICK)
    submit(rt, 2)
    clear_faults(redis_client, SICK)
    assert housekeeping.recheck_quarantined(rt) == 0 and sent == []  # cooling down: not even probed
    assert housekeeping.recheck_gpu(rt, SICK) is False
    assert gpu(rt, SICK).status == registry.QUARANTINED and pending(rt) == 2

    rewind_quarantine(rt, SICK, COOLDOWN_S - 300)  # 300 s of cool-down left
    assert housekeeping.recheck_gpu(rt, SICK) is False and gpu(rt, SICK).status == registry.QUARANTINED
    rewind_quarantine(rt, SICK, COOLDOWN_S + 0.1)
    inject_fault(redis_client, SICK, "busy")  # cool-down over, but still unhealthy
    assert housekeeping.recheck_gpu(rt, SICK) is False and gpu(rt, SICK).status == registry.QUARANTINED
    clear_faults(redis_client, SICK)
    assert housekeeping.recheck_quarantined(rt) == 1 and sent == [SICK]
    assert housekeeping.recheck_gpu(rt, SICK) is True
    entry = gpu(rt, SICK)
    assert (entry.status, entry.reason, entry.quarantined_at) == (registry.HEALTHY, "", 0.0)
    assert shapes_on(rt, SICK) == 2 and pending(rt) == 0


def test_the_cooldown_runs_on_redis_clock(redis_client: redis.Redis) -> None:
    import time

    registry.register_gpu(
        redis_client, registry.GpuEntry(uuid="GPU-a", host="h", index=0, gpu_type=GPU_TYPE, queue="q")
    )
    registry.set_status(redis_client, "GPU-a", registry.QUARANTINED, "XID 79")
    assert registry.lift_quarantine(redis_client, "GPU-a", 600.0) is False
    registry.set_status(
        redis_client, "GPU-a", registry.QUARANTINED, "XID 48"
    )  # still quarantined: same clock
    time.sleep(0.35)
    assert registry.lift_quarantine(redis_client, "GPU-a", 0.3) is True
    assert registry.lift_quarantine(redis_client, "GPU-a", 0.0) is False  # not quarantined any more


def test_an_offline_gpu_comes_back_healthy_and_a_quarantined_one_is_not_marked_offline(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    start_worker(rt, WELL).release()
    rt.placement.quarantine(WELL, "its worker is gone", status=registry.OFFLINE)
    inject_fault(redis_client, SICK, "ecc")
    start_worker(rt, SICK).release()
    for uuid in (WELL, SICK):
        rt.client.hset(keys.gpu(uuid), "missing_since", "1")  # both workers gone for long
    assert rt.placement.release_offline_gpus() == 0
    assert gpu(rt, SICK).status == registry.QUARANTINED
    submit(rt, 1)
    start_worker(rt, WELL)
    assert gpu(rt, WELL).status == registry.HEALTHY and shapes_on(rt, WELL) == 1


def test_croqq_status_shows_the_quarantine_and_croqq_gpu_release_ends_it_at_once(
    rt: Runtime, redis_client: redis.Redis, cluster_env: dict[str, str], croqq: Cli
) -> None:
    inject_fault(redis_client, SICK, "stuck")
    start_worker(rt, SICK)
    submit(rt, 2)
    assert shapes_on(rt, SICK) == 0
    status = croqq({**cluster_env, "COLUMNS": "250"}, "status")
    assert "quarantined: failed its health check at start: GPU is not responding" in status.stdout
    result = croqq(cluster_env, "gpu", "release", SICK)
    assert result.returncode == 0, result.stderr
    assert (
        f"released GPU {SICK} from quarantine (failed its health check at start: GPU is not" in result.stdout
    )
    assert f"GPU {SICK} now holds 2 shape(s)" in result.stdout
    assert gpu(rt, SICK).status == registry.HEALTHY and shapes_on(rt, SICK) == 2


def test_croqq_gpu_release_refuses_an_unknown_or_offline_gpu_with_one_line(
    rt: Runtime, cluster_env: dict[str, str], croqq: Cli
) -> None:
    start_worker(rt, WELL).release()
    unknown = croqq(cluster_env, "gpu", "release", "GPU-nope")
    assert unknown.returncode == 2
    assert error_line(unknown.stderr) == f"croqq: error: no GPU 'GPU-nope' in the registry (known: {WELL})"
    rt.placement.quarantine(WELL, "its worker is gone", status=registry.OFFLINE)
    offline = croqq(cluster_env, "gpu", "release", WELL)
    assert offline.returncode == 2
    assert f"GPU {WELL} is offline, not quarantined" in error_line(offline.stderr), offline.stderr


def test_the_start_check_probes_in_a_child_process_and_one_that_fails_counts_as_unhealthy(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    code = (
        "import sys\nfrom croqq.settings import Settings\n"
        "from croqq.processes.startcheck import start_problems\n"
        f"s = Settings(broker_url={rt.settings.broker_url!r}, probe='sim', sim_gpus=2)\n"
        f"print(start_problems(s, {SICK!r})); print([m for m in sys.modules if m.startswith('croqq.probes')])"
    )
    inject_fault(redis_client, SICK, "throttle")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=180
    )
    assert out.stdout.splitlines() == ["['clocks throttled (sw_power_cap)']", "[]"]  # no probe in the caller
    assert start_problems(rt.settings, "GPU-nope") == [
        "the health check failed: ConfigError: no simulated GPU 'GPU-nope' on this host "
        f"(it has {SICK} ... {WELL})"
    ]
    assert start_problems(rt.settings, SICK, timeout_s=0.01) == [
        "the health check did not answer within 0.01s"
    ]
