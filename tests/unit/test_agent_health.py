"""Agent health and budget in Redis: repeated failures back an agent off (its shapes wait), a success
makes it healthy again, and a spent budget stops ideation; `croqq status` shows both."""

from __future__ import annotations

import pytest
import redis
from rich.console import Console

from croqq.cli.view import render
from croqq.delivery import keys
from croqq.domain.records import AgentUsage, Idea, Rejection
from croqq.errors import DeferredError
from croqq.settings import Settings
from croqq.work import agents
from croqq.work.progress import snapshot

# a back-off far longer than the test's own steps take on a busy machine; the test ends it on Redis's clock
SETTINGS = Settings(agent_backoff_after=2, agent_backoff_s=600.0, agent_backoff_max_s=600.0)


def fail(cost: float = 0.0) -> Rejection:
    usage = AgentUsage(agent="claude", wall_s=3.0, exit_code=1, cost_usd=cost or None)
    return Rejection(
        proposer="claude", reason="agent claude exited 1 (error): overloaded", kind="agent", agent=usage
    )


def success(cost: float = 0.0) -> Idea:
    usage = AgentUsage(agent="claude", wall_s=2.0, exit_code=0, cost_usd=cost or None, input_tokens=100)
    return Idea(summary="s", tag="s", knobs={}, content_hash="c" * 64, proposer="claude", agent=usage)


def end_backoff(client: redis.Redis, agent: str) -> None:
    """Let the back-off pass: move its end just before now (Redis's clock)."""
    client.hset(keys.agent_health(agent), "backoff_until", repr(agents.redis_now(client) - 0.01))


def shown(client: redis.Redis) -> str:
    console = Console(width=200, record=True)
    console.print(render(snapshot(client)))
    return console.export_text()


def test_repeated_failures_back_off_then_a_success_heals(redis_client: redis.Redis) -> None:
    agents.record_call(redis_client, "claude", fail(), SETTINGS)
    agents.wait_until_allowed(redis_client, "claude", "k")  # one failure: not yet backed off
    agents.record_call(redis_client, "claude", fail(), SETTINGS)
    with pytest.raises(DeferredError, match="backed off"):
        agents.wait_until_allowed(redis_client, "claude", "k")
    (health,) = agents.health(redis_client)
    assert not health.healthy and health.failures == 2 and "overloaded" in health.last_error
    assert "claude" in shown(redis_client) and "backed off" in shown(redis_client)
    end_backoff(redis_client, "claude")
    agents.wait_until_allowed(redis_client, "claude", "k")  # due for a retry
    agents.record_call(redis_client, "claude", success(), SETTINGS)
    (health,) = agents.health(redis_client)
    assert health.healthy and health.calls == 3 and health.wall_s == pytest.approx(8.0)


def test_a_check_failure_counts_a_repeat_is_a_working_agent(redis_client: redis.Redis) -> None:
    check = Rejection(proposer="claude", reason="agent claude: line 3: cudaEvent...", kind="check")
    repeat = Rejection(
        proposer="claude", reason="agent claude: returned the best source unchanged", kind="repeat"
    )
    agents.record_call(redis_client, "claude", check, SETTINGS)
    assert agents.health(redis_client)[0].failures == 1
    agents.record_call(redis_client, "claude", repeat, SETTINGS)
    assert agents.health(redis_client)[0].failures == 0


def test_a_spent_budget_stops_ideation_and_status_says_so(redis_client: redis.Redis) -> None:
    agents.set_budget(redis_client, 2, None)
    agents.record_call(redis_client, "claude", success(0.4), SETTINGS)
    agents.wait_until_allowed(redis_client, "claude", "k")
    agents.record_call(redis_client, "claude", success(0.4), SETTINGS)
    with pytest.raises(DeferredError, match="agent budget spent: 2/2 calls"):
        agents.wait_until_allowed(redis_client, "claude", "k")
    assert "SPENT" in shown(redis_client)
    agents.set_budget(redis_client, 0, 0.5)  # calls unlimited, but $0.80 > $0.50
    with pytest.raises(DeferredError, match=r"\$0.80/\$0.50"):
        agents.wait_until_allowed(redis_client, "claude", "k")
    agents.set_budget(redis_client, None, 5.0)
    agents.wait_until_allowed(redis_client, "claude", "k")
