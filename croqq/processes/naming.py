"""Celery node names that say what a worker is, so that Flower's worker list reads like the fleet:

    gpu-<index>-<uuid tag>@<host>   a GPU worker: its GPU's index on the host and the first 8 hex digits
                                    of its UUID, as ``nvidia-smi -L`` shows it (a simulated GPU: ``sim``
                                    and 8 hex digits of its UUID's SHA-256)
    build@<host>, ideate@<host>, coordinator@<host>, writer@<host>

Node names must be unique (Flower, the worker registry and host problems key on them), and several
workers of one role may share a host name, so a name is claimed as a lease (``croqq:lease:node:<name>``):
the first worker of a role gets ``<role>@<host>``, the next ones ``<role>-2@<host>``, ``-3``... A worker
restarted after a SIGKILL takes its dead predecessor's name back at once, so a supervised restart keeps
its name. A GPU worker claims no name: its GPU's lease already makes it unique. No name carries a pid.
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
