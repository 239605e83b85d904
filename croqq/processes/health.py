"""Heartbeat files and `croqq health`: container probes that mean something.

Every long-running croqq process beats on the thread that renews its leases: it pings Redis, checks what
its role needs (a GPU worker: its GPU lease; the supervisor: its GPU workers; Flower, the exporter: their
web server) and atomically replaces ``<health dir>/<role>[-<name>].json``. Only GPU workers have a name
(their GPU's UUID), so two processes of another role on one host need two health dirs.

- **Alive** (`croqq health --role R`): the file is younger than 3 beat intervals (0.75 x
  ``CROQQ_LEASE_TTL_S``; ``--max-age`` overrides): the heartbeat thread runs, so the process keeps its
  leases.
- **Ready** (``--ready``): alive, and the last beat reached Redis and found what the role needs.

The check runs on the process's own host (an exec probe with the same health dir), so the file's ``at``
is compared with the clock that wrote it. A Redis outage stalls the heartbeat thread, so a stale file makes
the check ask Redis itself: a running process whose Redis does not answer is alive (a restart cannot bring
Redis back) but not ready, and the line says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from pydantic import BaseModel, ConfigDict, ValidationError
from redis.backoff import NoBackoff
from redis.retry import Retry

from croqq.delivery import keys
from croqq.delivery.leases import Heartbeat
from croqq.delivery.redis_client import redis_url
from croqq.errors import ConfigError
from croqq.settings import Settings

if TYPE_CHECKING:
    from croqq.processes.runtime import GpuIdentity

log = logging.getLogger(__name__)

ROLES = ("coordinator", "build", "ideate", "writer", "beat", "gpu", "worker", "flower", "exporter")
BEATS_OF_AGE = 3  # a file older than this many beat intervals is stale
PROBE_TIMEOUT_S = 2.0


class HealthRecord(BaseModel):
    """One process's last beat (the JSON of its health file)."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    role: str
    node: str  # the Celery node name (or a label like beat@host)
    host: str  # socket.gethostname(): the pid is only meaningful there
    pid: int
    at: float  # time.time() of this host when the beat wrote the file
    interval_s: float  # the beat interval
    ready: bool  # the beat reached Redis
    redis_error: str = ""
    unreachable_since: float | None = (
        None  # first beat that did not reach Redis (since the last one that did)
    )
    gpu_uuid: str | None = None  # GPU workers only
    gpu_lease: bool | None = (
        None  # GPU workers: the GPU lease is held by this worker (None: Redis unreachable)
    )
    problems: list[str] = []  # other reasons the process is not ready


@dataclass(frozen=True)
class Verdict:
    ok: bool
    line: str


def beat_interval(settings: Settings) -> float:
    """The heartbeat interval of croqq processes (a quarter of the lease TTL)."""
    return settings.lease_ttl_s / 4


def health_path(settings: Settings, role: str, name: str = "") -> Path:
    if role not in ROLES:
        raise ConfigError(f"--role {role!r}: use one of {', '.join(ROLES)}")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return settings.resolved_health_dir() / (f"{role}-{safe}.json" if safe else f"{role}.json")


def write_record(path: Path, record: HealthRecord) -> None:
    """Replace ``path`` atomically (no fsync: a health file need not survive a power loss)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.model_dump_json())
    os.replace(tmp, path)


def read_record(path: Path) -> HealthRecord | None:
    try:
        return HealthRecord.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None


def quick_client(settings: Settings) -> redis.Redis:
    """A Redis client that answers within seconds and never retries (croqq's own clients wait minutes)."""
    url = redis_url(settings)
    kwargs: dict[str, object] = {}
    if url.startswith("unix://") and settings.redis_password is not None:
        kwargs["password"] = settings.redis_password.get_secret_value()
    if url.startswith("rediss://"):
        kwargs["ssl_cert_reqs"] = settings.redis_ssl_cert_reqs
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


def redis_error(client: redis.Redis) -> str | None:
    """Why Redis does not answer a PING, or None when it does."""
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


class Reporter:
    """The health beat of one process: ``hb.add("health", Reporter(...))``."""

    def __init__(
        self,
        settings: Settings,
        role: str,
        node: str,
        gpu: GpuIdentity | None = None,
        problems: Callable[[], list[str]] | None = None,
    ) -> None:
        self.path = health_path(settings, role, gpu.uuid if gpu is not None else "")
        self.role, self.node, self.gpu, self.problems = role, node, gpu, problems
        self.interval_s = beat_interval(settings)
        self.client = quick_client(settings)
        self.unreachable_since: float | None = None

    def __call__(self) -> None:
        error = redis_error(self.client)
        now = time.time()
        if error is None:
            self.unreachable_since = None
        elif self.unreachable_since is None:
            self.unreachable_since = now
        gpu_lease = None
        if self.gpu is not None and error is None:
            gpu_lease = self.client.get(keys.lease(f"gpu:{self.gpu.uuid}")) == self.gpu.owner
        record = HealthRecord(
            role=self.role,
            node=self.node,
            host=socket.gethostname(),
            pid=os.getpid(),
            at=now,
            interval_s=self.interval_s,
            ready=error is None,
            redis_error=error or "",
            unreachable_since=self.unreachable_since,
            gpu_uuid=self.gpu.uuid if self.gpu is not None else None,
            gpu_lease=gpu_lease,
            problems=self.problems() if self.problems is not None and error is None else [],
        )
        write_record(self.path, record)


def reporter(settings: Settings, role: str, node: str) -> Reporter:
    """The health beat of a Celery worker process (a GPU worker's from its CROQQ_GPU_* environment)."""
    from croqq.processes.runtime import GpuIdentity

    return Reporter(settings, role, node, gpu=GpuIdentity.from_env() if role == "gpu" else None)


def start_heartbeat(settings: Settings, beat: Reporter) -> Heartbeat:
    """A heartbeat thread for a process that has none of its own (the supervisor, Flower)."""
    hb = Heartbeat(beat_interval(settings), name=f"croqq-{beat.role}-heartbeat")
    hb.add("health", beat)
    return hb.start()


def gpu_problems(settings: Settings, uuids: list[str]) -> list[str]:
    """What keeps the GPU workers of ``uuids`` (this host's, same health dir) from being ready."""
    found = []
    for uuid in uuids:
        verdict = check(settings, "gpu", uuid, want_ready=True, redis_probe=lambda: None)
        if not verdict.ok:
            found.append(f"GPU {uuid}: {verdict.line}")
    return found


def http_problems(url: str) -> list[str]:
    """[] when ``url`` answers 200 within seconds, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as reply:
            if reply.status == 200:
                return []
            return [f"{url} answered HTTP {reply.status}"]
    except OSError as exc:
        return [f"{url} does not answer: {exc}"]


# -- the check ------------------------------------------------------------------------------------------


def check(
    settings: Settings,
    role: str,
    name: str = "",
    want_ready: bool = False,
    max_age_s: float | None = None,
    now: float | None = None,
    redis_probe: Callable[[], str | None] | None = None,
) -> Verdict:
    """Judge ``<role>[-<name>]``'s health file; ``redis_probe`` (default: a PING with ``settings``) is
    asked only when the file is stale."""
    path = health_path(settings, role, name)
    try:
        record = read_record(path)
    except (OSError, ValidationError) as exc:
        return Verdict(False, f"unreadable health file {path}: {_first_line(exc)}")
    if record is None:
        return Verdict(False, _missing(path, role))
    now = time.time() if now is None else now
    max_age = max_age_s if max_age_s is not None else BEATS_OF_AGE * record.interval_s
    age = now - record.at
    who = f"{record.node} (pid {record.pid})"
    if age > max_age:
        return _stale(record, who, age, max_age, want_ready, redis_probe or (lambda: _probe(settings)))
    if not want_ready:
        return Verdict(True, f"{who} alive: last beat {age:.1f} s ago")
    problem = _not_ready(record)
    if problem:
        return Verdict(False, f"{who} not ready: {problem}")
    return Verdict(True, f"{who} ready: last beat {age:.1f} s ago reached Redis")


def _probe(settings: Settings) -> str | None:
    client = quick_client(settings)
    try:
        return redis_error(client)
    finally:
        client.close()


def _stale(
    record: HealthRecord,
    who: str,
    age: float,
    max_age: float,
    want_ready: bool,
    redis_probe: Callable[[], str | None],
) -> Verdict:
    late = f"stale by {age - max_age:.0f} s (last beat at {_stamp(record.at)}, max age {max_age:g} s)"
    if _gone(record):
        return Verdict(False, f"{who}: {late}; pid {record.pid} no longer runs")
    error = redis_probe()
    if error is None:
        return Verdict(False, f"{who}: {late}; Redis answers, so its heartbeat is stuck")
    waits = f"its heartbeat waits for Redis, which does not answer now ({error}); last beat {age:.0f} s ago"
    return Verdict(not want_ready, f"{who} {'not ready' if want_ready else 'alive'}: {waits}")


def _not_ready(record: HealthRecord) -> str:
    if not record.ready:
        since = record.unreachable_since or record.at
        return f"Redis unreachable since {_stamp(since)} ({record.at - since:.0f} s): {record.redis_error}"
    if record.gpu_lease is False:
        return f"GPU {record.gpu_uuid}'s lease is held by another process"
    return "; ".join(record.problems)


def _gone(record: HealthRecord) -> bool:
    """The record's process no longer exists (judged only on the host, and so PID namespace, it names)."""
    if record.host != socket.gethostname():
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _missing(path: Path, role: str) -> str:
    line = f"no health file {path}: no {role} runs here, or it has not beaten yet"
    with contextlib.suppress(OSError):
        named = sorted(p.name for p in path.parent.glob(f"{role}-*.json"))
        if named and path.name == f"{role}.json":
            line += f" (found {', '.join(named)}: pass --name)"
    return line


def _stamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
