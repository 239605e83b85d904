"""The broker transport: kombu's Redis transport, one redis.Redis per pool, on every Redis URL scheme."""

from __future__ import annotations

import time

import kombu
import pytest

import croqq.processes.app  # noqa: F401 - importing the app installs the transport
from croqq.delivery import transport
from croqq.delivery.redis_client import kombu_url
from croqq.patience import wait_until
from croqq.settings import Settings


def test_every_redis_url_scheme_gets_croqqs_transport() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/0", "redis+socket:///tmp/r.sock"):
        assert kombu.Connection(url).get_transport_cls() is transport.Transport, url


def test_a_channel_reuses_one_client_per_pool_and_still_carries_messages(redis_server, redis_client) -> None:  # type: ignore[no-untyped-def]
    url = kombu_url(Settings(broker_url=redis_server.url))
    assert url.startswith("redis+socket://")
    with kombu.Connection(url) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        queue = conn.SimpleQueue("croqq-transport-test")
        for n in range(3):
            queue.put({"n": n})
        got = []
        for _ in range(3):
            message = queue.get(timeout=60)
            got.append(message.payload["n"])
            assert not redis_client.exists("unacked", "unacked_index")  # no delivery bookkeeping in Redis
            message.ack()
        assert got == [0, 1, 2]
        channel._disconnect_pools()  # what kombu does after a connection error
        with channel.conn_or_acquire() as third:
            assert third is not first and third.connection_pool is channel.pool
            assert third.ping()
        queue.close()


@pytest.mark.timeout(120)
def test_a_fanout_read_on_a_dropped_pubsub_connection_reconnects_and_returns_instead_of_waiting_for_ever(
    redis_server, redis_client
) -> None:  # type: ignore[no-untyped-def]
    """What held a GPU worker's event loop after a partition: kombu dropped its stale pub/sub connection,
    then read a fanout message with a blocking read, which redis-py let wait for ever."""
    with kombu.Connection(kombu_url(Settings(broker_url=redis_server.url))) as conn:
        pubsub = conn.default_channel.subclient
        pubsub.subscribe("croqq-fanout-test")
        assert pubsub.parse_response()[0] in (b"subscribe", "subscribe")  # the confirmation: there at once
        pubsub.connection.disconnect()  # as kombu does after missed health checks
        resubscribed = pubsub.parse_response()  # kombu's call: it reconnects and subscribes again
        assert resubscribed[0] in (b"subscribe", "subscribe")
        started = time.monotonic()
        assert pubsub.parse_response() is None  # no message: none after the bound, not a wait for ever
        assert time.monotonic() - started < transport.FANOUT_READ_S + 5
        redis_client.publish("croqq-fanout-test", "hello")  # resubscribed on the reconnect: it arrives
        got = wait_until(pubsub.parse_response, 30, "the message published after the reconnect")
        assert got[-1] in (b"hello", "hello")


def test_a_reserved_message_goes_back_to_its_queue_on_reject_and_when_its_consumer_closes(
    redis_server, redis_client
) -> None:  # type: ignore[no-untyped-def]
    """Reservations live in the consumer's memory (no ack emulation): a reject with requeue (a killed pool
    child's message) and a clean close (a warm shutdown) put the message back, where another takes it."""
    url = kombu_url(Settings(broker_url=redis_server.url))
    with kombu.Connection(url) as conn:
        queue = conn.SimpleQueue("croqq-requeue-test")
        queue.put({"n": 1})
        queue.get(timeout=60).reject(requeue=True)
        assert redis_client.llen("croqq-requeue-test") == 1
        held = queue.get(timeout=60)  # reserved, never acknowledged
        assert held.payload == {"n": 1} and redis_client.llen("croqq-requeue-test") == 0
    with kombu.Connection(url) as conn:  # the first consumer closed: its reservation is back on the queue
        queue = conn.SimpleQueue("croqq-requeue-test")
        again = queue.get(timeout=60)
        assert again.payload == {"n": 1}
        again.ack()
        queue.close()
    assert redis_client.llen("croqq-requeue-test") == 0
