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

kombu's ack emulation is off: messages are triggers and the step ledger is the truth, so the two Redis
transactions kombu spends per message on it (delivery recorded in its ``unacked`` hash, removed at the
ack) bought nothing croqq uses. What it gave, redelivery of a message whose consumer died after the
visibility timeout (an hour or more here), the ledger gives sooner: a step still queued after its
queue's consumer restarted, or queued for ``queue_resend_s``, is published again by housekeeping, and a
duplicate is dropped at claim. A message a worker has reserved lives in that worker's memory: an ack
writes nothing to Redis (so it goes through while Redis is full), a reject with requeue (a killed pool
child's step) and a warm shutdown put the message back on its queue, and a killed worker's reserved
messages go with it until housekeeping publishes their steps again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.utils.objects import cached_property

ALIASES = ("redis", "rediss")
# kombu internals this module relies on, checked on kombu >= 5.7, < 5.8 (tests/unit/test_third_party_pins.py)
KOMBU_CHECKED = ("5.7", "5.8")
KOMBU_INTERNALS = (
    "kombu.transport:_transport_cache",
    "kombu.transport:TRANSPORT_ALIASES",
    "kombu.transport.redis:Channel._create_client",
    "kombu.transport.redis:Channel.pool",
    "kombu.transport.redis:Channel.ack_emulation",
    "kombu.transport.redis:Channel.subclient",
)
FANOUT_READ_S = 1.0  # the longest a pub/sub read waits (kombu reads only when its socket is readable)


def bounded_read(read: Callable[..., Any]) -> Callable[..., Any]:
    """A pub/sub ``parse_response`` that waits :data:`FANOUT_READ_S` at most where it would block (None
    when no message came; a message that came in part is kept by the parser for the next read)."""

    def parse_response(block: bool = True, timeout: float = 0) -> Any:
        return read(block=False, timeout=FANOUT_READ_S if block else timeout)

    return parse_response


class Channel(kombu_redis.Channel):
    ack_emulation = False  # see the module's doc; kombu then keeps reserved messages in memory only
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
