"""kombu's Redis transport with one ``redis.Redis`` per connection pool.

kombu's Redis channel builds a new ``redis.Redis`` (and fills its response callbacks) for every command
it sends outside its event loop: each publish, ack and task event. A client holds no connection of its
own (each command borrows one from the pool), so one client per pool serves every caller, threads
included. ``install()`` makes it the transport of the
``redis``, ``rediss`` and ``redis+socket`` URLs in this process (kombu picks the transport from the
URL's scheme, ``redis`` for all three, so an explicit transport setting would not reach socket URLs).
"""

from __future__ import annotations

from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis

ALIASES = ("redis", "rediss")
# kombu internals this module relies on, checked on kombu >= 5.7, < 5.8 (tests/unit/test_third_party_pins.py)
KOMBU_CHECKED = ("5.7", "5.8")
KOMBU_INTERNALS = (
    "kombu.transport:_transport_cache",
    "kombu.transport:TRANSPORT_ALIASES",
    "kombu.transport.redis:Channel._create_client",
    "kombu.transport.redis:Channel.pool",
)


class Channel(kombu_redis.Channel):
    _shared: Any = None  # the client for the current pool (kombu drops and rebuilds pools on errors)

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
