"""Redis connections for live state (the broker connection belongs to Celery/kombu).

Every client retries on connection errors with backoff, so a Redis restart (kill -9, AOF replay)
stalls croqq processes instead of crashing them.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

from croqq.settings import Settings

_CLIENTS: dict[tuple[int, str], redis.Redis] = {}


def _with_password(url: str, settings: Settings) -> str:
    if settings.redis_password is None or "@" in url or url.startswith("unix://"):
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://:{quote(settings.redis_password.get_secret_value(), safe='')}@{rest}"


def redis_url(settings: Settings) -> str:
    return _with_password(settings.resolved_broker_url(), settings)


def kombu_url(settings: Settings) -> str:
    """The broker URL in kombu's spelling (unix sockets are ``redis+socket://``)."""
    url = redis_url(settings)
    if url.startswith("unix://"):
        return "redis+socket://" + url[len("unix://") :]
    return url


def strs(values: Any) -> list[str]:
    """Redis replies as str (clients decode responses; this narrows redis-py's bytes | str types)."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def text(value: Any) -> str | None:
    return None if value is None else (value.decode() if isinstance(value, bytes) else str(value))


def redis_run_id(client: redis.Redis) -> str:
    """The id of the running Redis process: it changes on every restart, restore or failover."""
    return str(client.info("server")["run_id"])


def make_client(url: str, settings: Settings | None = None, retries: int = 600) -> redis.Redis:
    """A client that rides out a Redis restart: up to ``retries`` reconnects, backing off to 1 s apart."""
    kwargs: dict[str, object] = {}
    if url.startswith("unix://") and settings is not None and settings.redis_password is not None:
        kwargs["password"] = settings.redis_password.get_secret_value()
    if url.startswith("rediss://") and settings is not None:
        kwargs["ssl_cert_reqs"] = settings.redis_ssl_cert_reqs
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.02), retries=retries)
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        retry=retry,
        retry_on_error=[ConnectionError, TimeoutError, BusyLoadingError, ConnectionRefusedError],
        socket_timeout=5,  # a command caught by a partition fails over to a new connection after the heal
        socket_connect_timeout=2,
        health_check_interval=15,
        **kwargs,
    )


def connect(settings: Settings) -> redis.Redis:
    """The process's client for the live-state Redis (one per process and URL; fork-safe)."""
    url = redis_url(settings)
    key = (os.getpid(), url)
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = make_client(url, settings)
    return client


def require_redis(settings: Settings, timeout_s: float = 3.0) -> None:
    """Fail fast, in one line, when the live-state Redis cannot be reached (CLI commands call this)."""
    from croqq.errors import ConfigError

    url = redis_url(settings)
    probe = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        probe.ping()
    except redis.RedisError as exc:
        shown = settings.resolved_broker_url()
        raise ConfigError(
            f"cannot reach Redis at {shown} ({exc}); "
            "start a local cluster with `croqq up` or set CROQQ_BROKER_URL"
        ) from exc
    finally:
        probe.close()
