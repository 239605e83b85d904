"""Celery node names that say what a worker is, so that Flower's worker list reads like the fleet:

    gpu-<index>-<uuid tag>@<host>   a GPU worker: its GPU's index on the host and the first 8 hex digits
                                    of its UUID (``GPU-3f9a2c1b-...`` -> ``gpu-0-3f9a2c1b@node7``, what
                                    ``nvidia-smi -L`` shows); a simulated GPU (``GPU-sim-<machine>-<i>``)
                                    is tagged ``sim`` and 8 hex digits of its UUID's SHA-256
    build@<host>, ideate@<host>, coordinator@<host>, writer@<host>

Celery node names must be unique: Flower, the worker registry (``croqq:worker:<node>``) and host problems
key on them. Several build, ideate or coordinator workers may run on one host (or in pods that share a host
name), so a name is claimed: the first worker of a role on a host is ``<role>@<host>``; while a live worker
holds that, the next one starting is ``<role>-2@<host>``, then ``-3`` and so on. The claim is a lease
(``croqq:lease:node:<name>``) renewed by the worker's heartbeat and released on exit; a worker restarted
after a SIGKILL takes its predecessor's name back at once (its holder is a dead process of this PID
namespace), so a supervised restart keeps its name. A GPU worker claims no name: its GPU's lease already
makes it the only worker of that GPU. No name carries a pid; the registry records the pid beside the name.
"""

from __future__ import annotations

import hashlib
import logging
import re

import redis

from croqq.delivery.leases import Lease
from croqq.errors import ConfigError

log = logging.getLogger(__name__)
MAX_PER_HOST = 256  # workers of one role sharing a host name; more is a misconfiguration
_NVIDIA_UUID = re.compile(r"^GPU-([0-9a-fA-F]{8})-")


def gpu_node(index: int, uuid: str) -> str:
    """A GPU worker's node name (without ``@host``): ``gpu-<index>-<8 hex digits of its UUID>``."""
    match = _NVIDIA_UUID.match(uuid)
    tag = match.group(1).lower() if match else "sim" + hashlib.sha256(uuid.encode()).hexdigest()[:8]
    return f"gpu-{index}-{tag}"


def candidates(role: str, host: str) -> list[str]:
    """The names a worker of ``role`` on ``host`` tries, in order."""
    return [f"{role}@{host}"] + [f"{role}-{n}@{host}" for n in range(2, MAX_PER_HOST + 1)]


def claim_node(client: redis.Redis, role: str, host: str, owner: str, ttl_s: float) -> tuple[str, Lease]:
    """The first free name of ``role`` on ``host`` and the lease that holds it (renew it every beat)."""
    for node in candidates(role, host):
        lease = Lease(client, f"node:{node}", owner, ttl_s)
        if lease.try_take():
            return node, lease
    raise ConfigError(f"{MAX_PER_HOST} {role} workers already run on host {host}; stop some first")


def keep_node(lease: Lease) -> None:
    """A heartbeat: keep the name (taken again if Redis forgot it); a name lost to another worker (this one
    paused past the lease) is logged, since two workers of one name confuse Flower and the registry."""
    if not lease.renew() and not lease.try_take():
        log.error("node name %s is now held by %s", lease.name[len("node:") :], lease.client.get(lease.key))
