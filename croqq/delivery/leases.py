"""Leases: Redis keys owned by one process, kept alive by a heartbeat thread, released on exit.

A lease is ``SET key owner PX ttl NX``; renewing and releasing are compare-and-set on the owner (Lua),
so a process that lost its lease (paused past the TTL) can never renew or delete its successor's.
Used for the singletons (writer, beat), for GPU claims and for step leases (the ledger's heartbeats, one
round trip per process and beat: :class:`StepLeases`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from croqq.delivery import keys, memory
from croqq.delivery.redis_client import text
from croqq.errors import LeaseHeldError
from croqq.patience import Deadline

log = logging.getLogger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RENEW_IN_MEMORY = "redis.set_repl(redis.REPL_NONE)" + _RENEW  # not in the AOF: see croqq.delivery.grace
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


@functools.cache
def process_space() -> str:
    """What makes a pid meaningful: this kernel's boot id and this PID namespace (8 hex digits). Two
    containers with one hostname (hostNetwork pods) differ here, and so does a host after a reboot."""
    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = ""
    raw = f"{_read('/proc/sys/kernel/random/boot_id')}:{pidns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:8]


def owner_id(tag: str = "") -> str:
    """A process's owner token, unique across hosts and PID namespaces: ``<host>:<pid>:<space>:<random>
    [:tag]``, e.g. ``gpu-node-1:4711:9c04e1aa:3f9a2c1b:gpu``. The host name is a label for people; the
    process space (:func:`process_space`) says where the pid may be checked."""
    suffix = f":{tag}" if tag else ""
    return f"{socket.gethostname()}:{os.getpid()}:{process_space()}:{uuid.uuid4().hex[:8]}{suffix}"


def dead_local(owner: str) -> bool:
    """An owner token of this PID namespace (same boot, same namespace) whose process no longer exists: a
    SIGKILLed predecessor. Any other owner, whatever its host name, is never taken for dead here."""
    parts = owner.split(":")
    if len(parts) < 4 or parts[2] != process_space() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Lease:
    """``in_memory``: renewals are kept out of the AOF (no fsync per beat); a restarted Redis has the lease
    back for one TTL only if something records its owner elsewhere (a GPU's registry entry:
    :mod:`croqq.delivery.grace`). The singletons' renewals are persisted."""

    def __init__(
        self, client: redis.Redis, name: str, owner: str, ttl_s: float, in_memory: bool = False
    ) -> None:
        self.client = client
        self.key = keys.lease(name)
        self.name = name
        self.owner = owner
        self.ttl_ms = int(ttl_s * 1000)
        self._renew_script = _RENEW_IN_MEMORY if in_memory else _RENEW

    def try_acquire(self) -> bool:
        return bool(self.client.set(self.key, self.owner, px=self.ttl_ms, nx=True))

    def try_take(self) -> bool:
        """Take the lease if it is free or its holder is a process of this PID namespace that no longer
        exists (released at once: a supervisor restarting a killed one); False while a live one holds it."""
        while not self.try_acquire():
            holder = text(self.client.get(self.key)) or ""
            if not holder:  # it expired meanwhile
                continue
            if not (dead_local(holder) and self.client.eval(_RELEASE, 1, self.key, holder)):
                return False
            log.warning("released %s held by %s, a process that no longer exists", self.key, holder)
        return True

    def acquire(self, wait_s: float, what: str) -> None:
        """Take the lease (:meth:`try_take`), waiting up to ``wait_s`` for a live holder's to expire."""
        deadline = Deadline(wait_s, wall=True)  # its TTL runs on Redis's clock, whatever this host's load
        while not self.try_take():
            holder = text(self.client.get(self.key)) or ""
            if deadline.expired():
                raise LeaseHeldError(
                    f"{what} is already held by {holder} (lease {self.key}); only one may run - stop it first"
                )
            time.sleep(0.2)
        log.info("acquired lease %s as %s", self.key, self.owner)

    def renew(self) -> bool:
        return bool(self.client.eval(self._renew_script, 1, self.key, self.owner, self.ttl_ms))

    def held(self) -> bool:
        return bool(self.client.get(self.key) == self.owner)

    def release(self) -> None:
        try:
            self.client.eval(_RELEASE, 1, self.key, self.owner)
        except redis.RedisError as exc:  # pragma: no cover - best effort at shutdown
            log.warning("could not release lease %s: %s", self.key, exc)


class Heartbeat:
    """A daemon thread that calls each registered beat every ``interval_s`` (errors logged, never fatal)."""

    def __init__(
        self, interval_s: float, name: str = "croqq-heartbeat", client: redis.Redis | None = None
    ) -> None:
        self.interval_s = interval_s
        self.client = client  # the Redis its beats write to: a full one is said once, not per beat
        self._beats: dict[str, Callable[[], object]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def add(self, name: str, beat: Callable[[], object]) -> None:
        with self._lock:
            self._beats[name] = beat

    def remove(self, name: str) -> None:
        with self._lock:
            self._beats.pop(name, None)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat_now(self) -> None:
        with self._lock:
            beats = list(self._beats.items())
        full = False
        for name, beat in beats:
            try:
                beat()
            except Exception as exc:  # a failed beat is retried next interval
                if memory.is_full_error(exc):  # said once per pause, not once per beat
                    full = True
                    continue
                log.warning("heartbeat %s failed: %s", name, exc)
        if full:
            memory.note_full(self.client)
        elif beats and self.client is not None:
            memory.note_room(self.client)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat_now()


class StepLeases:
    """The step leases one process holds, renewed together on its heartbeat thread: one round trip per beat
    however many steps the process runs (an ideate worker runs ``ideate_concurrency`` at a time)."""

    def __init__(self, renew: Callable[[list[str]], object], heartbeat: Heartbeat) -> None:
        self._renew = renew
        self._steps: set[str] = set()
        self._lock = threading.Lock()
        heartbeat.add("steps", self.beat)

    def add(self, step_id: str) -> None:
        with self._lock:
            self._steps.add(step_id)

    def remove(self, step_id: str) -> None:
        with self._lock:
            self._steps.discard(step_id)

    def beat(self) -> None:
        with self._lock:
            steps = sorted(self._steps)
        if steps:
            self._renew(steps)
