"""Redis full (``maxmemory`` reached under ``noeviction``): every write fails with OOM, reads still work.

A real cluster runs on its own Redis started with a small ``maxmemory``; mid-sweep the test fills that
Redis with junk keys until writes are refused, holds it at its limit for several lease TTLs (freeing a
little and filling it again, so that some writes pass and most fail), then deletes the junk. While Redis
is full croqq pauses instead of failing steps: no shape is parked as error and no step failure is counted
against a shape, no worker dies; ``croqq status`` and the logs say Redis is full. Once memory is freed
the sweep finishes by itself with every iteration stored exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from croqq.chaos.invariants import repo_problems
from croqq.delivery import keys
from croqq.delivery.memory import read_memory
from croqq.delivery.state import ShapeSummary
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.processes.redis_server import RedisServer
from tests.localenv import run_croqq

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(3600)]
SHAPES, ITERS = 4, 8
MAXMEMORY = 64 * 1024 * 1024
JUNK = "test:junk"
CHUNK = 256 * 1024
FULL_FOR_S = 12.0  # how long the fault lasts: several lease TTLs (3 s), so leases expire while full


class SmallRedis(RedisServer):
    """The product's Redis (``noeviction``) with a small ``maxmemory``."""

    def config(self) -> str:
        return super().config() + f"maxmemory {MAXMEMORY}\n"


@pytest.fixture
def small_redis(short_tmp: Path) -> Iterator[SmallRedis]:
    server = SmallRedis(short_tmp / "redis")
    server.start()
    yield server
    server.stop()


def fill(client: redis.Redis, first: int = 0) -> int:
    """Fill Redis with junk keys (``test:junk:<n>`` from ``first``) until it refuses one; returns the next n.
    The first key takes nearly all the room left in one command, so the sweep is still in flight once it is
    full; small keys fill the rest (the test frees and refills those while it holds Redis at its limit)."""
    if first == 0:
        memory = read_memory(client)
        client.setrange(f"{JUNK}:0", max(0, memory.max - memory.used - 4 * CHUNK), "x")
        first = 1
    n = first
    while True:
        try:
            client.set(f"{JUNK}:{n}", "x" * CHUNK)
        except redis.exceptions.OutOfMemoryError:
            return n
        n += 1


def stored(client: redis.Redis) -> int:
    return int(client.hget(keys.STATS, "stored") or 0)


def summaries(client: redis.Redis) -> dict[str, ShapeSummary]:
    return {sid: ShapeSummary.model_validate_json(v) for sid, v in client.hgetall(keys.SUMMARY).items()}


def step_failures(client: redis.Redis) -> int:
    """Failures counted against the steps Redis still knows (each step record's ``failures`` field)."""
    return sum(int(client.hget(k, "failures") or 0) for k in client.scan_iter(match=keys.step("*")))


def test_a_full_redis_pauses_the_sweep_and_it_resumes_when_memory_is_freed(
    cluster_env: dict[str, str], small_redis: SmallRedis
) -> None:
    env = cluster_env | {
        "CROQQ_BROKER_URL": small_redis.url,
        "CROQQ_SIM_GPUS": "2",
        "CROQQ_TIME_SCALE": "0.01",
        "CROQQ_TEST_BARRIERS": "false",
    }
    client = small_redis.client(retries=10)
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        cluster.submit("f16", max_iter=ITERS, limit=SHAPES)

        def started() -> bool:
            cluster.poll()
            return stored(client) >= 6

        wait_until(started, 300, "6 iterations stored before Redis fills up", every_s=0.1)
        junk = fill(client)
        full_at = time.monotonic()
        errors, failures = 0, 0
        while time.monotonic() - full_at < FULL_FOR_S:  # the fault's length, not an assertion
            cluster.poll()
            if junk > 1:  # Redis hovers at its limit: some writes pass, most fail
                client.delete(f"{JUNK}:{junk - 1}")
                junk = fill(client, junk - 1)
            shapes = summaries(client)
            errors = max(errors, sum(1 for s in shapes.values() if s.status == "error"))
            failures = max(failures, step_failures(client))
            time.sleep(0.5)
        status = run_croqq(env | {"COLUMNS": "250"}, "status")
        held = stored(client)
        assert held < SHAPES * (ITERS + 1), "the sweep finished before Redis was full"
        client.delete(*(f"{JUNK}:{n}" for n in range(junk)))
        freed_at = time.monotonic()

        def resumed() -> bool:
            cluster.poll()
            return stored(client) > held

        wait_until(resumed, 300, "an iteration stored after memory was freed", every_s=0.05)
        print(f"from freeing memory to the next stored iteration: {time.monotonic() - freed_at:.2f}s")

        def finished() -> dict[str, ShapeSummary] | None:
            cluster.poll()
            shapes = summaries(client)
            done = len(shapes) == SHAPES and all(s.status in ("done", "error") for s in shapes.values())
            return shapes if done else None

        shapes = wait_until(finished, 600, f"all {SHAPES} shapes done or parked", every_s=0.3)
    print(status.stdout)
    assert (errors, failures) == (0, 0)
    assert status.returncode == 0, status.stderr
    assert "redis_full" in status.stdout and "Redis is full (used_memory" in status.stdout, status.stdout
    logs = "".join(p.read_text() for p in (Path(env["CROQQ_RUN_DIR"]) / "logs").glob("*.log"))
    assert "Redis is full (used_memory" in logs and "Redis has room again: croqq resumes" in logs
    assert "Unrecoverable error" not in logs  # no worker died of it
    assert {s.status for s in shapes.values()} == {"done"}, {k: s.error for k, s in shapes.items()}
    assert all(s.current_iter == ITERS for s in shapes.values())
    assert repo_problems(Path(env["CROQQ_RESULTS_REPO"])) == []
