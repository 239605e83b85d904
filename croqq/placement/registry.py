"""The GPU registry and the worker registry in Redis.

A GPU entry says which host and queue serve it, its type and its status (healthy / quarantined /
offline); workers beat into ``croqq:workers`` so housekeeping can tell which consumers died.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict

from croqq.delivery import keys
from croqq.delivery.redis_client import strs
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


def register_gpu(client: redis.Redis, entry: GpuEntry) -> None:
    data = entry.model_dump()
    client.hset(keys.gpu(entry.uuid), mapping={k: str(v) for k, v in data.items()})
    client.sadd(keys.GPUS, entry.uuid)


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
    client.hset(keys.gpu(uuid), mapping={"status": status, "reason": reason})
    log.warning("GPU %s is now %s%s", uuid, status, f": {reason}" if reason else "")


def set_current(client: redis.Redis, uuid: str, text: str) -> None:
    client.hset(keys.gpu(uuid), mapping={"current": text, "since": str(time.time())})


def register_worker(client: redis.Redis, node: str, queues: list[str], role: str) -> None:
    """Record a (re)started consumer; a restart may have lost a message its predecessor reserved."""
    now = time.time()
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
    now = str(time.time())
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.set(keys.queue_reset(queue), now)
    pipe.execute()


def beat_worker(client: redis.Redis, node: str) -> None:
    client.zadd(keys.WORKERS, {node: time.time()})


def unregister_worker(client: redis.Redis, node: str) -> None:
    client.zrem(keys.WORKERS, node)
    client.delete(keys.worker(node))


def reap_dead_workers(client: redis.Redis, ttl_s: float) -> list[str]:
    """Forget workers silent for longer than ``ttl_s``; mark their queues reset. Returns their names."""
    now = time.time()
    dead = strs(client.zrangebyscore(keys.WORKERS, "-inf", now - ttl_s))
    for node in dead:
        raw = client.hget(keys.worker(node), "queues")
        for queue in json.loads(raw) if raw else []:
            client.set(keys.queue_reset(queue), str(now))
        unregister_worker(client, node)
        log.warning("worker %s stopped beating; its queues are marked for re-publish", node)
    return list(dead)


def live_workers(client: redis.Redis, ttl_s: float) -> list[str]:
    return strs(client.zrangebyscore(keys.WORKERS, time.time() - ttl_s, "+inf"))


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
