"""kombu's Redis transport with one ``redis.Redis`` per connection pool.

kombu's Redis channel builds a new ``redis.Redis`` (and fills its response callbacks) for every command
it sends outside its event loop: each publish, ack and task event. A client holds no connection of its
own (each command borrows one from the pool), so one client per pool serves every caller, threads
included. ``install()`` makes it the transport of the
``redis``, ``rediss`` and ``redis+socket`` URLs in this process (kombu picks the transport from the
URL's scheme, ``redis`` for all three, so an explicit transport setting would not reach socket URLs).

Its pub/sub reads (the fanout exchanges: Celery's remote control, which Flower's worker pages use) never
block for long. kombu reads a fanout message with a blocking read when the event loop finds the socket
readable, and redis-py (8.x) makes a blocking pub/sub read unbounded (the socket timeout does not apply;
it reconnects first if the connection was dropped). After a partition, kombu drops a pub/sub connection
that misses its health checks; the next read then reconnected and waited for a message for ever, holding
the worker's event loop: a GPU worker that took no step again (found by the seeded nemesis).

Its acknowledgements wait out a full Redis (:mod:`croqq.delivery.memory`): kombu's ack, reject and
delivery bookkeeping are Redis transactions, which a full Redis refuses; a worker whose ack is refused
stops ("Unrecoverable error"), and a message popped from its queue but not recorded as unacked is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.utils.objects import cached_property

from croqq.delivery import memory

T = TypeVar("T")

ALIASES = ("redis", "rediss")
# kombu internals this module relies on, checked on kombu >= 5.7, < 5.8 (tests/unit/test_third_party_pins.py)
KOMBU_CHECKED = ("5.7", "5.8")
KOMBU_INTERNALS = (
    "kombu.transport:_transport_cache",
    "kombu.transport:TRANSPORT_ALIASES",
    "kombu.transport.redis:Channel._create_client",
    "kombu.transport.redis:Channel.pool",
    "kombu.transport.redis:Channel.QoS",
    "kombu.transport.redis:QoS.append",
    "kombu.transport.redis:QoS.ack",
    "kombu.transport.redis:QoS.reject",
    "kombu.transport.redis:Channel.subclient",
)
FANOUT_READ_S = 1.0  # the longest a pub/sub read waits (kombu reads only when its socket is readable)


class QoS(kombu_redis.QoS):
    """kombu's ack emulation, waiting while Redis is full instead of failing."""

    def _until_done(self, fn: Callable[[], T]) -> T:
        while True:
            try:
                return fn()
            except Exception as exc:
                if not memory.is_full_error(exc):
                    raise
                with self.channel.conn_or_acquire() as client:
                    memory.wait_for_room(client)

    def append(self, message: Any, delivery_tag: Any) -> None:
        self._until_done(lambda: super(QoS, self).append(message, delivery_tag))

    def ack(self, delivery_tag: Any) -> None:
        self._until_done(lambda: super(QoS, self).ack(delivery_tag))

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        self._until_done(lambda: super(QoS, self).reject(delivery_tag, requeue))


def bounded_read(read: Callable[..., Any]) -> Callable[..., Any]:
    """A pub/sub ``parse_response`` that waits :data:`FANOUT_READ_S` at most where it would block (None
    when no message came; a message that came in part is kept by the parser for the next read)."""

    def parse_response(block: bool = True, timeout: float = 0) -> Any:
        return read(block=False, timeout=FANOUT_READ_S if block else timeout)

    return parse_response


class Channel(kombu_redis.Channel):
    QoS = QoS
    _shared: Any = None  # the client for the current pool (kombu drops and rebuilds pools on errors)

    @cached_property
    def subclient(self) -> Any:
        """kombu's pub/sub connection of the fanout queues, its reads bounded (see the module's doc)."""
        pubsub = self._create_client(asynchronous=True).pubsub()
        pubsub.parse_response = bounded_read(pubsub.parse_response)
        return pubsub

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the event loop's own client, built once per connection by kombu
            return super()._create_client(asynchronous=True)
        if self._shared is None or self._shared.connection_pool is not self.pool:
            self._shared = super()._create_client()
        return self._shared


class Transport(kombu_redis.Transport):
    Channel = Channel


def install() -> None:
    """Resolve the Redis URL schemes to :class:`Transport` in this process (idempotent)."""
    path = f"{__name__}:Transport"
    for alias in ALIASES:
        kombu_transport.TRANSPORT_ALIASES[alias] = path
        kombu_transport._transport_cache.pop(alias, None)  # a class resolved before install
