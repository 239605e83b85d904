"""Alarms: conditions a human must see while croqq waits for them to pass (a full disk, a corrupted results
repo, agents running without a jail).

Unlike a host problem (:mod:`croqq.work.hosts`), an alarm does not stop its worker: the worker keeps checking
and clears the alarm itself once the condition is gone. Each alarm is one field of ``croqq:alarms``, named
``<name>@<worker label>`` so that two hosts' alarms of one kind are two rows; ``croqq status`` lists them and
the exporter publishes ``croqq_alarm{name, source}``.

A full Redis cannot hold an alarm (it refuses the write), so Redis's own condition is read from ``INFO
memory`` by whoever shows alarms (:func:`redis_alarms`): ``redis_full`` or ``redis_evicts``, source ``redis``.
"""

from __future__ import annotations

import logging

import redis
from pydantic import BaseModel

from croqq.delivery import clock, keys
from croqq.delivery.memory import RedisMemory
from croqq.work import hosts

log = logging.getLogger(__name__)


class Alarm(BaseModel):
    name: str  # what kind: "disk_full", "repo_corrupt", "agents_unjailed", ...
    source: str  # the worker label that raised it (build@node7, writer@node1)
    message: str  # one line: what is wrong and what to do
    at: float  # Redis time when raised

    @property
    def field(self) -> str:
        return f"{self.name}@{self.source}"


def raise_alarm(client: redis.Redis, name: str, message: str) -> Alarm:
    """Raise (or refresh) ``name`` for this worker; logged at ERROR the first time only."""
    alarm = Alarm(name=name, source=hosts.label(), message=message[:300], at=clock.now(client))
    if client.hsetnx(keys.ALARMS, alarm.field, alarm.model_dump_json()):
        log.error("ALARM %s on %s: %s", name, alarm.source, alarm.message)
    else:
        client.hset(keys.ALARMS, alarm.field, alarm.model_dump_json())
    return alarm


def clear_alarm(client: redis.Redis, name: str) -> bool:
    """Clear ``name`` for this worker; True (and a log line) when it was raised."""
    field = f"{name}@{hosts.label()}"
    if client.hdel(keys.ALARMS, field):
        log.warning("alarm %s on %s cleared", name, hosts.label())
        return True
    return False


def active(client: redis.Redis) -> list[Alarm]:
    return sorted(
        (Alarm.model_validate_json(v) for v in client.hvals(keys.ALARMS)), key=lambda a: (a.name, a.source)
    )


def clear_everywhere(client: redis.Redis, name: str) -> int:
    """Clear ``name`` whichever worker raised it (an operator's repair fixed the condition itself)."""
    fields = [a.field for a in active(client) if a.name == name]
    return int(client.hdel(keys.ALARMS, *fields)) if fields else 0


def redis_alarms(memory: RedisMemory, now: float) -> list[Alarm]:
    """The alarm Redis's memory figures call for (none when it has room and does not evict)."""
    message = memory.message()
    if not message:
        return []
    return [
        Alarm(name="redis_full" if memory.full else "redis_evicts", source="redis", message=message, at=now)
    ]
