"""The broker transport: kombu's Redis transport, one redis.Redis per pool, on every Redis URL scheme."""

from __future__ import annotations

import kombu

import croqq.processes.app  # noqa: F401 - importing the app installs the transport
from croqq.delivery import transport
from croqq.delivery.redis_client import kombu_url
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
            message.ack()
        assert got == [0, 1, 2]
        assert redis_client.hlen("unacked") == 0  # acks sent through the shared client reached Redis
        channel._disconnect_pools()  # what kombu does after a connection error
        with channel.conn_or_acquire() as third:
            assert third is not first and third.connection_pool is channel.pool
            assert third.ping()
        queue.close()
