"""Agent health (back-off after repeated failures) and the agent budget, kept in Redis.

``croqq:agent:<name>``   hash: calls, failures (consecutive), backoff_until (Redis clock), last_error,
                         wall_s, cost_usd, input_tokens, output_tokens
``croqq:agents``         set: the names of the agents above (the exporter reads them without a SCAN)
``croqq:agent_budget``   hash: max_calls, max_usd (set by ``croqq submit --agent-calls/--agent-usd``;
                         0 or absent: no limit), calls, usd (spent)

A proposer call that comes back as a Rejection of kind ``agent`` or ``check`` is a failure; after
``agent_backoff_after`` in a row the agent is backed off (``agent_backoff_s``, doubling up to
``agent_backoff_max_s``) and reported unhealthy by ``croqq status``. While it is backed off, or while the
budget is spent, IDEATE steps are deferred: they go back to their queue after a pause and the shapes wait
(never parked). The first successful call after the back-off makes the agent healthy again. Every time
is Redis's ``TIME``, so hosts with skewed clocks agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from croqq.delivery import keys
from croqq.domain.records import FAILING_KINDS, Idea, Rejection
from croqq.errors import DeferredError
from croqq.settings import Settings, get_settings

DEFER_SLEEP_S = 5.0


def redis_now(client: redis.Redis) -> float:
    sec, usec = client.time()
    return float(sec) + float(usec) / 1e6


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(raw: dict[str, str], name: str) -> float:
    try:
        return float(raw.get(name, 0) or 0)
    except ValueError:
        return 0.0


def _hash(client: redis.Redis, key: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in client.hgetall(key).items()}


@dataclass(frozen=True)
class Budget:
    max_calls: int
    max_usd: float
    calls: int
    usd: float

    @property
    def spent(self) -> str:
        """Why the budget is spent ('' while it is not)."""
        if self.max_calls and self.calls >= self.max_calls:
            return f"agent budget spent: {self.calls}/{self.max_calls} calls"
        if self.max_usd and self.usd >= self.max_usd:
            return f"agent budget spent: ${self.usd:.2f}/${self.max_usd:.2f}"
        return ""


def budget(client: redis.Redis) -> Budget:
    raw = _hash(client, keys.AGENT_BUDGET)
    return Budget(
        int(_float(raw, "max_calls")), _float(raw, "max_usd"), int(_float(raw, "calls")), _float(raw, "usd")
    )


def set_budget(client: redis.Redis, max_calls: int | None, max_usd: float | None) -> None:
    """Set the limits that are given (0 removes one); what was spent so far is kept."""
    if max_calls is not None:
        client.hset(keys.AGENT_BUDGET, "max_calls", str(max_calls))
    if max_usd is not None:
        client.hset(keys.AGENT_BUDGET, "max_usd", repr(max_usd))


@dataclass(frozen=True)
class AgentHealth:
    name: str
    calls: int
    failures: int
    backoff_s: float  # remaining back-off (0: healthy or due for a retry)
    last_error: str
    wall_s: float
    cost_usd: float

    @property
    def healthy(self) -> bool:
        return self.backoff_s <= 0 and self.failures < get_settings().agent_backoff_after


def health(client: redis.Redis) -> list[AgentHealth]:
    """Every agent that was called (``croqq:agents``), in two round trips: a SCAN for their hashes walks
    the whole keyspace, step records included, and the live view asks twice a second."""
    now = redis_now(client)
    names = sorted(_text(n) for n in client.smembers(keys.AGENTS))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.agent_health(name))
    out = []
    for name, found in zip(names, pipe.execute(), strict=True):
        raw = {_text(k): _text(v) for k, v in found.items()}
        out.append(
            AgentHealth(
                name=name,
                calls=int(_float(raw, "calls")),
                failures=int(_float(raw, "failures")),
                backoff_s=max(0.0, _float(raw, "backoff_until") - now),
                last_error=raw.get("last_error", ""),
                wall_s=_float(raw, "wall_s"),
                cost_usd=_float(raw, "cost_usd"),
            )
        )
    return out


def wait_until_allowed(client: redis.Redis, agent: str, key: str) -> None:
    """Raise DeferredError while the budget is spent or the agent is backed off."""
    spent = budget(client).spent
    if spent:
        raise DeferredError(f"{key}: not ideating, {spent} (raise it with croqq submit --agent-calls)")
    until = _float(_hash(client, keys.agent_health(agent)), "backoff_until")
    left = until - redis_now(client)
    if left > 0:
        raise DeferredError(
            f"{key}: agent {agent} is backed off for {left:.0f} s more", min(left, DEFER_SLEEP_S)
        )


def record_call(
    client: redis.Redis, agent: str, answer: Idea | Rejection, settings: Settings | None = None
) -> None:
    """Count one call (budget, usage) and update the agent's health."""
    settings = settings or get_settings()
    usage = answer.agent
    name = keys.agent_health(agent)
    pipe = client.pipeline(transaction=True)
    pipe.sadd(keys.AGENTS, agent)
    pipe.hincrby(keys.AGENT_BUDGET, "calls", 1)
    pipe.hincrby(name, "calls", 1)
    if usage is not None:
        pipe.hincrbyfloat(name, "wall_s", usage.wall_s)
        if usage.cost_usd:
            pipe.hincrbyfloat(keys.AGENT_BUDGET, "usd", usage.cost_usd)
            pipe.hincrbyfloat(name, "cost_usd", usage.cost_usd)
        for field in ("input_tokens", "output_tokens"):
            value = getattr(usage, field)
            if value:
                pipe.hincrby(name, field, value)
    failed = isinstance(answer, Rejection) and answer.kind in FAILING_KINDS
    if not failed:
        pipe.hset(name, mapping={"failures": 0, "backoff_until": 0})
        pipe.execute()
        return
    pipe.hincrby(name, "failures", 1)
    pipe.hset(name, "last_error", answer.reason[:300] if isinstance(answer, Rejection) else "")
    failures = int(pipe.execute()[-2])
    extra = failures - settings.agent_backoff_after
    if extra >= 0:
        backoff = min(settings.agent_backoff_max_s, settings.agent_backoff_s * 2.0**extra)
        client.hset(name, "backoff_until", repr(redis_now(client) + backoff))
