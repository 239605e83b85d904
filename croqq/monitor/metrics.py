"""The Prometheus view of a cluster: a collector that reads Redis on every scrape and keeps no state.

Any number of exporters may run and a restarted one loses nothing: every figure is read back from the keys
the cluster already keeps (``croqq.delivery.keys``), in two pipelined round trips per scrape (the second
one per GPU and per agent named by the first), so a scrape costs about the same at 64 GPUs as at one.

Queue lengths come from kombu's Redis transport, which keeps a queue as one list per priority step
(``<queue>``, then ``<queue>\\x06\\x16<step>`` for steps 3, 6 and 9); they are summed per queue.
Counters are the cluster's own (``croqq:stats``, ``croqq:gpu_busy:<uuid>``, ``croqq:agent:<name>``), so
Prometheus's ``rate()`` works across exporter restarts; they restart from zero only when Redis forgets
them (a FLUSHALL), which ``rate()`` reads as a counter reset. Duty is busy seconds over the wall seconds
since the GPU's first busy interval (Redis's clock); ``rate(croqq_gpu_busy_seconds_total[5m])`` is the
recent duty.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import get_args

import redis
from kombu.transport.redis import PRIORITY_STEPS, Channel
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from croqq.delivery import keys, queues
from croqq.delivery.memory import RedisMemory
from croqq.delivery.redis_client import strs
from croqq.delivery.state import ShapeSummary
from croqq.placement.registry import HEALTHY, OFFLINE, QUARANTINED, GpuEntry
from croqq.store.schema import AttemptKind
from croqq.work import progress, stats
from croqq.work.alarms import Alarm, redis_alarms

log = logging.getLogger(__name__)
GPU_STATES = (HEALTHY, QUARANTINED, OFFLINE)
SHAPE_STATUSES = ("pending", "active", "done", "error")
DECISIONS = ("KEEP", "DISCARD", "FAIL", "BASELINE")
ATTEMPT_REASONS = tuple(r for kinds in get_args(AttemptKind) for r in get_args(kinds))  # compile, agent, ...
# kombu's Redis key layout read here (a queue's list per priority step), checked on
# kombu >= 5.7, < 5.8 (tests/unit/test_third_party_pins.py)
KOMBU_CHECKED = ("5.7", "5.8")
KOMBU_INTERNALS = (
    "kombu.transport.redis:PRIORITY_STEPS",
    "kombu.transport.redis:Channel.sep",
    "kombu.transport.redis:Channel._q_for_pri",
)
EVENT_COUNTERS = {  # croqq:stats field -> metric (without _total), help
    "lease_expired": ("croqq_lease_expiries", "Running steps whose lease expired and beat reclaimed."),
    "redispatch": ("croqq_redispatches", "Steps put back in their queue with a new epoch."),
    "quarantines": ("croqq_quarantines", "GPUs quarantined (persistently unhealthy)."),
    "migrations": ("croqq_migrations", "Shapes moved off a quarantined or offline GPU."),
    "offline": ("croqq_gpus_marked_offline", "GPUs marked offline (their worker went away)."),
}


def broker_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps one queue in (one per priority step)."""
    return [queue] + [f"{queue}{Channel.sep}{step}" for step in PRIORITY_STEPS if step]


@dataclass
class Reading:
    """What one scrape read from Redis (raw replies, parsed by :func:`families`)."""

    now: float
    summary: dict[str, str]
    counters: dict[str, str]
    commits: dict[str, str]
    compiles: dict[str, str]
    repo_bytes: str | None
    queue_lengths: dict[str, int]
    gpus: list[tuple[GpuEntry, dict[str, str], int, int]]  # entry, busy hash, depth, active shapes
    agents: dict[str, dict[str, str]]
    alarms: list[Alarm] = dataclasses.field(default_factory=list)
    memory: RedisMemory | None = None


def read(client: redis.Redis, dsls: Sequence[str] = ()) -> Reading:
    """Everything a scrape shows, in two pipelined round trips (the build queue of each of ``dsls``)."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for key in (keys.SUMMARY, keys.STATS, keys.COMMIT_SECONDS, keys.COMPILE_SECONDS):
        pipe.hgetall(key)
    pipe.get(keys.REPO_BYTES)
    pipe.smembers(keys.GPUS)
    pipe.smembers(keys.AGENTS)
    pipe.hvals(keys.ALARMS)
    pipe.info("memory")
    (
        (sec, usec),
        summary,
        counters,
        commits,
        compiles,
        repo_bytes,
        uuid_set,
        agent_set,
        alarms,
        info,
    ) = pipe.execute()
    now = float(sec) + float(usec) / 1e6
    memory = RedisMemory.from_info(info)
    uuids, names = sorted(strs(uuid_set)), sorted(strs(agent_set))
    names_of_queues = [queues.CONTROL, queues.IDEATE, queues.STORE, *map(queues.build_queue, dsls)]
    names_of_queues += [queues.gpu_queue(u) for u in uuids]
    for queue in names_of_queues:
        for name in broker_lists(queue):
            pipe.llen(name)
    for uuid in uuids:
        pipe.hgetall(keys.gpu(uuid))
        pipe.hgetall(keys.gpu_busy(uuid))
        pipe.hget(keys.depth(uuid), "depth")
        pipe.scard(keys.active(uuid))
    for name in names:
        pipe.hgetall(keys.agent_health(name))
    replies = iter(pipe.execute())
    steps = len(broker_lists(queues.CONTROL))
    lengths = {q: sum(int(next(replies)) for _ in range(steps)) for q in names_of_queues}
    gpus = []
    for _ in uuids:
        entry, busy, depth, active = (next(replies) for _ in range(4))
        if entry:  # listed, but its hash is gone (Redis lost part of it): skipped until re-registered
            gpus.append((GpuEntry.model_validate(entry), busy, int(depth or 0), int(active)))
    return Reading(
        now=now,
        summary=summary,
        counters=counters,
        commits=commits,
        compiles=compiles,
        repo_bytes=repo_bytes,
        queue_lengths=lengths,
        gpus=gpus,
        agents={name: next(replies) for name in names},
        alarms=[Alarm.model_validate_json(v) for v in alarms] + redis_alarms(memory, now),
        memory=memory,
    )


def _num(raw: dict[str, str], field: str) -> float:
    try:
        return float(raw.get(field) or 0)
    except ValueError:
        return 0.0


def _gauge(name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], float]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def _counter(name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], float]]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def work_families(r: Reading) -> Iterator[Metric]:
    """Queues, shapes, iterations, attempts, recovery events."""
    yield _gauge(
        "croqq_queue_messages",
        "Messages waiting in each Celery queue (every priority list summed).",
        ["queue"],
        (([q], n) for q, n in r.queue_lengths.items()),
    )
    tally = progress.tally(ShapeSummary.model_validate_json(v) for v in r.summary.values())
    yield _gauge(
        "croqq_shapes",
        "Submitted shapes by dtype and status.",
        ["dtype", "status"],
        (([d, s], getattr(p, s)) for d, p in sorted(tally.items()) for s in SHAPE_STATUSES),
    )
    c = r.counters
    yield _counter(
        "croqq_iterations",
        "Iterations stored in the results repo, by decision (baseline: iteration 0).",
        ["decision"],
        (([d.lower()], _num(c, d)) for d in DECISIONS),
    )
    seen = {k.split(":", 1)[1] for k in c if k.startswith("attempts:")}
    reasons = sorted(seen | set(ATTEMPT_REASONS))  # every known reason from the start: no gap in rate()
    yield _counter(
        "croqq_attempts",
        "Candidates stored as attempts (no iteration id), by reason (compile, check, agent, repeat).",
        ["reason"],
        (([why], _num(c, f"attempts:{why}")) for why in reasons),
    )
    for field, (name, doc) in EVENT_COUNTERS.items():
        yield _counter(name, doc, [], [([], _num(c, field))])


def gpu_families(r: Reading) -> Iterator[Metric]:
    """Per GPU: its state, host and type, busy seconds and duty, pipeline depth, active shapes."""
    yield _gauge(
        "croqq_gpu_info",
        "A registered GPU (always 1): its host, type and index.",
        ["gpu", "host", "gpu_type", "index"],
        (([g.uuid, g.host, g.gpu_type, str(g.index)], 1) for g, *_ in r.gpus),
    )
    yield _gauge(
        "croqq_gpu_state",
        "1 for the GPU's current state (healthy, quarantined, offline), 0 for the others.",
        ["gpu", "state"],
        (([g.uuid, s], float(g.status == s)) for g, *_ in r.gpus for s in GPU_STATES),
    )
    yield _counter(
        "croqq_gpu_busy_seconds",
        "Seconds the GPU spent running steps (rate() of it is the GPU's duty).",
        ["gpu"],
        (([g.uuid], _num(busy, "busy_s")) for g, busy, *_ in r.gpus),
    )
    yield _counter(
        "croqq_gpu_steps",
        "GPU steps run (BASELINE, PROFILE, MEASURE).",
        ["gpu"],
        (([g.uuid], _num(busy, "steps")) for g, busy, *_ in r.gpus),
    )
    yield _counter(
        "croqq_gpu_measurements",
        "Kernels run in GPU steps: every candidate of a MEASURE batch (BASELINE and PROFILE count one).",
        ["gpu"],
        (([g.uuid], _num(busy, "measurements")) for g, busy, *_ in r.gpus),
    )
    yield _gauge(
        "croqq_gpu_duty_ratio",
        "Busy seconds over wall seconds since the GPU's first step (Redis's clock), 0..1.",
        ["gpu"],
        (([g.uuid], _duty(busy, r.now)) for g, busy, *_ in r.gpus),
    )
    yield _gauge(
        "croqq_gpu_pipeline_depth",
        "Shapes the GPU may hold, as the coordinator last chose (0: not chosen yet).",
        ["gpu"],
        (([g.uuid], depth) for g, _, depth, _ in r.gpus),
    )
    yield _gauge(
        "croqq_gpu_active_shapes",
        "Shapes assigned to the GPU now.",
        ["gpu"],
        (([g.uuid], active) for g, *_, active in r.gpus),
    )


def _duty(busy: dict[str, str], now: float) -> float:
    first = _num(busy, "first")
    return min(1.0, _num(busy, "busy_s") / (now - first)) if first and now > first else 0.0


def store_families(r: Reading) -> Iterator[Metric]:
    """The writer's commit latency and the results repo's size."""
    buckets, total = stats.commit_histogram(r.commits)
    commits = HistogramMetricFamily(
        "croqq_writer_commit_seconds",
        "Time the writer took to stage and make one commit (one STORE, or a group of them).",
    )
    commits.add_metric([], buckets, total)
    yield commits
    compiles = HistogramMetricFamily(
        "croqq_compile_seconds",
        "Build workers' compile time per kernel family (cached binaries and knob-rule refusals aside); "
        "with croqq_queue_messages{queue='build.<dsl>'}, what to scale build workers on.",
        labels=["dsl"],
    )
    for dsl, (buckets, total) in stats.compile_histograms(r.compiles).items():
        compiles.add_metric([dsl], buckets, total)
    yield compiles
    if r.repo_bytes is not None:
        yield _gauge(
            "croqq_results_repo_bytes",
            "Size of the results repo's .git folder, as the writer last measured it.",
            [],
            [([], float(r.repo_bytes))],
        )


# One series per agent, read from its health hash: (family, name, help, the hash's field).
_AGENT_SERIES = (
    (_counter, "croqq_agent_calls", "Proposer calls of the agent.", "calls"),
    (
        _gauge,
        "croqq_agent_consecutive_failures",
        "The agent's failed calls in a row (it is backed off past CROQQ_AGENT_BACKOFF_AFTER).",
        "failures",
    ),
    (_counter, "croqq_agent_call_seconds", "Wall seconds spent in the agent's calls.", "wall_s"),
    (_counter, "croqq_agent_cost_dollars", "US dollars the agent reported spending.", "cost_usd"),
)


def agent_families(r: Reading) -> Iterator[Metric]:
    """Per agent: calls, consecutive failures, call seconds, cost, tokens."""
    a = r.agents
    for family, name, doc, field in _AGENT_SERIES:
        yield family(name, doc, ["agent"], (([n], _num(h, field)) for n, h in a.items()))
    yield _counter(
        "croqq_agent_tokens",
        "Tokens the agent reported, by kind (input, output).",
        ["agent", "kind"],
        (([n, kind], _num(h, f"{kind}_tokens")) for n, h in a.items() for kind in ("input", "output")),
    )


def alarm_families(r: Reading) -> Iterator[Metric]:
    """One series per raised alarm (croqq.work.alarms): 1 while it holds; gone once cleared."""
    yield _gauge(
        "croqq_alarm",
        "1 for each alarm raised (a full disk, a corrupted results repo, ...): a human must look.",
        ["name", "source"],
        (([a.name, a.source], 1.0) for a in r.alarms),
    )
    if r.memory is not None:  # a full Redis refuses every write: croqq pauses (croqq.delivery.memory)
        yield _gauge("croqq_redis_used_memory_bytes", "Redis's used_memory.", [], [([], r.memory.used)])
        yield _gauge("croqq_redis_maxmemory_bytes", "Redis's maxmemory (0: none).", [], [([], r.memory.max)])


def families(r: Reading) -> Iterator[Metric]:
    for part in (work_families, gpu_families, store_families, agent_families, alarm_families):
        yield from part(r)


class ClusterCollector(Collector):
    """Reads the cluster's state from Redis at each scrape (a client that fails fast: see health); the
    build queues are those of ``dsls``, the manifest's kernel families."""

    def __init__(self, client: redis.Redis, dsls: Sequence[str] = ()) -> None:
        self.client = client
        self.dsls = list(dsls)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            reading: Reading | None = read(self.client, self.dsls)
        except (redis.RedisError, OSError) as exc:
            log.warning("cannot read Redis for this scrape: %s", exc)
            reading = None
        up = _gauge(
            "croqq_redis_up", "1 when this scrape could read Redis, else 0.", [], [([], reading is not None)]
        )
        if reading is not None:
            yield from families(reading)
        yield up
        yield _gauge(
            "croqq_exporter_scrape_seconds",
            "Seconds this exporter took to read Redis and build this scrape's metrics.",
            [],
            [([], time.perf_counter() - started)],
        )
