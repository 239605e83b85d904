"""The GPU registry and the worker registry in Redis.

A GPU entry says which host and queue serve it, its type and its status (healthy / quarantined /
offline); workers beat into ``croqq:workers`` so housekeeping can tell which consumers died.

A quarantine is sticky: registering a GPU (a worker restarting, or re-registering after Redis forgot it)
never overwrites a stored quarantine's status, reason and ``quarantined_at`` (Redis's clock, set when the
GPU becomes quarantined). Only :func:`lift_quarantine` ends one: a passing re-check once the cool-down has
passed, or an operator's ``croqq gpu release``. ``offline`` (its worker is gone) is not sticky: a returning
worker registers its GPU with the status its start health check found.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict

from croqq.delivery import clock, keys
from croqq.delivery.redis_client import strs, text
from croqq.domain.manifest import Manifest
from croqq.errors import ConfigError
from croqq.settings import Settings

log = logging.getLogger(__name__)

HEALTHY, QUARANTINED, OFFLINE = "healthy", "quarantined", "offline"


class GpuEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uuid: str
    host: str
    index: int
    gpu_type: str
    queue: str
    status: str = HEALTHY
    reason: str = ""
    current: str = ""
    since: float = 0.0
    owner: str = ""
    missing_since: float = 0.0
    quarantined_at: float = 0.0  # Redis time it became quarantined (0: not quarantined)


# Redis's clock as seconds (float), for the scripts below.
_NOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# KEYS = GPU hash, GPU set; ARGV = uuid, then field/value pairs. A stored quarantine keeps its status,
# reason and quarantined_at; a GPU that becomes quarantined here gets Redis's time (unless the entry
# brings its own, re-registered after Redis forgot it). Returns the status before.
_REGISTER_LUA = (
    _NOW_LUA
    + """
local before = redis.call('HGET', KEYS[1], 'status') or ''
local sticky = {status = true, reason = true, quarantined_at = true}
for i = 2, #ARGV, 2 do
  if not (before == 'quarantined' and sticky[ARGV[i]]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local since = tonumber(redis.call('HGET', KEYS[1], 'quarantined_at') or '0') or 0
if before ~= 'quarantined' and redis.call('HGET', KEYS[1], 'status') == 'quarantined' and since == 0 then
  redis.call('HSET', KEYS[1], 'quarantined_at', tostring(now))
end
redis.call('SADD', KEYS[2], ARGV[1])
return before
"""
)

# KEYS = GPU hash; ARGV = status, reason. quarantined_at: kept by a GPU already quarantined, Redis's time
# for one that becomes quarantined, 0 otherwise.
_SET_STATUS_LUA = (
    _NOW_LUA
    + """
local before = redis.call('HGET', KEYS[1], 'status') or ''
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'reason', ARGV[2])
if ARGV[1] ~= 'quarantined' then
  redis.call('HSET', KEYS[1], 'quarantined_at', '0')
elseif before ~= 'quarantined' then
  redis.call('HSET', KEYS[1], 'quarantined_at', tostring(now))
end
return before
"""
)

# KEYS = GPU hash; ARGV = cool-down seconds. A quarantined GPU whose cool-down has passed becomes healthy.
# Returns 1 if lifted, 0 if still cooling down, -1 if the GPU is not quarantined.
_LIFT_LUA = (
    _NOW_LUA
    + """
if redis.call('HGET', KEYS[1], 'status') ~= 'quarantined' then return -1 end
local since = tonumber(redis.call('HGET', KEYS[1], 'quarantined_at') or '0') or 0
if now - since < tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'status', 'healthy', 'reason', '', 'quarantined_at', '0')
return 1
"""
)


def register_gpu(client: redis.Redis, entry: GpuEntry) -> str:
    """Write the GPU's entry, keeping a stored quarantine (see the module doc). Returns the status the
    entry had before ('' for a new GPU)."""
    args: list[str] = [entry.uuid]
    for field, value in entry.model_dump().items():
        args += [field, str(value)]
    return text(client.eval(_REGISTER_LUA, 2, keys.gpu(entry.uuid), keys.GPUS, *args)) or ""


def is_registered(client: redis.Redis, uuid: str) -> bool:
    """The GPU's entry is whole and listed (a step's bookkeeping may have re-created part of a lost one)."""
    pipe = client.pipeline(transaction=False)
    pipe.sismember(keys.GPUS, uuid)
    pipe.hexists(keys.gpu(uuid), "queue")
    return all(pipe.execute())


def get_gpu(client: redis.Redis, uuid: str) -> GpuEntry | None:
    data = client.hgetall(keys.gpu(uuid))
    return GpuEntry.model_validate(data) if data else None


def all_gpus(client: redis.Redis) -> list[GpuEntry]:
    uuids = sorted(strs(client.smembers(keys.GPUS)))
    pipe = client.pipeline(transaction=False)
    for uuid in uuids:
        pipe.hgetall(keys.gpu(uuid))
    return [GpuEntry.model_validate(d) for d in pipe.execute() if d]


def set_status(client: redis.Redis, uuid: str, status: str, reason: str = "") -> None:
    client.eval(_SET_STATUS_LUA, 1, keys.gpu(uuid), status, reason)
    log.warning("GPU %s is now %s%s", uuid, status, f": {reason}" if reason else "")


def cooldown_left(client: redis.Redis, gpu: GpuEntry, cooldown_s: float) -> float:
    """Seconds (Redis's clock) before a quarantined GPU may be lifted; 0 if it may, or is not quarantined."""
    if gpu.status != QUARANTINED:
        return 0.0
    sec, usec = client.time()
    return max(0.0, gpu.quarantined_at + cooldown_s - (sec + usec / 1e6))


def lift_quarantine(client: redis.Redis, uuid: str, cooldown_s: float = 0.0) -> bool:
    """Atomically put a quarantined GPU back to healthy if ``cooldown_s`` has passed since it was
    quarantined (Redis's clock). True if it was lifted; False if still cooling down or not quarantined."""
    lifted = int(client.eval(_LIFT_LUA, 1, keys.gpu(uuid), repr(float(cooldown_s)))) == 1
    if lifted:
        log.warning("GPU %s is healthy again: its quarantine is lifted", uuid)
    return lifted


def register_worker(client: redis.Redis, node: str, queues: list[str], role: str) -> None:
    """Record a (re)started consumer; a restart may have lost a message its predecessor reserved."""
    now = clock.now(client)
    info: dict[Any, Any] = {
        "queues": json.dumps(queues),
        "pid": str(os.getpid()),
        "role": role,
        "started": str(now),
    }
    pipe = client.pipeline()
    pipe.hset(keys.worker(node), mapping=info)
    pipe.zadd(keys.WORKERS, {node: now})
    pipe.execute()


def mark_queues_reset(client: redis.Redis, queues: list[str]) -> None:
    """Steps queued on these queues before now may have lost their message (see housekeeping)."""
    now = str(clock.now(client))
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.set(keys.queue_reset(queue), now)
    pipe.execute()


_BEAT_LUA = """
redis.set_repl(redis.REPL_NONE)
return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
"""


def beat_worker(client: redis.Redis, node: str) -> None:
    """The worker is alive now. Kept in Redis's memory only (no AOF append, so no fsync per beat); a restart
    gives every registered worker a fresh beat (:mod:`croqq.delivery.grace`)."""
    client.eval(_BEAT_LUA, 1, keys.WORKERS, repr(clock.now(client)), node)


def unregister_worker(client: redis.Redis, node: str) -> None:
    client.zrem(keys.WORKERS, node)
    client.delete(keys.worker(node))


def reap_dead_workers(client: redis.Redis, ttl_s: float) -> list[str]:
    """Forget workers silent for longer than ``ttl_s``; mark their queues reset. Returns their names."""
    now = clock.now(client)
    dead = strs(client.zrangebyscore(keys.WORKERS, "-inf", now - ttl_s))
    for node in dead:
        raw = client.hget(keys.worker(node), "queues")
        for queue in json.loads(raw) if raw else []:
            client.set(keys.queue_reset(queue), str(now))
        unregister_worker(client, node)
        log.warning("worker %s stopped beating; its queues are marked for re-publish", node)
    return list(dead)


def live_workers(client: redis.Redis, ttl_s: float) -> list[str]:
    return strs(client.zrangebyscore(keys.WORKERS, clock.now(client) - ttl_s, "+inf"))


def pick_gpu_type(settings: Settings, manifest: Manifest, requested: str | None) -> str:
    """--gpu, else the one type of GPU registered in the cluster, else what this host's probe finds."""
    if requested:
        manifest.gpu(requested)
        return requested
    from croqq.delivery.redis_client import connect

    types = sorted({g.gpu_type for g in all_gpus(connect(settings))})
    if len(types) > 1:
        raise ConfigError(f"the cluster has several GPU types ({', '.join(types)}); choose one with --gpu")
    if not types:
        from croqq.probes import make_probe

        types = sorted({g.gpu_type for g in make_probe(settings).discover()})
    if not types:
        raise ConfigError("no GPUs registered or found; start workers (`croqq worker`) or pass --gpu TYPE")
    manifest.gpu(types[0])
    return types[0]
