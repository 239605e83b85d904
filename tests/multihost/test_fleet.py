"""croqq on five hosts that share nothing but a network: Redis, the writer, a build host, two GPU hosts
(:mod:`tests.hostbed.fleet`). Each test boots a fresh fleet, submits a small sweep from the build host (which
has no results repo), and checks what the fleet promises: every iteration stored exactly once, `git fsck`
clean, measured on a GPU host, built on the build host, and no results repo anywhere but the writer's.
The fault tests inject one fault each at a chosen moment (most of them mid-step) and check that the fleet
finishes with nothing lost or stored twice. Recovery times are printed here and measured by the hosts
benchmark (``python -m benchmarks --only hosts``) beside their targets: a test asserts that recovery
happens (the scenario fails if no affected shape stores again), never how fast."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from croqq.delivery import keys
from croqq.placement import registry
from tests.hostbed import faults
from tests.hostbed.bed import bed_available, faketime_available
from tests.hostbed.fleet import GPU_HOSTS, Fleet, FleetConfig

REASON = bed_available()
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"host bed unavailable: {REASON}"),
]


@pytest.fixture
def fleet_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="cqfleet-"))
    yield root
    if os.environ.get("CROQQ_KEEP_BED") is None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def fleet_for(root: Path, **config: object) -> Fleet:
    return Fleet(root, "fleet", FleetConfig(**config))  # type: ignore[arg-type]


def assert_kept_promises(fleet: Fleet, outcome_sub: str, max_iter: int) -> None:
    assert fleet.problems(outcome_sub, max_iter) == []
    assert fleet.gpus_measured() <= {u for h in GPU_HOSTS for u in fleet.gpu_uuids(h)}


def test_a_sweep_on_five_hosts_stores_every_iteration_once_measured_on_gpu_hosts(fleet_root: Path) -> None:
    # a lease TTL a busy machine cannot outlast between two beats: no fault, so no lease may expire
    with fleet_for(fleet_root, lease_ttl_s=30.0, gpu_offline_s=120.0) as fleet:
        sub = fleet.submit(max_iter=4, limit=8)
        snap = fleet.wait_done(sub)
        assert (snap.total.done, snap.total.iters_done) == (8, 40)
        assert_kept_promises(fleet, sub, 4)
        stats = fleet.client.hgetall(keys.STATS)
        # every kernel was built on the build host and fetched by a GPU host through Redis, by content
        assert int(stats["artifact_bytes_put"]) > 0 and int(stats["artifact_bytes_got"]) > 0
        builds = (fleet.bed.host("build").log_dir / "build-worker.log").read_text()
        assert builds.count(" implement done -> MEASURE") >= 8 * 4  # a build per candidate
        gpu_logs = "".join(p.read_text() for h in GPU_HOSTS for p in fleet.bed.host(h).dir.rglob("*.log"))
        assert gpu_logs.count(" measure done -> STORE") >= 8 * 4  # measured on the GPU hosts
        assert " implement done" not in gpu_logs  # a GPU host never builds
        assert int(stats.get("redispatch", 0)) == 0  # no lease expired on a healthy fleet


def test_a_gpu_host_partitioned_mid_measure_comes_back_and_its_late_results_are_refused(
    fleet_root: Path,
) -> None:
    with fleet_for(fleet_root) as fleet:
        out = faults.partition_gpu_host(fleet)
        assert_kept_promises(fleet, out.submission, out.max_iter)
        print(
            f"partition: recovery {out.recovery_s:.2f}s from the fault, {out.from_heal_s:.2f}s from the heal"
        )
        # the step it held was re-dispatched with a new epoch while it was away: its own result is stale
        assert any(
            out.seen["during"][s] != out.seen["steps"][s] or out.seen["epochs"][s] > 0 for s in out.affected
        )  # type: ignore[index]
        assert int(fleet.client.hget(keys.STATS, "redispatch") or 0) >= 1


def test_every_process_of_a_gpu_host_killed_at_once(fleet_root: Path) -> None:
    with fleet_for(fleet_root) as fleet:
        out = faults.kill_host(fleet, "gpu1")
        assert_kept_promises(fleet, out.submission, out.max_iter)
        print(f"kill a GPU host: recovery {out.recovery_s:.2f}s")


def test_the_writer_partitioned_from_redis_for_30s_loses_nothing(fleet_root: Path) -> None:
    with fleet_for(fleet_root) as fleet:
        out = faults.partition_writer(fleet, hold_s=30.0)
        assert_kept_promises(fleet, out.submission, out.max_iter)  # in order: contiguous, once each
        print(f"writer partition: recovery {out.from_heal_s:.2f}s after the heal")
        assert out.seen["stored_during"] == 0  # nothing could be stored without the writer


@pytest.mark.skipif(faketime_available() is not None, reason=f"libfaketime: {faketime_available()}")
def test_a_gpu_host_whose_clock_is_90s_ahead_progresses_and_its_steps_expire_on_time(
    fleet_root: Path,
) -> None:
    with fleet_for(fleet_root, faketime={"gpu2": "+90s"}) as fleet:
        honest = float(fleet.bed.host("gpu1").python("import time; print(time.time())").stdout)
        assert float(fleet.bed.host("gpu2").python("import time; print(time.time())").stdout) - honest > 80
        out = faults.skewed_gpu_host(fleet, "gpu2")
        assert_kept_promises(fleet, out.submission, out.max_iter)
        assert fleet.gpus_measured() & set(fleet.gpu_uuids("gpu2"))  # it did its share of the work
        # its lease deadlines are Redis time + TTL, not its own clock + TTL (90 s late to expire)
        assert out.seen["deadline_ahead_s"] <= fleet.config.lease_ttl_s + 1.0  # type: ignore[operator]
        print(f"skewed GPU host killed: recovery {out.recovery_s:.2f}s")


def test_a_gpu_worker_back_under_a_new_hostname_keeps_its_shapes(fleet_root: Path) -> None:
    # its GPUs count as offline (their shapes move elsewhere) only long after a slow restart
    with fleet_for(fleet_root, gpu_offline_s=600.0) as fleet:
        out = faults.kill_host(fleet, "gpu1", new_hostname="gpu1-recreated")
        assert_kept_promises(fleet, out.submission, out.max_iter)
        assert set(out.seen["gpu_hosts"].values()) == {"gpu1-recreated"}  # type: ignore[attr-defined]
        # the affected shapes finished on the same GPUs (by UUID), not migrated elsewhere
        for sid, state in fleet.shapes(out.affected).items():
            assert state.gpu_uuid in fleet.gpu_uuids("gpu1"), sid
        print(f"restart under a new hostname: recovery {out.recovery_s:.2f}s")


def test_a_second_worker_for_a_claimed_gpu_on_another_host_refuses(fleet_root: Path) -> None:
    # a lease the first worker keeps however busy the machine, while the second waits 1.5 TTLs for it
    with fleet_for(fleet_root, lease_ttl_s=15.0) as fleet:
        # gpu2 pretends to hold gpu1's GPUs (the same UUIDs): one worker per GPU, fleet-wide
        second = fleet.run("gpu2", "worker", "--gpus", "all", env={"CROQQ_SIM_MACHINE": "gpu1"})
        assert second.returncode == 2
        errors = [line for line in second.stderr.splitlines() if line.startswith("croqq: error:")]
        assert len(errors) == 1 and "GPU GPU-sim-gpu1-0" in errors[0] and "already claimed" in errors[0]
        assert "gpu1" in errors[0]  # names where the holder runs
        holders = {g.uuid: g.host for g in registry.all_gpus(fleet.client)}
        assert holders["GPU-sim-gpu1-0"] == "gpu1"  # the first worker keeps its GPU
