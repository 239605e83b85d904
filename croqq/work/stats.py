"""Counters for progress, status and benchmarks, updated inside the ledger's STORE transaction.

croqq:stats             hash: stored, stored:<dtype>, attempts, attempts:<reason> (compile, check,
                        agent, repeat), KEEP, DISCARD, FAIL, BASELINE, redispatch, quarantines,
                        migrations, offline
croqq:overhead          list: per-iteration control-plane overhead in ms (newest first, capped)
croqq:gpu_busy:<uuid>   hash: busy_s, steps, first, last (duty cycle)
"""

from __future__ import annotations

from typing import Any

import redis

from croqq.delivery import clock, keys
from croqq.delivery.state import ShapeState
from croqq.domain.fsm import Stored

OVERHEAD = keys.OVERHEAD
OVERHEAD_CAP = 200_000


def on_stored(pipe: Any, before: ShapeState, after: ShapeState, event: Stored) -> None:
    """Ledger hook (pipe in multi mode): count what was just stored."""
    pending = before.loop.pending
    if event.iteration is None:
        reason = pending.rejection.kind if pending and pending.rejection else "compile"
        pipe.hincrby(keys.STATS, "attempts", 1)
        pipe.hincrby(keys.STATS, f"attempts:{reason}", 1)
        return
    decision = (pending.decision if pending else None) or "BASELINE"
    pipe.hincrby(keys.STATS, "stored", 1)
    pipe.hincrby(keys.STATS, f"stored:{before.dtype}", 1)
    pipe.hincrby(keys.STATS, "FAIL" if decision.startswith("FAIL_") else decision, 1)
    if before.iter_t0 > 0:
        overhead_ms = 1000.0 * max(0.0, (clock.now(pipe) - before.iter_t0) - before.iter_exec_s)
        pipe.lpush(OVERHEAD, f"{overhead_ms:.3f}")
        pipe.ltrim(OVERHEAD, 0, OVERHEAD_CAP - 1)


def record_busy(client: redis.Redis, uuid: str, start: float, end: float, clear_current: str = "") -> None:
    """Add a busy interval to the GPU's totals (and clear its 'current step', in the same round trip)."""
    pipe = client.pipeline(transaction=False)
    if clear_current:
        pipe.hset(clear_current, mapping={"current": "", "since": repr(end)})
    pipe.hincrbyfloat(keys.gpu_busy(uuid), "busy_s", end - start)
    pipe.hincrby(keys.gpu_busy(uuid), "steps", 1)
    pipe.hsetnx(keys.gpu_busy(uuid), "first", repr(start))
    pipe.hset(keys.gpu_busy(uuid), "last", repr(end))
    pipe.execute()


def counters(client: redis.Redis) -> dict[str, int]:
    return {str(k): int(v) for k, v in client.hgetall(keys.STATS).items()}


def overhead_samples(client: redis.Redis) -> list[float]:
    return [float(x) for x in client.lrange(OVERHEAD, 0, -1)]


def busy(client: redis.Redis, uuid: str) -> dict[str, float]:
    return {str(k): float(v) for k, v in client.hgetall(keys.gpu_busy(uuid)).items()}
