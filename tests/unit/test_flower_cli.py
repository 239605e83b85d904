"""`croqq flower` refuses to serve a network without a login (one line, exit 2, nothing started), and its
logins reach Flower in-process only."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from croqq.processes.flower import flower_argv
from croqq.processes.webauth import Logins
from croqq.settings import Settings
from tests.output import error_line
from tests.ports import free_port

Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("address", ["0.0.0.0", "10.0.0.5"])
def test_flower_on_a_network_address_without_login_is_refused_and_starts_nothing(
    cluster_env: dict[str, str], redis_client: redis.Redis, croqq: Cli, address: str
) -> None:
    port = free_port()
    result = croqq(cluster_env, "flower", "--address", address, "--port", str(port))
    assert result.returncode == 2
    assert error_line(result.stderr) == (
        f"croqq: error: refusing to serve flower on {address} without a login: set "
        "CROQQ_FLOWER_BASIC_AUTH=user:password (or CROQQ_FLOWER_BASIC_AUTH_FILE), or listen on 127.0.0.1"
    )
    assert not listening(port) and redis_client.dbsize() == 0
    assert not (Path(cluster_env["CROQQ_RUN_DIR"]) / "health").exists()  # no heartbeat either


def test_an_unreadable_login_file_is_refused_in_one_line(cluster_env: dict[str, str], croqq: Cli) -> None:
    env = {**cluster_env, "CROQQ_FLOWER_BASIC_AUTH_FILE": "/nonexistent/flower-auth"}
    result = croqq(env, "flower", "--address", "0.0.0.0")
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "CROQQ_FLOWER_BASIC_AUTH_FILE=/nonexistent/flower-auth: cannot read it" in line, result.stderr


def test_flower_gets_the_logins_and_croqq_decides_the_events() -> None:
    argv = flower_argv(Settings(lease_ttl_s=2.5), 5555, "0.0.0.0", Logins((("ops", "pw"), ("b", "c"))))
    assert "--basic_auth=ops:pw,b:c" in argv
    assert "--enable_events=False" in argv  # Flower never overrules CROQQ_TASK_EVENTS=false
    assert "--purge_offline_workers=3" in argv  # gone from the list as soon as the registry forgets it
    assert not any(a.startswith("--basic_auth") for a in flower_argv(Settings(), 1, "127.0.0.1", Logins(())))
    assert "--read_only=True" in flower_argv(Settings(), 1, "127.0.0.1", Logins(()), read_only=True)
