"""Many hosts, one clock and unique identities: deadlines and liveness use Redis's clock, never a worker's
wall clock; owner tokens say which PID namespace their pid belongs to (hostnames are labels)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import redis

from croqq.delivery import clock, keys, leases
from croqq.delivery.clock import RedisClock
from croqq.delivery.queues import gpu_queue
from croqq.processes.app import MAX_AGE_HEADER, SENT_HEADER, max_age, too_old

SKEW_S = 90.0


def redis_time(client: redis.Redis) -> float:
    sec, usec = client.time()
    return sec + usec / 1e6


def assert_read_between(value: float, lo: float, hi: float) -> None:
    """``value`` is Redis's time read between the Redis times ``lo`` and ``hi``: the clock puts a reading
    half a round trip back, so it may fall short of ``lo`` by at most the window itself (however loaded
    the machine), and never pass ``hi``."""
    assert lo - (hi - lo) - 0.01 <= value <= hi + 0.01, (lo, value, hi)


@pytest.fixture
def skewed_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """This 'host' runs 90 s ahead (what libfaketime does to a whole host in the multi-host tests)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW_S)


def test_the_clock_is_redis_time_whatever_the_wall_clock_says(
    redis_client: redis.Redis, skewed_wall_clock: None
) -> None:
    assert abs(time.time() - redis_time(redis_client)) > SKEW_S / 2  # the skew is real
    lo = redis_time(redis_client)
    fresh = RedisClock(redis_client).now()
    assert_read_between(fresh, lo, redis_time(redis_client))
    # the shared clock may carry an earlier reading forward: far nearer Redis's time than the wall clock,
    # and pipelines share it
    assert abs(clock.now(redis_client) - redis_time(redis_client)) < SKEW_S / 3
    assert abs(clock.now(redis_client.pipeline()) - redis_time(redis_client)) < SKEW_S / 3


def test_the_clock_carries_on_through_a_partition_and_fails_before_its_first_reading(
    redis_client: redis.Redis,
) -> None:
    ticking = RedisClock(redis_client, resync_s=0.0)  # reads Redis on every call while it can
    t0 = time.monotonic()
    first = ticking.now()
    ticking.client = redis.Redis(port=1, socket_connect_timeout=0.2)  # Redis unreachable from here
    later = ticking.now()
    t1 = time.monotonic()
    assert first <= later <= first + (t1 - t0) + 1e-3  # carried forward by this host's monotonic clock
    never_read = RedisClock(redis.Redis(port=1, socket_connect_timeout=0.2))
    with pytest.raises(redis.ConnectionError):
        never_read.now()


def test_a_step_lease_deadline_is_on_redis_time_on_a_host_whose_clock_is_ahead(
    redis_client: redis.Redis, skewed_wall_clock: None
) -> None:
    from croqq.delivery.ledger import Ledger

    lo = redis_time(redis_client)
    ledger = Ledger(redis_client, 10.0, advance=SimpleNamespace())  # type: ignore[arg-type]
    redis_client.hset(
        keys.step("s#1"), mapping={"status": "queued", "epoch": "0", "kind": "measure", "sid": "s"}
    )
    assert ledger.claim("s#1", 0, "me", "measure", "s")[0] == "ok"
    hi = redis_time(redis_client)
    deadline = float(redis_client.zscore(keys.RUNNING, "s#1") or 0)
    assert_read_between(deadline - 10.0, lo, hi)
    assert ledger.expire_leases() == 0  # another host checking it sees a live lease, not one 90 s old


def test_owner_tokens_name_their_pid_namespace() -> None:
    owner = leases.owner_id("gpu")
    host, pid, space, token, tag = owner.split(":")
    assert host  # a label for people
    assert (pid, space, tag) == (str(os.getpid()), leases.process_space(), "gpu")
    assert len(token) == 8 and token != leases.owner_id("gpu").split(":")[3]


def test_only_a_dead_process_of_this_pid_namespace_counts_as_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    space = leases.process_space()
    assert leases.dead_local(f"anyhost:{child.pid}:{space}:abcd1234")  # the host name plays no part
    assert not leases.dead_local(f"anyhost:{os.getpid()}:{space}:abcd1234")  # alive
    # the same pid in another container (another PID namespace) on a host of the same name: not ours
    assert not leases.dead_local(f"anyhost:{child.pid}:0badf00d:abcd1234")
    assert not leases.dead_local(f"anyhost:{child.pid}:abcd1234")  # an old token says no namespace


def test_a_gpu_queue_is_named_by_its_uuid_alone() -> None:
    assert gpu_queue("GPU-1234") == "gpu.GPU-1234"


def test_a_message_past_its_maximum_age_is_skipped_on_redis_time(
    redis_client: redis.Redis, skewed_wall_clock: None
) -> None:
    limit = max_age(60.0)["headers"][MAX_AGE_HEADER]  # type: ignore[index]
    now = redis_time(redis_client)
    fresh = SimpleNamespace(**{MAX_AGE_HEADER: limit, SENT_HEADER: now - 1.0})
    stale = SimpleNamespace(**{MAX_AGE_HEADER: limit, SENT_HEADER: now - 120.0})
    assert not too_old(fresh, redis_client)  # a wall clock 90 s ahead would have dropped it
    assert too_old(stale, redis_client)
    assert not too_old(SimpleNamespace(), redis_client)  # not stamped: always run
