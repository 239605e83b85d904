"""Counters for progress, status, metrics and benchmarks, updated inside the ledger's STORE transaction.

croqq:stats             hash: stored, stored:<dtype>, attempts, attempts:<reason> (compile, check,
                        agent, repeat), KEEP, DISCARD, FAIL, BASELINE, redispatch, lease_expired,
                        quarantines, migrations, offline
croqq:overhead          list: per-iteration control-plane overhead in ms (newest first, capped)
croqq:gpu_busy:<uuid>   hash: busy_s, steps, first, last (duty cycle)
croqq:commit_seconds    hash: the writer's commit times as a histogram: le:<bound> (commits in that
                        bucket only, le:+Inf above the last bound), sum, count; one pipelined round trip
                        per commit (``ResultsWriter.on_commit``)
croqq:compile_seconds   hash: the build workers' compile times per kernel family, the same histogram with
                        fields <dsl>|le:<bound>, <dsl>|sum, <dsl>|count (cached builds and knob rules aside)
croqq:repo_bytes        string: the results repo's .git size, published by the writer's periodic flush
"""

from __future__ import annotations

from typing import Any

import redis

from croqq.delivery import clock, keys
from croqq.delivery.state import ShapeState
from croqq.domain.fsm import Stored

OVERHEAD = keys.OVERHEAD
OVERHEAD_CAP = 200_000
COMMIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMPILE_BUCKETS_S = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)  # mma.sync ~4 s, CUTLASS ~50 s


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


def _record(
    client: redis.Redis, key: str, bounds: tuple[float, ...], seconds: float, prefix: str = ""
) -> None:
    """Count ``seconds`` in the histogram hash ``key`` (fields ``<prefix>le:<bound>``, sum, count)."""
    bucket = next((f"le:{b}" for b in bounds if seconds <= b), "le:+Inf")
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(key, prefix + bucket, 1)
    pipe.hincrbyfloat(key, prefix + "sum", seconds)
    pipe.hincrby(key, prefix + "count", 1)
    pipe.execute()


def _histogram(
    raw: dict[str, str], bounds: tuple[float, ...], prefix: str = ""
) -> tuple[list[tuple[str, float]], float]:
    """A stored histogram as Prometheus wants it: cumulative (bound, count) pairs ending with +Inf, and
    the sum of the seconds."""
    out, total = [], 0.0
    for bound in [str(b) for b in bounds] + ["+Inf"]:
        total += float(raw.get(f"{prefix}le:{bound}", 0))
        out.append((bound, total))
    return out, float(raw.get(prefix + "sum", 0.0))


def record_commit(client: redis.Redis, seconds: float) -> None:
    """Count one commit of ``seconds`` (one round trip)."""
    _record(client, keys.COMMIT_SECONDS, COMMIT_BUCKETS_S, seconds)


def commit_histogram(raw: dict[str, str]) -> tuple[list[tuple[str, float]], float]:
    return _histogram(raw, COMMIT_BUCKETS_S)


def record_compile(client: redis.Redis, dsl: str, seconds: float) -> None:
    """Count one compile of a kernel family (one round trip)."""
    _record(client, keys.COMPILE_SECONDS, COMPILE_BUCKETS_S, seconds, f"{dsl}|")


def compile_histograms(raw: dict[str, str]) -> dict[str, tuple[list[tuple[str, float]], float]]:
    """dsl -> its compile-time histogram (as :func:`commit_histogram`)."""
    families = sorted({field.split("|", 1)[0] for field in raw if "|" in field})
    return {dsl: _histogram(raw, COMPILE_BUCKETS_S, f"{dsl}|") for dsl in families}


def record_repo_bytes(client: redis.Redis, size: int) -> None:
    client.set(keys.REPO_BYTES, str(size))


def record_busy(
    client: redis.Redis, uuid: str, start: float, end: float, clear_current: str = "", kernels: int = 1
) -> None:
    """Add a busy interval and the kernels measured in it to the GPU's totals (and clear its 'current
    step', in the same round trip)."""
    pipe = client.pipeline(transaction=False)
    if clear_current:
        pipe.hset(clear_current, mapping={"current": "", "since": repr(end)})
    pipe.hincrbyfloat(keys.gpu_busy(uuid), "busy_s", end - start)
    pipe.hincrby(keys.gpu_busy(uuid), "steps", 1)
    pipe.hincrby(keys.gpu_busy(uuid), "measurements", kernels)
    pipe.hsetnx(keys.gpu_busy(uuid), "first", repr(start))
    pipe.hset(keys.gpu_busy(uuid), "last", repr(end))
    pipe.execute()


def counters(client: redis.Redis) -> dict[str, int]:
    return {str(k): int(v) for k, v in client.hgetall(keys.STATS).items()}


def overhead_samples(client: redis.Redis) -> list[float]:
    return [float(x) for x in client.lrange(OVERHEAD, 0, -1)]


def busy(client: redis.Redis, uuid: str) -> dict[str, float]:
    return {str(k): float(v) for k, v in client.hgetall(keys.gpu_busy(uuid)).items()}
