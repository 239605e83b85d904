"""Redis out of memory: ``maxmemory`` reached under ``noeviction``.

Such a Redis refuses every write (and every command inside MULTI) with ``OOM command not allowed when used
memory > 'maxmemory'`` and still answers reads. For croqq that is a cluster-wide pause, never a step's
fault: whoever meets the refusal (:func:`is_full_error`) waits until Redis has room again
(:func:`wait_for_room`, reads only) and then carries on; no step failure is counted, no shape parked.
The alarm hash cannot be written meanwhile, so ``croqq status`` and the exporter read the condition
straight from ``INFO memory`` (:func:`read_memory`).

An evicting ``maxmemory-policy`` would be worse than a full Redis: it drops ledger keys silently. croqq
starts its own Redis with ``noeviction``; :attr:`RedisMemory.evicts` tells when a configured one does not.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)
NOEVICTION = "noeviction"
OOM_TEXT = "used memory > 'maxmemory'"  # what every OOM refusal says (a command, a script, a transaction)
POLL_S = 1.0
ROOM_MARGIN = 0.01  # croqq resumes once this fraction of maxmemory is free
WHAT_TO_DO = "croqq pauses; free memory or raise maxmemory"


@dataclass(frozen=True)
class RedisMemory:
    """What ``INFO memory`` says about room: bytes used, the limit (0: none) and the eviction policy."""

    used: int
    max: int
    policy: str

    @property
    def full(self) -> bool:
        """Full, or so near it (less than :data:`ROOM_MARGIN` of ``maxmemory`` free) that croqq pauses: a
        Redis hovering at its limit, as keys expire and writes fill it again, would otherwise have croqq
        resume and pause over and over."""
        return self.max > 0 and self.used >= self.max * (1.0 - ROOM_MARGIN)

    @property
    def evicts(self) -> bool:
        return self.max > 0 and self.policy != NOEVICTION

    def message(self) -> str:
        """One line for people: what is wrong and what to do (empty when nothing is)."""
        if self.full:
            return (
                f"Redis is full (used_memory {self.used} of maxmemory {self.max}, policy {self.policy}): "
                f"{WHAT_TO_DO}"
            )
        if self.evicts:
            return (
                f"Redis evicts keys when full (maxmemory-policy {self.policy}): croqq's live state can be "
                f"dropped silently; set maxmemory-policy {NOEVICTION}"
            )
        return ""

    @classmethod
    def from_info(cls, info: dict[str, object]) -> RedisMemory:
        """From the reply to ``INFO memory``."""
        return cls(
            used=int(str(info.get("used_memory", 0))),
            max=int(str(info.get("maxmemory", 0))),
            policy=str(info.get("maxmemory_policy", "")),
        )


def read_memory(client: redis.Redis) -> RedisMemory:
    return RedisMemory.from_info(client.info("memory"))


def is_full_error(exc: BaseException | None) -> bool:
    """True when ``exc`` (or an exception it was raised from, as kombu's wrappers are) is Redis refusing a
    write because it is full."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, redis.exceptions.OutOfMemoryError) or (
            isinstance(exc, redis.exceptions.ResponseError) and OOM_TEXT in str(exc)
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _Episode:
    """This process's view of the current pause: logged once when it starts and once when it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.full = False

    def enter(self, memory: RedisMemory | None) -> None:
        with self._lock:
            if self.full:
                return
            self.full = True
        shown = memory.message() if memory is not None and memory.full else ""
        log.error(
            "%s", shown or "Redis is full (it refuses writes): croqq pauses; free memory or raise maxmemory"
        )

    def leave(self) -> None:
        with self._lock:
            if not self.full:
                return
            self.full = False
        log.warning("Redis has room again: croqq resumes")


_EPISODE = _Episode()


def note_full(client: redis.Redis | None = None) -> None:
    """Say (once per pause and process) that Redis is full, with its figures when it can be read."""
    memory = None
    if client is not None:
        with contextlib.suppress(redis.RedisError):
            memory = read_memory(client)
    _EPISODE.enter(memory)


def note_room(client: redis.Redis) -> None:
    """A write went through: if this process was pausing and Redis has room again, say once that it
    resumes (one INFO, only while pausing)."""
    if not _EPISODE.full:
        return
    with contextlib.suppress(redis.RedisError):
        if not read_memory(client).full:
            _EPISODE.leave()


def wait_for_room(client: redis.Redis, poll_s: float = POLL_S) -> None:
    """Return once Redis has room for writes (not :attr:`RedisMemory.full`, read with INFO: reads work on
    a full Redis), at once if it has; says once that croqq pauses and once that it resumes. A Redis
    that cannot be read (restarting) is waited for as well."""
    while True:
        try:
            memory = read_memory(client)
        except redis.RedisError as exc:
            log.debug("cannot read Redis's memory figures yet: %s", exc)
        else:
            if not memory.full:
                break
            _EPISODE.enter(memory)
        time.sleep(poll_s)
    _EPISODE.leave()


def at_start(client: redis.Redis) -> None:
    """Before a process takes its leases: wait while Redis is full (a lease it cannot write would make it
    exit and be restarted over and over), and warn when Redis would evict croqq's keys."""
    wait_for_room(client)
    with contextlib.suppress(redis.RedisError):
        found = read_memory(client)
        if found.evicts:
            log.warning("%s", found.message())
