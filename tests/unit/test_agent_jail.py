"""The agent jail in each mode: outside its workspace nothing is writable (bubblewrap, or croqq's own view
built with unshare where bubblewrap is missing), a preset whose network policy is ``none`` reaches nothing,
and an ideate worker whose agents would run unjailed raises the alarm ``agents_unjailed``."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from croqq.delivery.leases import Heartbeat
from croqq.domain.records import Idea, Rejection
from croqq.processes.redis_server import RedisServer
from croqq.proposers.agent import jail
from croqq.proposers.agent.presets import PRESETS
from croqq.proposers.agent.proposer import AgentProposer
from croqq.work import alarms
from tests.agents import JAILS, MANIFEST, MODES, context, fixture_agent, settings


@pytest.fixture
def outside() -> Iterator[Path]:
    path = Path("/tmp") / f"croqq-escape-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", MODES)
def test_jailed_an_agent_writes_its_workspace_but_nothing_outside_it(mode: str, outside: Path) -> None:
    answer = AgentProposer(MANIFEST, fixture_agent("escape.py", outside, agent_jail=mode)).propose(context())
    assert isinstance(answer, Idea), answer  # its answer inside the workspace was written and read back
    if mode == "none":  # what the jail is for: unjailed, the write lands
        assert outside.exists() and "outside write written" in answer.summary
    else:
        assert not outside.exists(), f"{mode}: the agent wrote {outside}"
        assert "outside write refused (Read-only file system)" in answer.summary


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.mark.parametrize("mode", JAILS)
def test_an_agent_without_network_cannot_connect_to_the_host(mode: str, listener: int) -> None:
    reached = AgentProposer(
        MANIFEST, fixture_agent("connect.py", listener, agent_jail=mode, agent_network="host")
    ).propose(context())
    assert isinstance(reached, Rejection) and "exited 8" in reached.reason, reached  # it can, with host
    cut = AgentProposer(
        MANIFEST, fixture_agent("connect.py", listener, agent_jail=mode, agent_network="none")
    ).propose(context())
    assert isinstance(cut, Rejection) and "exited 7" in cut.reason and "cannot connect" in cut.reason, cut


def test_the_scripted_agent_has_no_network_and_api_agents_have_the_hosts() -> None:
    assert jail.network(PRESETS["scripted"], settings()) == "none"
    assert {jail.network(PRESETS[name], settings()) for name in ("claude", "codex", "aider")} == {"host"}
    assert jail.network(PRESETS["claude"], settings(agent_network="none")) == "none"


def _jail_alarm_after_one_beat(
    server: RedisServer, client: redis.Redis, agent_jail: str
) -> list[alarms.Alarm]:
    from croqq.cli.processes import _jail_alarm

    beats, on_exit = _jail_alarm(settings(agent_jail=agent_jail, broker_url=server.url))
    hb = Heartbeat(60.0)
    beats(hb)
    hb.beat_now()
    found = [a for a in alarms.active(client) if a.name == jail.ALARM]
    if agent_jail == "none":  # the worker's exit clears it
        on_exit()
        assert [a for a in alarms.active(client) if a.name == jail.ALARM] == []
    return found


@pytest.mark.parametrize("mode", JAILS)
def test_agents_run_unjailed_raise_an_alarm_that_a_working_jail_clears(
    redis_server: RedisServer, redis_client: redis.Redis, mode: str
) -> None:
    raised = _jail_alarm_after_one_beat(redis_server, redis_client, "none")
    assert len(raised) == 1 and raised[0].message.startswith("agents run WITHOUT a jail on this host")
    _jail_alarm_after_one_beat(redis_server, redis_client, "none")
    alarms.raise_alarm(redis_client, jail.ALARM, "left by an earlier start of this worker")
    assert _jail_alarm_after_one_beat(redis_server, redis_client, mode) == []
