"""A full Redis (maxmemory reached under noeviction): recognised in every form it refuses a write, shown by
status and the exporter from INFO memory, and waited out (kombu's acks included) until memory is freed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import kombu
import pytest
import redis
from kombu.exceptions import OperationalError

import croqq.processes.app  # noqa: F401 - importing the app installs the transport
from croqq.delivery import memory
from croqq.delivery.redis_client import kombu_url
from croqq.monitor import metrics
from croqq.patience import wait_until
from croqq.settings import Settings
from croqq.work.progress import snapshot
from tests.localenv import run_dirs

JUNK = "croqq:test:junk"


@pytest.fixture
def full(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The session's Redis with a maxmemory just above what it uses, then filled past it (restored after)."""
    used = memory.read_memory(redis_client).used
    redis_client.config_set("maxmemory", used + 4 * 1024 * 1024)
    redis_client.setrange(JUNK, 4 * 1024 * 1024, "x")
    yield redis_client
    redis_client.config_set("maxmemory", 0)
    redis_client.config_set("maxmemory-policy", memory.NOEVICTION)
    redis_client.flushall()


def refused(fn: object) -> BaseException:
    try:
        fn()  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("a full Redis accepted the write")


def test_every_kind_of_refused_write_is_recognised_as_redis_full(full: redis.Redis) -> None:
    command = refused(lambda: full.set("croqq:test:k", "v"))
    in_multi = refused(lambda: full.pipeline().get("croqq:test:k").set("croqq:test:k", "v").execute())
    script = refused(lambda: full.eval("return redis.call('SET', KEYS[1], 'v')", 1, "croqq:test:k"))
    try:
        raise OperationalError("publish failed") from command  # how kombu wraps it
    except OperationalError as exc:
        wrapped = exc
    for exc in (command, in_multi, script, wrapped):
        assert memory.is_full_error(exc), repr(exc)
    assert not memory.is_full_error(redis.exceptions.ConnectionError("Connection refused"))
    assert not memory.is_full_error(redis.exceptions.ResponseError("WRONGTYPE Operation against a key"))
    assert full.get(JUNK) is not None  # reads still work


def test_status_and_the_exporter_say_redis_is_full_and_what_to_do(full: redis.Redis) -> None:
    expected = "croqq pauses; free memory or raise maxmemory"
    (alarm,) = [a for a in snapshot(full).alarms if a.source == "redis"]
    assert alarm.name == "redis_full"
    assert alarm.message.startswith("Redis is full (used_memory ") and alarm.message.endswith(expected)
    reading = metrics.read(full)
    assert [a.name for a in reading.alarms if a.source == "redis"] == ["redis_full"]
    assert reading.memory is not None and reading.memory.used >= 0.99 * reading.memory.max
    full.delete(JUNK)
    assert [a for a in snapshot(full).alarms if a.source == "redis"] == []


def test_a_command_refused_by_a_full_redis_fails_in_one_line_and_writes_nothing(
    full: redis.Redis, redis_server, tmp_path, croqq
) -> None:  # type: ignore[no-untyped-def]
    env = {"CROQQ_BROKER_URL": redis_server.url, **run_dirs(tmp_path), "CROQQ_SIM_GPUS": "1"}
    done = croqq(env, "submit", "--dtype", "f16", "--shape", "4096x8192x8192")
    assert done.returncode == 1
    assert done.stderr == (
        "croqq: error: Redis is full and refuses writes: free memory or raise maxmemory, then try again\n"
    )
    assert full.keys("croqq:*") == [JUNK]  # nothing but the test's junk


def test_an_evicting_policy_is_an_alarm(redis_client: redis.Redis) -> None:
    try:
        redis_client.config_set("maxmemory", 1 << 30)
        redis_client.config_set("maxmemory-policy", "allkeys-lru")
        (alarm,) = [a for a in snapshot(redis_client).alarms if a.source == "redis"]
        assert alarm.name == "redis_evicts" and "set maxmemory-policy noeviction" in alarm.message
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.config_set("maxmemory-policy", memory.NOEVICTION)


def test_waiting_for_room_lasts_until_memory_is_freed(full: redis.Redis) -> None:
    waiter = threading.Thread(target=memory.wait_for_room, args=(full,), kwargs={"poll_s": 0.05})
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive()  # still full: still waiting
    full.delete(JUNK)
    wait_until(lambda: not waiter.is_alive(), 30, "the wait for room to end once memory was freed")
    memory.wait_for_room(full)  # room: returns at once


def test_a_message_is_delivered_and_acknowledged_while_redis_is_full(
    redis_server, redis_client: redis.Redis
) -> None:  # type: ignore[no-untyped-def]
    """Neither writes anything a full Redis refuses: the delivery only pops the message, the ack is kept
    in the consumer's memory (kombu's ack emulation, a transaction each, is off)."""
    url = kombu_url(Settings(broker_url=redis_server.url))
    with kombu.Connection(url) as conn:
        queue = conn.SimpleQueue("croqq-full-test")
        queue.put({"n": 1})
        used = memory.read_memory(redis_client).used
        redis_client.config_set("maxmemory", used + 4 * 1024 * 1024)
        try:
            redis_client.setrange(JUNK, 4 * 1024 * 1024, "x")
            with pytest.raises(redis.exceptions.ResponseError) as refused:
                redis_client.set("croqq-full-probe", "x")
            assert memory.is_full_error(refused.value)  # Redis is full indeed
            message = queue.get(timeout=60)
            message.ack()
            assert message.acknowledged and message.payload == {"n": 1}
            assert redis_client.llen("croqq-full-test") == 0 and not redis_client.exists("unacked")
        finally:
            redis_client.config_set("maxmemory", 0)
            redis_client.delete(JUNK)
        queue.close()
