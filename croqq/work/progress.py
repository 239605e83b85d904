"""A point-in-time view of the cluster (what `croqq status`, the live view and benchmarks read).

Reads only small keys: the per-shape summary hash, counters, the GPU registry and busy totals.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from croqq.delivery import clock, keys
from croqq.delivery.memory import read_memory
from croqq.delivery.state import ShapeSummary
from croqq.placement import registry
from croqq.settings import Settings
from croqq.work import agents, alarms, hosts, stats
from croqq.work.agents import AgentHealth, Budget
from croqq.work.alarms import Alarm
from croqq.work.hosts import HostProblem


@dataclass
class DtypeProgress:
    done: int = 0
    active: int = 0
    pending: int = 0
    error: int = 0
    iters_done: int = 0
    iters_total: int = 0


@dataclass
class GpuProgress:
    uuid: str
    status: str
    current: str
    active: int
    busy_s: float
    reason: str = ""  # why it is quarantined or offline
    depth: int = 0  # its pipeline depth, as last chosen (0: not yet)


@dataclass
class Snapshot:
    at: float
    dtypes: dict[str, DtypeProgress]
    gpus: list[GpuProgress]
    counters: dict[str, int]
    shapes: dict[str, ShapeSummary] = field(default_factory=dict)
    agents: list[AgentHealth] = field(default_factory=list)
    budget: Budget | None = None
    host_problems: list[HostProblem] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)

    @property
    def total(self) -> DtypeProgress:
        out = DtypeProgress()
        for p in self.dtypes.values():
            for name in vars(out):
                setattr(out, name, getattr(out, name) + getattr(p, name))
        return out

    @property
    def finished(self) -> bool:
        t = self.total
        return t.active == 0 and t.pending == 0 and (t.done + t.error) > 0


def submission_sids(client: redis.Redis, submission: str | None) -> list[str] | None:
    """The sids of a submission ('latest' for the newest), or None for every shape."""
    if submission is None:
        return None
    if submission == "latest":
        latest = client.lindex(keys.SUBMISSIONS, -1)
        if latest is None:
            return []
        submission = str(latest)
    raw = client.get(keys.submission(submission))
    return json.loads(raw) if raw else []


def tally(shapes: Iterable[ShapeSummary]) -> dict[str, DtypeProgress]:
    """Shapes by status and iterations, per dtype (from ``croqq:summary``'s entries)."""
    dtypes: dict[str, DtypeProgress] = {}
    for s in shapes:
        p = dtypes.setdefault(s.dtype, DtypeProgress())
        setattr(p, s.status, getattr(p, s.status) + 1)
        p.iters_done += max(0, s.current_iter + 1)
        p.iters_total += s.max_iter + 1
    return dtypes


def snapshot(client: redis.Redis, sids: list[str] | None = None) -> Snapshot:
    raw = {str(k): str(v) for k, v in client.hgetall(keys.SUMMARY).items()}
    chosen = raw if sids is None else {s: raw[s] for s in sids if s in raw}
    shapes = {sid: ShapeSummary.model_validate_json(v) for sid, v in chosen.items()}
    dtypes = tally(shapes.values())
    entries = registry.all_gpus(client)
    pipe = client.pipeline(transaction=False)  # a few commands per GPU, one round trip for all
    for g in entries:
        pipe.scard(keys.active(g.uuid))
        pipe.hget(keys.gpu_busy(g.uuid), "busy_s")
        pipe.hget(keys.depth(g.uuid), "depth")
    replies = pipe.execute()
    gpus = [
        GpuProgress(
            uuid=g.uuid,
            status=g.status,
            current=g.current,
            active=int(active),
            busy_s=float(busy or 0.0),
            reason=g.reason if g.status != registry.HEALTHY else "",
            depth=int(chosen or 0),
        )
        for g, active, busy, chosen in zip(entries, replies[::3], replies[1::3], replies[2::3], strict=True)
    ]
    now = clock.now(client)
    return Snapshot(
        at=now,
        dtypes=dtypes,
        gpus=gpus,
        counters=stats.counters(client),
        shapes=shapes,
        agents=agents.health(client),
        budget=agents.budget(client),
        host_problems=hosts.all_problems(client),
        alarms=alarms.active(client) + alarms.redis_alarms(read_memory(client), now),
    )


class RateMeter:
    """Iterations per second over a sliding window, and an ETA."""

    def __init__(self, window_s: float = 20.0) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, snap: Snapshot) -> None:
        self.samples.append((snap.at, snap.total.iters_done))
        while len(self.samples) > 2 and snap.at - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    @property
    def rate(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def eta_s(self, snap: Snapshot) -> float | None:
        t = snap.total
        remaining = t.iters_total - t.iters_done
        return remaining / self.rate if self.rate > 0 else None


CPU_S_PER_ITERATION = 0.12
"""Whole-cluster CPU seconds per stored iteration of the simulated backend at zero step time, the scripted
agent and the live view included: the machine's busy CPU (/proc/stat) over a whole ``make demo`` on an
otherwise idle machine, divided by the iterations it stored (808 s for 8,308 on 2 cores, the cutlass
family, agents jailed with ``unshare``: 0.097 s; the same machine ran the commit before 1.35x slower an
hour earlier, so the figure leaves room for a slower machine of the kind; ``DEMO_ARGS="--dtype all"
benchmarks/scaled_demo.sh`` measures it)."""


def expected_s(
    settings: Settings, iterations: int, gpus: int, candidates: int = 1, cores: int | None = None
) -> float | None:
    """Seconds a local cluster should take to store ``iterations`` more, before it has a rate of its own:
    the larger of the CPU bound (CPU_S_PER_ITERATION on this machine's ``cores``) and the GPU bound (one
    simulated measurement per candidate, time-scaled, spread over ``gpus``). None where the step times are
    not known beforehand (a real GPU, an LLM agent): then only the measured rate gives an ETA."""
    if settings.backend != "sim" or (settings.proposer == "agent" and settings.agents != ["scripted"]):
        return None
    cores = cores or len(os.sched_getaffinity(0))
    gpu_s = settings.time_scale * settings.sim_measure_s * candidates
    return iterations * max(CPU_S_PER_ITERATION / cores, gpu_s / max(1, gpus))
