"""One clock for the whole fleet: Redis's.

Every lease deadline, step score, heartbeat and liveness decision is written by one host and read by
another, so it must come from one clock. :func:`now` is Redis's ``TIME``, read once every
``RESYNC_S`` per connection pool and carried forward by this host's monotonic clock in between (one round
trip per few seconds instead of one per decision). A host whose wall clock is minutes off (or runs under
libfaketime) therefore agrees with every other host to within a round trip; its own ``time.time()`` is used
only for log lines and for files read on the same host.

When Redis cannot be reached the last reading is carried forward (a partitioned worker keeps a consistent
view of its own deadlines); before the first reading, the error propagates.
"""

from __future__ import annotations

import threading
import time
import weakref

import redis

RESYNC_S = 5.0


class RedisClock:
    def __init__(self, client: redis.Redis, resync_s: float = RESYNC_S) -> None:
        self.client = client
        self.resync_s = resync_s
        self._base: tuple[float, float] | None = None  # (Redis seconds, local monotonic) at the last read
        self._lock = threading.Lock()

    def now(self) -> float:
        """Redis's time in seconds (float)."""
        mono = time.monotonic()
        base = self._base
        if base is None or mono - base[1] >= self.resync_s:
            try:
                base = self._read()
            except redis.RedisError:
                if base is None:
                    raise
        return base[0] + (mono - base[1])

    def _read(self) -> tuple[float, float]:
        before = time.monotonic()
        sec, usec = self.client.time()
        after = time.monotonic()
        base = (sec + usec / 1e6, (before + after) / 2)  # the reply was made about halfway through
        with self._lock:
            self._base = base
        return base


_CLOCKS: weakref.WeakKeyDictionary[object, RedisClock] = weakref.WeakKeyDictionary()
_CLOCKS_LOCK = threading.Lock()


def clock(client: redis.Redis) -> RedisClock:
    """The clock of the Redis behind ``client`` (one per connection pool, shared by its pipelines)."""
    pool = client.connection_pool
    with _CLOCKS_LOCK:
        found = _CLOCKS.get(pool)
        if found is None:
            found = _CLOCKS[pool] = RedisClock(redis.Redis(connection_pool=pool))
        return found


def now(client: redis.Redis) -> float:
    """Redis's time in seconds: the one clock for deadlines and liveness (see the module doc)."""
    return clock(client).now()
