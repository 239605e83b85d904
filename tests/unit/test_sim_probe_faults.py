"""Injected faults make a simulated GPU unhealthy, for as long as they last, in-process and via Redis."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import redis

from croqq.delivery import keys
from croqq.errors import ConfigError, InvalidRecordError
from croqq.patience import wait_until
from croqq.probes.sim import FaultSource, MemoryFaults, RedisFaults, SimProbe, clear_faults, inject_fault
from croqq.processes.redis_server import RedisServer

HOST = "test-host"
GPU0 = f"GPU-sim-{HOST}-0"
GPU1 = f"GPU-sim-{HOST}-1"


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
def source(request: pytest.FixtureRequest, clock: FakeClock) -> FaultSource:
    """Each fault test runs against both fault sources."""
    if request.param == "memory":
        return MemoryFaults(clock=clock)
    return RedisFaults(request.getfixturevalue("redis_client"), clock=clock)


@pytest.fixture
def probe(source: FaultSource) -> SimProbe:
    return SimProbe(count=2, host=HOST, faults=source)


FAULT_PROBLEMS = [
    pytest.param("foreign_process", 1, ["foreign compute process(es) [70001]"], id="foreign_process"),
    pytest.param(
        "overheat", 1, ["temperature 92 C > 85 C", "clocks throttled (hw_thermal, sw_thermal)"], id="overheat"
    ),
    pytest.param("xid", 79, ["XID error(s) [79]"], id="xid"),
    pytest.param("ecc", 3, ["3 uncorrected ECC error(s)"], id="ecc"),
    pytest.param("throttle", 1, ["clocks throttled (sw_power_cap)"], id="throttle"),
    pytest.param(
        "busy", 1, ["utilization 100% > 10% while idle", "memory in use 61440 MiB > 2048 MiB"], id="busy"
    ),
    pytest.param("stuck", 1, ["GPU is not responding"], id="stuck"),
]


def problems_text(probe: SimProbe, uuid: str = GPU0) -> str:
    return "; ".join(probe.health(uuid).problems)


@pytest.mark.parametrize(("kind", "value", "expected"), FAULT_PROBLEMS)
def test_each_fault_makes_the_gpu_unhealthy_and_names_the_problem(
    probe: SimProbe, kind: str, value: int, expected: list[str]
) -> None:
    probe.faults.set(GPU0, kind, value=value)
    health = probe.health(GPU0)
    assert not health.ok
    for text in expected:
        assert text in "; ".join(health.problems)


def test_a_fault_spoils_only_its_own_gpu(probe: SimProbe) -> None:
    probe.faults.set(GPU0, "overheat")
    assert not probe.health(GPU0).ok
    assert probe.health(GPU1).ok


def test_faults_combine(probe: SimProbe) -> None:
    probe.faults.set(GPU0, "throttle")
    probe.faults.set(GPU0, "overheat")
    assert "clocks throttled (hw_thermal, sw_power_cap, sw_thermal)" in problems_text(probe)


def test_a_fault_with_a_duration_expires(probe: SimProbe, clock: FakeClock) -> None:
    probe.faults.set(GPU0, "ecc", seconds=30)
    clock.advance(29)
    assert not probe.health(GPU0).ok
    clock.advance(1)
    assert probe.health(GPU0).ok
    assert probe.faults.faults(GPU0) == {}


def test_a_fault_without_a_duration_lasts_until_cleared(probe: SimProbe, clock: FakeClock) -> None:
    probe.faults.set(GPU0, "busy")
    clock.advance(10 * 86400)
    assert not probe.health(GPU0).ok
    probe.faults.clear(GPU0)
    assert probe.health(GPU0).ok


def test_clearing_one_kind_keeps_the_others(probe: SimProbe) -> None:
    probe.faults.set(GPU0, "xid", value=48)
    probe.faults.set(GPU0, "foreign_process")
    probe.faults.clear(GPU0, "xid")
    assert set(probe.faults.faults(GPU0)) == {"foreign_process"}
    assert "XID" not in problems_text(probe)


def test_a_pending_hang_leaves_the_gpu_healthy_until_taken(probe: SimProbe) -> None:
    probe.faults.set(GPU0, "hang", seconds=60)
    assert probe.health(GPU0).ok
    assert probe.take_hang(GPU1) is False


def test_hang_is_one_shot_then_the_gpu_stops_responding_until_it_expires(
    probe: SimProbe, clock: FakeClock
) -> None:
    probe.faults.set(GPU0, "hang", seconds=60)
    clock.advance(20)
    assert probe.take_hang(GPU0) is True
    assert probe.take_hang(GPU0) is False
    reading = probe.read(GPU0)
    assert not reading.responsive
    assert "GPU is not responding" in problems_text(probe)
    clock.advance(39)
    assert not probe.health(GPU0).ok
    clock.advance(1)
    assert probe.health(GPU0).ok


def test_hang_without_a_duration_leaves_the_gpu_stuck_until_cleared(
    probe: SimProbe, clock: FakeClock
) -> None:
    probe.faults.set(GPU0, "hang")
    assert probe.take_hang(GPU0)
    clock.advance(3600)
    assert not probe.read(GPU0).responsive
    probe.faults.clear(GPU0)
    assert probe.read(GPU0).responsive


def test_an_expired_hang_is_not_taken(probe: SimProbe, clock: FakeClock) -> None:
    probe.faults.set(GPU0, "hang", seconds=5)
    clock.advance(5)
    assert probe.take_hang(GPU0) is False
    assert probe.health(GPU0).ok


def test_unknown_fault_kind_or_bad_duration_is_refused(probe: SimProbe) -> None:
    with pytest.raises(ConfigError, match="unknown simulated GPU fault 'melted'"):
        probe.faults.set(GPU0, "melted")
    with pytest.raises(ConfigError, match="> 0 seconds"):
        probe.faults.set(GPU0, "ecc", seconds=0)


def test_unknown_uuid_is_refused_by_take_hang(probe: SimProbe) -> None:
    with pytest.raises(ConfigError, match="GPU-sim-other-0"):
        probe.take_hang("GPU-sim-other-0")


def test_idle_readings_are_deterministic_and_plausible() -> None:
    one, two = SimProbe(host=HOST), SimProbe(host=HOST)
    readings = [one.read(GPU0) for _ in range(20)]
    assert readings == [two.read(GPU0) for _ in range(20)]
    assert {r.temp_c for r in readings} <= set(range(38, 46))
    assert len({r.temp_c for r in readings}) > 1
    assert all(r.sm_clock_mhz == 1980 and r.mem_clock_mhz == 2619 for r in readings)
    assert all(60 < r.power_w < 80 for r in readings)


def test_host_names_are_sanitized_into_the_uuid() -> None:
    probe = SimProbe(count=1, host="node_7.example.com")
    assert [gpu.uuid for gpu in probe.discover()] == ["GPU-sim-node-7-example-com-0"]


def test_a_bad_gpu_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="sm<digits>_<name>"):
        SimProbe(gpu_type="H100")


# -- Redis: faults shared by processes ---------------------------------------------------------------


def two_probes(redis_server: RedisServer, decode: bool = True) -> tuple[SimProbe, SimProbe]:
    """Two probes as two worker processes would have them: each with its own Redis connection."""
    return tuple(  # type: ignore[return-value]
        SimProbe(count=2, host=HOST, faults=RedisFaults(redis_server.client(decode))) for _ in range(2)
    )


def test_redis_faults_are_seen_by_every_probe_sharing_the_redis(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    worker, other = two_probes(redis_server)
    inject_fault(redis_client, GPU0, "xid", value=79)
    assert "XID error(s) [79]" in problems_text(worker)
    assert "XID error(s) [79]" in problems_text(other)
    clear_faults(redis_client, GPU0)
    assert worker.health(GPU0).ok
    assert other.health(GPU0).ok


def test_redis_hang_is_taken_by_exactly_one_probe(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    worker, other = two_probes(redis_server, decode=False)
    inject_fault(redis_client, GPU0, "hang", seconds=60)
    assert worker.health(GPU0).ok
    assert worker.take_hang(GPU0) is True
    assert other.take_hang(GPU0) is False
    assert not other.read(GPU0).responsive
    assert not worker.read(GPU0).responsive


def test_racing_takes_consume_a_hang_once(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    inject_fault(redis_client, GPU0, "hang")
    probes = [SimProbe(count=1, host=HOST, faults=RedisFaults(redis_server.client())) for _ in range(12)]
    barrier = threading.Barrier(len(probes))
    results: list[bool] = []

    def take(probe: SimProbe) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            results.append(probe.take_hang(GPU0))

        return run

    threads = [threading.Thread(target=take(probe)) for probe in probes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 11 + [True]


def test_redis_fault_expires_in_real_time(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    (worker, _) = two_probes(redis_server)
    inject_fault(redis_client, GPU0, "throttle", seconds=5)
    assert not worker.health(GPU0).ok
    time.sleep(5)  # at least the fault's lifetime
    wait_until(lambda: worker.health(GPU0).ok, 60, "the fault to expire")


def test_redis_fault_record_format(redis_client: redis.Redis, clock: FakeClock) -> None:
    RedisFaults(redis_client, clock=clock).set(GPU0, "ecc", seconds=10, value=2)
    RedisFaults(redis_client, clock=clock).set(GPU0, "busy")
    stored = redis_client.hgetall(keys.simfault(GPU0))
    assert stored == {
        "ecc": f'{{"until": {clock.now + 10}, "value": 2}}',
        "busy": '{"until": null, "value": 1}',
    }


def test_a_malformed_redis_fault_is_reported(redis_client: redis.Redis) -> None:
    redis_client.hset(keys.simfault(GPU0), "ecc", "yes please")
    with pytest.raises(InvalidRecordError, match="croqq:simfault:"):
        SimProbe(count=1, host=HOST, faults=RedisFaults(redis_client)).read(GPU0)


def test_the_simulated_probe_does_not_import_celery() -> None:
    code = "import sys, croqq.probes.sim; sys.exit('celery' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
