"""Fleet capacity, and the control plane's CPU cost against a bare Celery floor.

``capacity(work)``: a real local cluster (simulated GPUs, zero step time) stores a batch of iterations on a
Redis of the product's configuration, with ``appendfsync always`` and then ``everysec``. Redis's own
counters over each batch, minus the idle cluster's rate, give commands, bytes and CPU per stored iteration;
step heartbeats at real step durations (:func:`heartbeat_calls`) and each GPU's own idle traffic are added,
as a zero-time run hides them. The writer's time per iteration at a deep history (:func:`writer_commit_s`),
group commit (:func:`group_run`) and the writer at saturation (:func:`drain_cost`) complete the parts;
:func:`capacity_limits` turns them into GPUs served per part at one stored iteration per GPU every
``CADENCE_S``, each part at ``HEADROOM`` of its budget.

``cpu_cost(work)``: the CPU of every process of the cluster per stored iteration, against a floor of bare
Celery workers with croqq's configuration, queues and pools running exactly the hops croqq's ledger
recorded (:func:`chain_plan`), alternated ``ROUNDS`` times (least CPU counts); by part, their ratio, and a
cProfile of the hottest croqq role (:func:`profile_roles`). :func:`floor_ceiling` is the fleet that the
floor itself would be granted."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from croqq.patience import Deadline, wait_until

log = logging.getLogger(__name__)
MODULE = "benchmarks.capacity_bench"  # this module, also when run as __main__
ROOT = Path(__file__).resolve().parents[1]  # the checkout: children import MODULE from it

CADENCE_S = 10.0  # one measurement (one stored iteration) per GPU every 10 s
HEADROOM = 0.5  # each part runs at most at half its budget
REDIS_CORES = 1.0  # Redis executes commands on one thread
NIC_BYTES_PER_S = 125e6  # 1 Gb/s, a conservative NIC for the Redis host
TARGET_GPUS = 2000
GPUS, DEPTH, SHAPES, MAX_ITER = 4, 4, 32, 10
IDLE_S, SETTLE_S = 10.0, 2.0
HEARTBEATS = 2000
TICKS = 5  # coordinator ticks priced at TARGET_GPUS registered GPUs
GROUP = 16  # the group-commit run's CROQQ_STORE_GROUP
DRAINS, PAUSE_MAX_S, STILL_S = 6, 3.0, 0.4  # backlog drains; a pause stays well inside the 10 s lease TTL
ROUNDS = 2
HISTORY_RUNS, HISTORY_DEPTH, HOT_KEYS, MEASURED = 4, 94, 5, 20  # 4 x 268 keys x 94 = 100,768 iterations
PROFILE_ENV = "CAPACITY_BENCH_PROFILE_DIR"  # not CROQQ_*: Settings forbids unknown CROQQ_ names
FLOOR_ENV = "CAPACITY_BENCH_FLOOR"
FLOOR_DONE = "croqq:floor:done"
LETTERS = "ibgs"  # croqq's order within an iteration: ideate, build (implement), gpu, store
KIND = {"i": "ideate", "b": "implement", "g": "measure", "s": "store"}
QUEUE = {"i": "ideate", "b": "build.cuda", "s": "store"}  # the floor's queues (croqq's: build.<family>)
PROFILE_START, PROFILE_DUMP = 3, 4  # offsets from SIGRTMIN (Celery installs handlers for SIGUSR1/2)


# -- the pure parts ---------------------------------------------------------------------------------


def capacity_limits(
    redis_cpu_s_per_iter: float,
    bytes_per_iter: float,
    writer_s_per_iter: float,
    idle_cpu_s_per_gpu_s: float = 0.0,
    idle_bytes_per_gpu_s: float = 0.0,
    shared_cpu_s_per_s: float = 0.0,
    shared_bytes_per_s: float = 0.0,
    cadence_s: float = CADENCE_S,
    headroom: float = HEADROOM,
    redis_cores: float = REDIS_CORES,
    nic_bytes_per_s: float = NIC_BYTES_PER_S,
) -> dict[str, object]:
    """GPUs that one Redis (CPU, network) and one writer serve at one stored iteration per GPU every
    ``cadence_s``, each part at ``headroom`` of its budget; the minimum and the part that saturates first.
    A GPU costs its iterations' share plus its own idle rate (its worker's heartbeats and polling); the
    shared idle rate (coordinator, beat, the shared workers) comes off the budget first."""
    per_gpu = {
        "redis_cpu": redis_cpu_s_per_iter / cadence_s + idle_cpu_s_per_gpu_s,
        "redis_network": bytes_per_iter / cadence_s + idle_bytes_per_gpu_s,
        "writer": writer_s_per_iter / cadence_s,
    }
    budget = {
        "redis_cpu": headroom * redis_cores - shared_cpu_s_per_s,
        "redis_network": headroom * nic_bytes_per_s - shared_bytes_per_s,
        "writer": headroom * 1.0,
    }
    gpus = {p: max(0, math.floor(budget[p] / c + 1e-9)) if c > 0 else 0 for p, c in per_gpu.items()}
    first = min(gpus, key=lambda part: gpus[part])
    return {
        "capacity_gpus_redis_cpu": gpus["redis_cpu"],
        "capacity_gpus_redis_network": gpus["redis_network"],
        "capacity_gpus_writer": gpus["writer"],
        "capacity_gpus": gpus[first],
        "capacity_saturates_first": first,
        "capacity_target_gpus": TARGET_GPUS,
        "capacity_meets_target": gpus[first] >= TARGET_GPUS,
    }


def chain_plan(counts: dict[str, int], chains: int, chain: int) -> str:
    """The hops of floor chain ``chain`` (one letter per hop, see LETTERS): each queue's hop count split over
    ``chains`` chains (the first ones take the remainder), interleaved evenly in croqq's order."""
    hops: list[tuple[float, int, str]] = []
    for order, letter in enumerate(LETTERS):
        total = counts.get(letter, 0)
        n = total // chains + (1 if chain < total % chains else 0)
        hops += [((m + 0.5) / n, order, letter) for m in range(n)]
    return "".join(letter for *_, letter in sorted(hops))


def _renewals(steps_per_iter: dict[str, float], lease_ttl_s: float) -> dict[str, float]:
    """Per kind: the lease renewals a stored iteration's steps make at real step durations (the sim's
    defaults), one every TTL/4 while a step runs."""
    from croqq.settings import Settings

    s = Settings()
    seconds = {
        "ideate": s.sim_ideate_s,
        "implement": s.sim_implement_s,
        "measure": s.sim_measure_s,
        "baseline": s.sim_measure_s,
        "profile": s.sim_profile_s,
    }
    return {kind: n * seconds.get(kind, 0.0) / (lease_ttl_s / 4) for kind, n in steps_per_iter.items()}


def heartbeats_per_iteration(steps_per_iter: dict[str, float], lease_ttl_s: float) -> float:
    """Lease renewals per stored iteration (:func:`_renewals`, all kinds)."""
    return sum(_renewals(steps_per_iter, lease_ttl_s).values())


def heartbeat_batch(kind: str) -> int:
    """How many steps of ``kind`` one process renews per heartbeat call in a busy fleet: an ideate
    worker's threads (``ideate_concurrency``), a build worker's with the thread pool
    (``build_concurrency``; a prefork child runs one), one on a GPU worker."""
    from croqq.settings import Settings

    s = Settings()
    if kind == "ideate":
        return s.ideate_concurrency
    if kind == "implement" and s.build_pool == "threads":
        return s.build_concurrency
    return 1


def heartbeat_calls(steps_per_iter: dict[str, float], lease_ttl_s: float) -> dict[int, float]:
    """Heartbeat calls per stored iteration, by the number of steps each renews."""
    calls: dict[int, float] = {}
    for kind, renewals in _renewals(steps_per_iter, lease_ttl_s).items():
        batch = heartbeat_batch(kind)
        calls[batch] = calls.get(batch, 0.0) + renewals / batch
    return {b: n for b, n in calls.items() if n > 0}


# -- processes and counters -------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, user + sys CPU seconds with reaped children's, command line)."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / tick, cmd)
    return table


def _label(cmd: str) -> str:
    """A process's role: `croqq writer`, `croqq gpu-worker`, `floor ideate` (its queue), `redis-server`."""
    words = cmd.split()
    if any(w.endswith("redis-server") for w in words[:1]):
        return "redis-server"
    if MODULE in words and len(words) > words.index(MODULE) + 2:
        return "floor " + words[words.index(MODULE) + 2]
    if "croqq" in words and len(words) > words.index("croqq") + 1:
        return "croqq " + words[words.index("croqq") + 1]
    return words[0] if words else "?"


def tree_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every descendant of this process: pid -> (role, seconds)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        ppid, cpu, cmd = table[pid]
        role = _label(cmd)
        if ppid in table and table[ppid][2] == cmd:
            role += " (pool)"
        out[pid] = (role, cpu)
        todo += children.get(pid, [])
    return out


def _cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two ``tree_cpu`` readings, per role."""
    roles: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        roles[role] = roles.get(role, 0.0) + cpu - (before[pid][1] if pid in before else 0.0)
    return roles


@dataclass
class RedisCounters:
    """Redis's own counters: calls per command, bytes in + out, CPU seconds (sys + user)."""

    calls: dict[str, float] = field(default_factory=dict)
    net_bytes: float = 0.0
    cpu_s: float = 0.0

    @classmethod
    def read(cls, client: Any) -> RedisCounters:
        info = client.info("everything")
        calls = {k[len("cmdstat_") :]: float(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_")}
        net = float(info["total_net_input_bytes"] + info["total_net_output_bytes"])
        return cls(calls, net, float(info["used_cpu_sys"] + info["used_cpu_user"]))

    def __add__(self, other: RedisCounters) -> RedisCounters:
        calls = {k: self.calls.get(k, 0.0) + other.calls.get(k, 0.0) for k in {*self.calls, *other.calls}}
        return RedisCounters(calls, self.net_bytes + other.net_bytes, self.cpu_s + other.cpu_s)

    def __sub__(self, other: RedisCounters) -> RedisCounters:
        calls = {k: v - other.calls.get(k, 0.0) for k, v in self.calls.items()}
        return RedisCounters(calls, self.net_bytes - other.net_bytes, self.cpu_s - other.cpu_s)

    def scaled(self, factor: float) -> RedisCounters:
        calls = {k: v * factor for k, v in self.calls.items()}
        return RedisCounters(calls, self.net_bytes * factor, self.cpu_s * factor)

    def top(self, count: int, per: float) -> dict[str, float]:
        ordered = sorted(self.calls.items(), key=lambda kv: kv[1], reverse=True)[:count]
        return {k: round(v / per, 1) for k, v in ordered}


def _redis(work: Path) -> Any:
    from croqq.processes.redis_server import RedisServer

    return RedisServer(work / "redis").start()


# -- a croqq run --------------------------------------------------------------------------------------


@dataclass
class CroqqRun:
    iterations: int
    stores: int
    wall_s: float
    cpu: dict[str, float]
    redis: RedisCounters
    steps: Counter[str]
    hops: Counter[str]  # per queue letter
    store_wall_s: float  # median, claim to completion
    payload_bytes: float
    step_id_len: int
    sid: str
    gpu_queues: list[str]


def _ledger(client: Any) -> list[dict[str, str]]:
    return [client.hgetall(k) for k in client.scan_iter("croqq:step:*", count=1000)]


def _payload(rec: dict[str, str]) -> str:
    from croqq.delivery.messages import StepMessage

    fields = {"step_id": rec["step_id"], "epoch": int(rec["epoch"]), "sid": rec["sid"], "kind": rec["kind"]}
    msg = StepMessage.model_validate(fields)
    return json.dumps([msg.model_dump()])


def _letter(queue: str) -> str:
    from croqq.delivery.queues import is_gpu_queue

    if is_gpu_queue(queue):
        return "g"
    return "b" if queue.startswith("build.") else {v: k for k, v in QUEUE.items()}[queue]  # any family's


def _wait_stored(client: Any, expected: int, timeout_s: float = 600.0) -> None:
    from croqq.delivery import keys

    wait_until(  # one counter: keeps our polling light
        lambda: int(client.hget(keys.STATS, "stored") or 0) >= expected,
        timeout_s,
        f"{expected} iterations stored",
        every_s=0.2,
    )


def _idle_rate(client: Any, seconds: float) -> RedisCounters:
    before = RedisCounters.read(client)
    time.sleep(seconds)
    return (RedisCounters.read(client) - before).scaled(1.0 / seconds)


def _stop_gpu_workers(cluster: Any) -> None:
    """Stop the cluster's GPU workers for good (the supervisor does not restart them) and take their GPUs out
    of the registry: what the coordinator does per GPU on each tick is a GPU's cost too."""
    from croqq.delivery import keys

    children = [cluster.supervisor.children[name] for name in cluster.gpu_names]
    for child in children:
        child.restart = False
        cluster.supervisor.signal(child.name, signal.SIGTERM)
    for child in children:
        child.popen.wait(timeout=30)
    uuids = list(cluster.client.smembers(keys.GPUS))
    if uuids:
        cluster.client.srem(keys.GPUS, *uuids)
        cluster.client.delete(*(keys.gpu(u) for u in uuids))
    time.sleep(SETTLE_S)


def cluster_env(work: Path, server: Any) -> dict[str, str]:
    """The measured cluster: ``GPUS`` simulated GPUs, ``DEPTH`` shapes each, zero step time, on ``server``."""
    return {
        "CROQQ_BROKER_URL": server.url,
        "CROQQ_RUN_DIR": str(work / "run"),
        "CROQQ_RESULTS_REPO": str(work / "results"),
        "CROQQ_SIM_GPUS": str(GPUS),
        "CROQQ_PIPELINE_DEPTH": str(DEPTH),
        "CROQQ_TIME_SCALE": "0",
    }


def run_croqq(work: Path, server: Any) -> CroqqRun:
    """One measured run: CPU per process, Redis's counters and the step ledger over the submission."""
    from croqq.processes.local import LocalCluster

    client = server.client()
    with LocalCluster(cluster_env(work, server), log_level="WARNING") as cluster:
        cluster.wait_gpus()
        time.sleep(SETTLE_S)  # boot traffic settles
        cpu0, r0, t0 = tree_cpu(), RedisCounters.read(client), time.monotonic()
        cluster.submit("f16", max_iter=MAX_ITER, limit=SHAPES)
        _wait_stored(client, SHAPES * (MAX_ITER + 1))
        wall = time.monotonic() - t0
        redis_delta, cpu = RedisCounters.read(client) - r0, _cpu_delta(cpu0, tree_cpu())
        stats = {k: int(v) for k, v in client.hgetall("croqq:stats").items()}
        records = _ledger(client)
    done = [r for r in records if r.get("status") == "done"]
    store = [float(r["finished_at"]) - float(r["started_at"]) for r in done if r["kind"] == "store"]
    step_ids = sorted(len(r["step_id"]) for r in done)
    sids = sorted((r["sid"] for r in done), key=len)
    return CroqqRun(
        iterations=stats["stored"],
        stores=len(store),
        wall_s=wall,
        cpu=cpu,
        redis=redis_delta,
        steps=Counter(r["kind"] for r in done),
        hops=Counter(_letter(r["queue"]) for r in done),
        store_wall_s=statistics.median(store),
        payload_bytes=statistics.fmean(len(_payload(r)) for r in done),
        step_id_len=step_ids[len(step_ids) // 2],
        sid=sids[len(sids) // 2],
        gpu_queues=sorted({r["queue"] for r in done if _letter(r["queue"]) == "g"}),
    )


# -- the writer at 100k iterations of history -------------------------------------------------------


def _time_commits(path: Path, requests: list[Any], fsync: bool = True) -> float:
    """Seconds per stored iteration of ``requests``, one commit each (no working tree): the median
    commit (a busy machine's preemptions only ever add) times commits per iteration."""
    from croqq.store.gitrepo import GitRepo
    from croqq.store.writer import ResultsWriter

    repo = GitRepo(path, sync_worktree=False, fsync=fsync)
    writer = ResultsWriter(repo)
    times = []
    for req in requests:
        started = time.perf_counter()
        writer.apply(req)
        times.append(time.perf_counter() - started)
    repo.close()
    return statistics.median(times) * len(requests) / sum(r.kind == "iteration" for r in requests)


def _prefill(path: Path, requests: list[Any]) -> None:
    from croqq.store.gitrepo import GitRepo
    from croqq.store.writer import ResultsWriter

    repo = GitRepo(path, sync_worktree=False, index_flush_s=0.0)
    writer = ResultsWriter(repo)
    for start in range(0, len(requests), 2500):
        writer.apply_group(requests[start : start + 2500])
    repo.close()
    subprocess.run(["git", "-C", str(path), "repack", "-a", "-d", "-q"], check=True)


def writer_commit_s(work: Path) -> dict[str, float]:
    """Seconds per stored iteration of one commit each, for ``HOT_KEYS`` keys' next ``MEASURED`` iterations,
    on a repo of ``HISTORY_RUNS`` runs (GPU types) x 268 keys x ``HISTORY_DEPTH`` iterations (~100k), and on
    one holding only the hot keys' history (the same stream: the difference is the history's cost)."""
    from tests.samples import sample_requests, schedule_keys

    keys = schedule_keys()
    gpus = [f"sm90_History_{i}" for i in range(HISTORY_RUNS)]
    hot = list(sample_requests(gpus[0], "cuda", keys[:HOT_KEYS], HISTORY_DEPTH + MEASURED, 7))
    prefill = [r for r in hot if r.checkpoint.current_iter < HISTORY_DEPTH]
    measured = [r for r in hot if r.checkpoint.current_iter >= HISTORY_DEPTH]
    _prefill(work / "shallow", prefill)
    shallow = _time_commits(work / "shallow", measured)
    rest = list(sample_requests(gpus[0], "cuda", keys[HOT_KEYS:], HISTORY_DEPTH, 8))
    for i, gpu in enumerate(gpus[1:]):
        rest += sample_requests(gpu, "cuda", keys, HISTORY_DEPTH, 9 + i)
    full = prefill + rest
    _prefill(work / "deep", full)
    shutil.copytree(work / "deep", work / "deep-nofsync", symlinks=True)  # a commit happens once per repo
    deep = _time_commits(work / "deep", measured)
    return {
        "history_iterations": sum(r.kind == "iteration" for r in full),
        "commit_s_shallow": shallow,
        "commit_s_100k": deep,
        "commit_s_100k_nofsync": _time_commits(work / "deep-nofsync", measured, fsync=False),
    }


def heartbeat_cost(server: Any, batch: int = 1, count: int = HEARTBEATS) -> RedisCounters:
    """Redis's cost of one heartbeat call (``Ledger.heartbeat``) renewing ``batch`` running steps, one
    call per round trip."""
    from croqq.delivery import keys
    from croqq.delivery.ledger import Ledger

    client = server.client()
    ledger = Ledger(client, 10.0, advance=None)  # type: ignore[arg-type]
    steps = [f"f16_4096x8192x4096#{12 + i}.0123456789ab" for i in range(batch)]
    for step in steps:
        client.hset(keys.step(step), mapping={"status": "running", "owner": "bench"})
        client.zadd(keys.RUNNING, {step: 0})
    ledger.heartbeat(steps, "bench")  # the clock's first TIME and the script's load stay out
    before = RedisCounters.read(client)
    for _ in range(count):
        ledger.heartbeat(steps, "bench")
    cost = (RedisCounters.read(client) - before).scaled(1.0 / count)
    client.delete(*(keys.step(step) for step in steps))
    client.zrem(keys.RUNNING, *steps)
    return cost


def tick_cost(server: Any, gpus: int = TARGET_GPUS, ticks: int = TICKS) -> tuple[RedisCounters, float]:
    """Redis's cost of the coordinator's per-GPU work on one housekeeping tick (the offline check and the
    fill, :func:`croqq.work.housekeeping.reconcile`) with ``gpus`` registered GPUs, each holding ``DEPTH``
    shapes and none waiting: a fleet's steady state, on the (flushed) server under ``appendfsync always``.
    Returns the counters and the AOF bytes appended, per tick."""
    from croqq.delivery import keys
    from croqq.delivery.ledger import Ledger
    from croqq.placement import registry
    from croqq.placement.assign import Placement
    from croqq.settings import Settings

    client = server.client()
    client.flushall()
    client.config_set("appendfsync", "always")
    settings = Settings(pipeline_depth=DEPTH)
    for i in range(gpus):
        uuid = f"GPU-bench-{i:05d}"
        entry = registry.GpuEntry(
            uuid=uuid, host=f"h{i // 8}", index=i % 8, gpu_type="sm90_bench", queue=f"gpu.{uuid}", owner="b"
        )
        registry.register_gpu(client, entry)
        client.set(keys.lease(f"gpu:{uuid}"), "b")
        client.sadd(keys.active(uuid), *(f"{uuid}/s{d}" for d in range(DEPTH)))
    placement = Placement(settings, client, Ledger(client, settings.lease_ttl_s, advance=None))  # type: ignore[arg-type]

    def tick() -> None:  # as housekeeping.reconcile: one registry read for both
        gpus = registry.all_gpus(client)
        placement.release_offline_gpus(gpus)
        placement.fill_all(gpus=gpus)

    tick()  # the scripts' loads and the first depths stay out
    before, aof = RedisCounters.read(client), client.info("persistence")["aof_current_size"]
    for _ in range(ticks):
        tick()
    appended = (client.info("persistence")["aof_current_size"] - aof) / ticks
    cost = (RedisCounters.read(client) - before).scaled(1.0 / ticks)
    client.flushall()
    return cost, appended


@dataclass(frozen=True)
class WriterCost:
    """The writer process over a batch, per STORE step: CPU seconds (main process and pool, messages
    included) and Celery messages it was sent (a drained writer is woken once for several STOREs)."""

    cpu_s: float
    messages: float


@dataclass
class RedisSide:
    """Redis's costs under one AOF fsync policy."""

    iterations: RedisCounters  # per stored iteration, idle traffic apart
    idle: RedisCounters  # per second, the whole idle cluster
    shared: RedisCounters = field(default_factory=RedisCounters)  # the same without its GPU workers
    beats: dict[int, RedisCounters] = field(default_factory=dict)  # one heartbeat call, by steps renewed
    store_s: float = 0.0  # the store step's median wall time (claim to completion)
    store_busy_s: float = 0.0  # the writer's busy time per STORE step (:func:`busy_s`)
    writer: WriterCost = field(default_factory=lambda: WriterCost(0.0, 0.0))  # its process, per STORE


def _batch(cluster: Any, client: Any, dtype: str) -> tuple[RedisCounters, float, WriterCost]:
    """Submit ``SHAPES`` shapes of ``dtype`` and wait until they are stored: Redis's counters, wall time,
    the writer's cost per STORE step (its wake-ups counted where the product counts them, else one
    message per STORE)."""
    from croqq.delivery import keys

    def counts() -> tuple[int, int, int]:
        raw = client.hmget(keys.STATS, "stored", "attempts", "store_wakeups")
        return int(raw[0] or 0), int(raw[1] or 0), int(raw[2] or 0)

    cpu0, (already, attempts0, wakes0) = tree_cpu(), counts()
    before, t0 = RedisCounters.read(client), time.monotonic()
    cluster.submit(dtype, max_iter=MAX_ITER, limit=SHAPES)
    _wait_stored(client, already + SHAPES * (MAX_ITER + 1))
    counters, wall = RedisCounters.read(client) - before, time.monotonic() - t0
    time.sleep(SETTLE_S)  # the last completions
    cpu = _cpu_delta(cpu0, tree_cpu())
    stored, attempts, wakes = counts()
    stores = max(1, stored - already + attempts - attempts0)
    writer_cpu = sum(v for role, v in cpu.items() if role.startswith("croqq writer"))
    messages = (wakes - wakes0) / stores if wakes else 1.0
    return counters, wall, WriterCost(writer_cpu / stores, messages)


def capacity_run(
    work: Path, server: Any, batches: tuple[int, ...] = (1,)
) -> tuple[dict[str, RedisSide], dict[str, float], int]:
    """The cluster stores a batch under each AOF fsync policy (``always``, the product's, and
    ``everysec``: one fsync a second in a background thread, what the brief allows with reconciliation
    from git; it also shows Redis's cost once many clients share each event loop cycle's fsync), with the
    idle rates after each; then its GPU workers stop and the shared idle rates follow; then a heartbeat
    call renewing each of ``batches`` steps is priced. Returns the costs per policy, the steps per stored
    iteration and the stores per iteration."""
    from croqq.processes.local import LocalCluster

    client = server.client()
    sides: dict[str, RedisSide] = {}
    with LocalCluster(cluster_env(work, server), log_level="WARNING") as cluster:
        cluster.wait_gpus()
        time.sleep(SETTLE_S)  # boot traffic settles
        for policy, dtype in (("always", "f16"), ("everysec", "e4m3")):
            client.config_set("appendfsync", policy)
            batch, wall, writer = _batch(cluster, client, dtype)
            idle = _idle_rate(client, IDLE_S)
            n = SHAPES * (MAX_ITER + 1)
            sides[policy] = RedisSide((batch - idle.scaled(wall)).scaled(1.0 / n), idle, writer=writer)
        records = [r for r in _ledger(client) if r.get("status") == "done"]
        _stop_gpu_workers(cluster)
        for policy in ("everysec", "always"):
            client.config_set("appendfsync", policy)
            sides[policy].shared = _idle_rate(client, IDLE_S)
    for policy, dtype in (("always", "f16"), ("everysec", "e4m3")):
        client.config_set("appendfsync", policy)
        sides[policy].beats = {b: heartbeat_cost(server, b) for b in batches}
        stores = [r for r in records if r["kind"] == "store" and f"/{dtype}_" in r["sid"]]
        sides[policy].store_s = statistics.median(
            float(r["finished_at"]) - float(r["started_at"]) for r in stores
        )
        sides[policy].store_busy_s = _store_busy_s(records, dtype)
    total = 2 * SHAPES * (MAX_ITER + 1)
    steps = {k: v / total for k, v in Counter(r["kind"] for r in records).items()}
    return sides, steps, total


def busy_s(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (a group commit's STORE steps overlap: the writer is busy
    once for all of them)."""
    total, end = 0.0, -math.inf
    for start, finish in sorted(intervals):
        if finish > end:
            total += finish - max(start, end)
            end = finish
    return total


_STORE_COMMIT = re.compile(r"^(?:store: (\d+) record\(s\)|\S+ (?:iter|attempt)\d+: )")


def stores_per_commit(subjects: list[str]) -> float:
    """The mean STOREs per store commit, from the commit subjects (a group commit names its count)."""
    sizes = [int(m.group(1) or 1) for m in map(_STORE_COMMIT.match, subjects) if m]
    return sum(sizes) / len(sizes) if sizes else 0.0


def _store_busy_s(records: list[dict[str, str]], dtype: str) -> float:
    """The writer's busy time per STORE step of ``dtype``'s shapes (claim to completion, overlaps once)."""
    stores = [r for r in records if r["kind"] == "store" and f"/{dtype}_" in r["sid"]]
    return busy_s([(float(r["started_at"]), float(r["finished_at"])) for r in stores]) / len(stores)


def _subjects(repo: Path) -> list[str]:
    """The results repo's commit subjects, newest first."""
    return subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%s"], check=True, capture_output=True, text=True
    ).stdout.splitlines()


def group_run(work: Path, server: Any, group: int = GROUP) -> dict[str, float]:
    """The same cluster with group commit (``CROQQ_STORE_GROUP=group``) on a flushed ``server``, one batch
    under ``appendfsync always``: the writer's busy time per STORE, the STOREs per commit, Redis's
    commands and CPU per stored iteration; then the writer at saturation (:func:`drain_cost`)."""
    from croqq.processes.local import LocalCluster

    client = server.client()
    client.flushall()
    client.config_set("appendfsync", "always")
    env = cluster_env(work, server) | {"CROQQ_STORE_GROUP": str(group)}
    with LocalCluster(env, log_level="WARNING") as cluster:
        cluster.wait_gpus()
        time.sleep(SETTLE_S)
        batch, wall, writer = _batch(cluster, client, "f16")
        idle = _idle_rate(client, IDLE_S)
        records = [r for r in _ledger(client) if r.get("status") == "done"]
        subjects = _subjects(work / "results")
        drained = drain_cost(cluster, client, work / "results", "e4m3")
    per_iter = (batch - idle.scaled(wall)).scaled(1.0 / (SHAPES * (MAX_ITER + 1)))
    return {
        "store_busy_s": _store_busy_s(records, "f16"),
        "writer_cpu_s": writer.cpu_s,
        "writer_messages": writer.messages,
        "stores_per_commit": stores_per_commit(subjects),
        "redis_commands_per_iter": sum(per_iter.calls.values()),
        "redis_cpu_s_per_iter": per_iter.cpu_s,
    } | drained


def _writer_pids() -> list[int]:
    return [pid for pid, (role, _) in tree_cpu().items() if role.startswith("croqq writer")]


def _stored_and_attempts(client: Any) -> int:
    from croqq.delivery import keys

    raw = client.hmget(keys.STATS, "stored", "attempts")
    return int(raw[0] or 0) + int(raw[1] or 0)


def _reached(client: Any, target: int) -> bool:
    return _stored_and_attempts(client) >= target


def _backlog(client: Any, pids: list[int]) -> int:
    """Pause the writer (SIGSTOP) until the queued STOREs stop growing (or ``PAUSE_MAX_S``): the backlog.
    The caller resumes it; a failure here resumes it at once."""
    from croqq.delivery import keys

    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        deadline, last, since = time.monotonic() + PAUSE_MAX_S, -1, time.monotonic()
        while time.monotonic() < deadline:
            queued = int(client.zcard(keys.QUEUED_STORES))
            if queued != last:
                last, since = queued, time.monotonic()
            elif time.monotonic() - since >= STILL_S and queued:
                break
            time.sleep(0.02)
    except BaseException:
        _resume(pids)
        raise
    return last


def _resume(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def drain_cost(cluster: Any, client: Any, repo: Path, dtype: str, drains: int = DRAINS) -> dict[str, float]:
    """The writer at saturation, as a fleet of 2,000 GPUs keeps it: a backlog of queued STOREs built while
    it is paused (SIGSTOP), then drained; its wall time and CPU per STORE from its resumption until that
    many more STOREs are stored (those that arrive meanwhile join the drain, as they would), and the
    STOREs per commit of that window (``repo``: the results repo). ``drains`` times over one submission of
    ``dtype``, which then finishes."""
    from croqq.delivery import keys

    pids = _writer_pids()
    stored0 = int(client.hget(keys.STATS, "stored") or 0)
    cluster.submit(dtype, max_iter=MAX_ITER, limit=SHAPES)
    wall = cpu = 0.0
    stores = 0
    subjects: list[str] = []
    for _ in range(drains):
        backlog = _backlog(client, pids)
        if backlog <= 0:
            _resume(pids)
            break
        target = _stored_and_attempts(client) + backlog
        commits = len(_subjects(repo))
        cpu0, t0 = tree_cpu(), time.monotonic()
        _resume(pids)
        wait_until(partial(_reached, client, target), 120.0, "a drained backlog", every_s=0.01)
        took = time.monotonic() - t0
        wall += took
        cpu += sum(v for role, v in _cpu_delta(cpu0, tree_cpu()).items() if role.startswith("croqq writer"))
        stores += backlog
        made = _subjects(repo)
        subjects += made[: len(made) - commits]
        log.info("drain: %d queued STOREs stored in %.3f s", backlog, took)
    _wait_stored(client, stored0 + SHAPES * (MAX_ITER + 1))
    return {
        "drain_stores": stores,
        "drain_wall_s": wall / max(1, stores),
        "drain_cpu_s": cpu / max(1, stores),
        "drain_stores_per_commit": stores_per_commit(subjects),
    }


def _beats(side: RedisSide, calls: dict[int, float]) -> RedisCounters:
    """Redis's cost of an iteration's heartbeat calls (``calls``: calls per iteration by steps renewed)."""
    total = RedisCounters()
    for batch, n in calls.items():
        total += side.beats[batch].scaled(n)
    return total


def _limits(side: RedisSide, beats: RedisCounters, writer_s: float) -> tuple[dict[str, object], float, float]:
    """capacity_limits for one policy; also its Redis CPU s and bytes per iteration at real cadence
    (``beats``: the iteration's heartbeat calls)."""
    per_gpu = (side.idle - side.shared).scaled(1.0 / GPUS)  # one GPU worker's own idle traffic
    cpu = side.iterations.cpu_s + beats.cpu_s
    net = side.iterations.net_bytes + beats.net_bytes
    idle = (max(0.0, per_gpu.cpu_s), max(0.0, per_gpu.net_bytes), side.shared.cpu_s, side.shared.net_bytes)
    return capacity_limits(cpu, net, writer_s, *idle), cpu, net


def capacity(work: Path) -> dict[str, object]:
    load = os.getloadavg()[0]
    server = _redis(work)
    batches = tuple(sorted({heartbeat_batch(kind) for kind in KIND.values()}))
    try:
        sides, steps, total = capacity_run(work / "cluster", server, batches)
        grouped = group_run(work / "group", server)
        tick, tick_aof = tick_cost(server)
    finally:
        server.stop()
    writer = writer_commit_s(work / "writer")
    beats = heartbeats_per_iteration(steps, 10.0)
    calls = heartbeat_calls(steps, 10.0)
    extra = max(0.0, writer["commit_s_100k"] - writer["commit_s_shallow"])
    stores_per_iter = steps.get("store", 1.0)
    out: dict[str, object] = {
        "capacity_load_avg_1m": round(load, 2),
        "capacity_iterations": total,
        "capacity_gpus_in_run": GPUS,
        "capacity_heartbeats_per_iter": round(beats, 1),
        "capacity_heartbeat_calls_per_iter": round(sum(calls.values()), 1),
        "capacity_heartbeat_calls_by_steps_renewed": {b: round(n, 1) for b, n in calls.items()},
        "capacity_history_iterations": int(writer["history_iterations"]),
        "capacity_writer_commit_ms_shallow": round(1e3 * writer["commit_s_shallow"], 2),
        "capacity_writer_commit_ms_at_100k": round(1e3 * writer["commit_s_100k"], 2),
        "capacity_writer_commit_ms_at_100k_nofsync": round(1e3 * writer["commit_s_100k_nofsync"], 2),
    }
    for policy, side in sides.items():
        writer_s = stores_per_iter * side.store_s + extra
        beat_cost = _beats(side, calls)
        limits, cpu, net = _limits(side, beat_cost, writer_s)
        per_gpu = (side.idle - side.shared).scaled(1.0 / GPUS)
        it = side.iterations
        tag = "" if policy == "always" else "_everysec"
        out |= {
            f"capacity_redis_commands_per_iter{tag}": round(
                sum(it.calls.values()) + sum(beat_cost.calls.values()), 1
            ),
            f"capacity_redis_commands_per_iter_zero_time{tag}": round(sum(it.calls.values()), 1),
            f"capacity_redis_bytes_per_iter{tag}": round(net),
            f"capacity_redis_bytes_per_iter_zero_time{tag}": round(it.net_bytes),
            f"capacity_redis_cpu_ms_per_iter{tag}": round(1e3 * cpu, 3),
            f"capacity_redis_cpu_ms_per_iter_zero_time{tag}": round(1e3 * it.cpu_s, 3),
            f"capacity_heartbeat_redis_cpu_us_by_steps_renewed{tag}": {
                b: round(1e6 * c.cpu_s, 1) for b, c in side.beats.items()
            },
            f"capacity_idle_per_gpu_redis_cpu_ms_per_s{tag}": round(1e3 * per_gpu.cpu_s, 3),
            f"capacity_idle_per_gpu_bytes_per_s{tag}": round(per_gpu.net_bytes),
            f"capacity_idle_shared_redis_cpu_ms_per_s{tag}": round(1e3 * side.shared.cpu_s, 3),
            f"capacity_idle_shared_bytes_per_s{tag}": round(side.shared.net_bytes),
            f"capacity_store_step_ms{tag}": round(1e3 * side.store_s, 2),
            f"capacity_writer_ms_per_iter_at_100k{tag}": round(1e3 * writer_s, 2),
            f"capacity_writer_messages_per_store{tag}": round(side.writer.messages, 3),
            f"capacity_writer_cpu_ms_per_store_at_100k{tag}": round(1e3 * (side.writer.cpu_s + extra), 2),
            f"capacity_gpus_writer_cpu{tag}": capacity_limits(
                0.0, 0.0, stores_per_iter * (side.writer.cpu_s + extra)
            )["capacity_gpus_writer"],
        }
        out |= {k + tag: v for k, v in limits.items() if k != "capacity_target_gpus"}
    # group commit: the writer's busy time per STORE (one run without, one with, both under ``always``);
    # the extra cost of a commit at 100k history is shared by the STOREs of the commit
    always = sides["always"]
    writer_group_s = stores_per_iter * (
        grouped["store_busy_s"] + extra / max(1.0, grouped["stores_per_commit"])
    )
    writer_single_s = stores_per_iter * (always.store_busy_s + extra)
    writer_group_cpu_s = grouped["writer_cpu_s"] + extra / max(1.0, grouped["stores_per_commit"])
    limits_group, _, _ = _limits(always, _beats(always, calls), writer_group_s)
    out |= {
        "capacity_group_commit_max": GROUP,
        "capacity_group_stores_per_commit": round(grouped["stores_per_commit"], 2),
        "capacity_writer_busy_ms_per_iter_at_100k": round(1e3 * writer_single_s, 2),
        "capacity_writer_busy_ms_per_iter_at_100k_group": round(1e3 * writer_group_s, 2),
        "capacity_redis_commands_per_iter_zero_time_group": round(grouped["redis_commands_per_iter"], 1),
        "capacity_redis_cpu_ms_per_iter_zero_time_group": round(1e3 * grouped["redis_cpu_s_per_iter"], 3),
        "capacity_gpus_writer_busy": capacity_limits(0.0, 0.0, writer_single_s)["capacity_gpus_writer"],
        "capacity_gpus_writer_group": limits_group["capacity_gpus_writer"],
        "capacity_gpus_group": limits_group["capacity_gpus"],
        "capacity_saturates_first_group": limits_group["capacity_saturates_first"],
        "capacity_writer_messages_per_store_group": round(grouped["writer_messages"], 3),
        "capacity_writer_cpu_ms_per_store_at_100k_group": round(1e3 * writer_group_cpu_s, 2),
        "capacity_gpus_writer_cpu_group": capacity_limits(0.0, 0.0, stores_per_iter * writer_group_cpu_s)[
            "capacity_gpus_writer"
        ],
    }
    # the writer at saturation: a backlog drained in full groups, as a large fleet keeps it busy
    per_commit = max(1.0, grouped["drain_stores_per_commit"])
    writer_sat_s = stores_per_iter * (grouped["drain_wall_s"] + extra / per_commit)
    writer_sat_cpu_s = stores_per_iter * (grouped["drain_cpu_s"] + extra / per_commit)
    limits_sat, _, _ = _limits(always, _beats(always, calls), writer_sat_s)
    out |= {
        "capacity_drain_stores": int(grouped["drain_stores"]),
        "capacity_drain_stores_per_commit": round(grouped["drain_stores_per_commit"], 2),
        "capacity_writer_ms_per_iter_at_100k_saturated": round(1e3 * writer_sat_s, 2),
        "capacity_writer_cpu_ms_per_iter_at_100k_saturated": round(1e3 * writer_sat_cpu_s, 2),
        "capacity_gpus_writer_saturated": limits_sat["capacity_gpus_writer"],
        "capacity_gpus_saturated": limits_sat["capacity_gpus"],
        "capacity_saturates_first_saturated": limits_sat["capacity_saturates_first"],
    }
    out |= {
        "capacity_coordinator_tick_gpus": TARGET_GPUS,
        "capacity_coordinator_tick_commands": round(sum(tick.calls.values())),
        "capacity_coordinator_tick_redis_cpu_ms": round(1e3 * tick.cpu_s, 2),
        "capacity_coordinator_tick_aof_bytes": round(tick_aof),
    }
    out["capacity_redis_top_commands_per_iter"] = sides["always"].iterations.top(8, 1.0)
    # the writer with neither Redis nor git fsyncing: the everysec store step, its shallow commit (git fsync
    # on) replaced by one at 100k without fsync
    nofsync_s = max(
        0.0,
        stores_per_iter * sides["everysec"].store_s
        + writer["commit_s_100k_nofsync"]
        - writer["commit_s_shallow"],
    )
    out["capacity_gpus_writer_everysec_git_nofsync"] = capacity_limits(0.0, 0.0, nofsync_s)[
        "capacity_gpus_writer"
    ]
    out["capacity_target_gpus"] = TARGET_GPUS
    out["capacity_assumptions"] = (
        f"one stored iteration per GPU every {CADENCE_S:g} s; every part at {HEADROOM:.0%} of its budget: "
        f"Redis {REDIS_CORES:g} core, NIC {NIC_BYTES_PER_S * 8 / 1e9:g} Gb/s, one writer; a running step's"
        " lease is renewed every TTL/4 (10 s TTL) at the sim's real step durations, a process's steps in "
        "one call (busy ideate workers renew ideate_concurrency steps per call, GPU workers and prefork "
        "build children one), each call priced on that many steps; a GPU's idle cost = the idle cluster's"
        " minus the same cluster without its GPU workers and GPUs, over the GPUs; the shared idle cost "
        "(coordinator, beat, shared workers) comes off the budget; the writer's time = the store step's "
        "median wall time in the cluster (claim to completion) + the median commit's extra cost at 100k "
        "iterations of history against a shallow repo (no working-tree sync, git fsync on); attempts "
        "count as stores; *_everysec: the same with Redis's appendfsync everysec (each figure measured in"
        " the same run); wall times grow with the machine's load; *_group: the writer with group commit "
        f"(at most {GROUP} STOREs per commit), its time the busy time per STORE (overlapping steps once) "
        "plus the 100k commit's extra cost over the STOREs per commit, beside the same figure without it "
        "(writer_busy); writer_cpu: the writer process's CPU per STORE step over the batch (main process "
        "and pool: its Celery messages, claims, commits, completions) plus the same 100k extra cost, and "
        "the GPUs it serves priced on that instead of the store step's wall time; writer_messages_per_store:"
        " the Celery messages the writer was sent per STORE step; *_saturated: the writer kept busy as a "
        f"large fleet keeps it: {DRAINS} times, paused (SIGSTOP) until the queued STOREs stop growing, then"
        " resumed; its wall time per STORE from resumption until as many more are stored (group commit"
        " on), plus the 100k commit's extra cost over the STOREs per commit of those drains"
    )
    log.info("capacity: %s", out)
    return out


# -- the floor: bare Celery chains --------------------------------------------------------------------


def _floor_app() -> Any:
    """A bare Celery app with croqq's configuration (minus beat's schedule and croqq's consumer), whose
    step tasks (croqq's task names) each send the chain's next hop and do nothing else."""
    from celery import Celery

    from croqq.delivery.queues import STEP_TASK
    from croqq.delivery.redis_client import connect
    from croqq.processes.app import celery_config
    from croqq.settings import get_settings

    conf = celery_config(get_settings())
    for name in ("beat_schedule", "worker_consumer"):
        conf.pop(name)
    app = Celery("croqq-floor")
    app.conf.update(conf)
    spec = json.loads(os.environ[FLOOR_ENV])
    plans: dict[int, str] = {}

    def hop(payload: dict[str, Any]) -> None:
        chain, _, rest = payload["step_id"][1:].partition("#")
        c, n = int(chain), int(rest.partition(".")[0]) + 1
        plan = plans.get(c) or plans.setdefault(c, chain_plan(spec["counts"], spec["chains"], c))
        if n == len(plan):
            connect(get_settings()).rpush(FLOOR_DONE, n)
            return
        send_hop(app, spec, c, n, plan[n])

    for name in set(STEP_TASK.values()):
        app.task(name=name)(hop)
    return app


def send_hop(app: Any, spec: dict[str, Any], chain: int, n: int, letter: str) -> None:
    """Send hop ``n`` of ``chain``: a message as long as croqq's step message to the same kind of queue."""
    from croqq.delivery.queues import STEP_TASK

    kind = KIND[letter]
    queue = QUEUE.get(letter) or spec["gpu_queues"][chain % len(spec["gpu_queues"])]
    prefix = f"c{chain}#{n}."
    step_id = prefix + "0" * max(0, spec["step_id_len"] - len(prefix))
    payload = {"step_id": step_id, "epoch": 0, "sid": spec["sid"], "kind": kind}
    label = f"{kind} {spec['sid'].rsplit('/', 1)[-1]} e0"
    app.send_task(STEP_TASK[kind], args=[payload], queue=queue, argsrepr=label, kwargsrepr="")


def _floor_worker(queue: str, pool: str, concurrency: int, prefetch: int) -> None:
    from croqq.processes.boot import celery_argv, host_name

    _floor_app().worker_main(
        celery_argv([queue], f"floor-{queue}@{host_name()}", pool, concurrency, "WARNING", prefetch)
    )


def floor_workers(gpu_queues: list[str]) -> list[tuple[str, str, int, int]]:
    """(queue, pool, concurrency, prefetch) of croqq's worker roles (beat has no counterpart)."""
    from croqq.processes.boot import GPU_PREFETCH
    from croqq.settings import Settings

    s = Settings()
    shared = [
        ("control", "solo", 1, 1),
        ("store", "solo", 1, 1),
        (QUEUE["b"], s.build_pool, s.build_concurrency, 1),
        ("ideate", "threads", s.ideate_concurrency, 1),
    ]
    return shared + [(q, "prefork", 1, GPU_PREFETCH) for q in gpu_queues]


@dataclass
class FloorRun:
    hops: int
    wall_s: float
    cpu: dict[str, float]
    redis: RedisCounters


def run_floor(work: Path, server: Any, spec: dict[str, Any], timeout_s: float = 300.0) -> FloorRun:
    """Start the floor's workers on ``server``, run ``spec['chains']`` chains to their end, stop them."""
    from croqq.processes.app import make_app
    from croqq.settings import Settings

    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": _pythonpath(),
        "CROQQ_BROKER_URL": server.url,
        FLOOR_ENV: json.dumps(spec),
    }
    workers = floor_workers(spec["gpu_queues"])
    procs = []
    client = server.client()
    client.delete(FLOOR_DONE)
    try:
        for i, (queue, pool, conc, prefetch) in enumerate(workers):
            argv = [sys.executable, "-m", MODULE, "floor-worker", queue, pool, str(conc), str(prefetch)]
            with open(work / f"floor{i}.log", "ab") as out:
                procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
        wait_until(
            lambda: sum(c.get("cmd") == "brpop" for c in client.client_list()) >= len(workers),
            60,
            "the floor's workers consuming",
            every_s=0.2,
        )
        time.sleep(SETTLE_S)
        app = make_app(Settings(broker_url=server.url))
        cpu0, r0, t0 = tree_cpu(), RedisCounters.read(client), time.monotonic()
        for c in range(spec["chains"]):
            send_hop(app, spec, c, 0, chain_plan(spec["counts"], spec["chains"], c)[0])
        hops = 0
        for _ in range(spec["chains"]):
            reply = client.blpop([FLOOR_DONE], timeout=timeout_s)
            if reply is None:
                raise TimeoutError(f"a floor chain did not finish within {timeout_s:.0f}s")
            hops += int(reply[1])
        wall = time.monotonic() - t0
        return FloorRun(hops, wall, _cpu_delta(cpu0, tree_cpu()), RedisCounters.read(client) - r0)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def floor_spec(run: CroqqRun) -> dict[str, Any]:
    return {
        "counts": dict(run.hops),
        "chains": min(SHAPES, GPUS * DEPTH),  # croqq's active shapes, one step in flight each
        "gpu_queues": run.gpu_queues,
        "step_id_len": run.step_id_len,
        "sid": run.sid,
    }


def _pythonpath(*first: Path) -> str:
    """PYTHONPATH for a child that imports this module: ``first``, the checkout, then the inherited one."""
    return os.pathsep.join(filter(None, [*map(str, first), str(ROOT), os.environ.get("PYTHONPATH", "")]))


# -- profiling one role ---------------------------------------------------------------------------


def profile_hook() -> None:
    """Called by the ``sitecustomize`` that the profiled run puts first on PYTHONPATH: when
    CAPACITY_BENCH_PROFILE_DIR is set, SIGRTMIN+3 starts cProfile in this process's main thread and
    SIGRTMIN+4 stops it and writes ``<dir>/<pid>.prof``."""
    out = os.environ.get(PROFILE_ENV)
    if not out:
        return
    import cProfile

    prof = cProfile.Profile(time.thread_time)  # CPU time of the profiled (main) thread, not wall time

    def start(*_: object) -> None:
        prof.enable()

    def dump(*_: object) -> None:
        prof.disable()
        prof.dump_stats(os.path.join(out, f"{os.getpid()}.prof"))

    def install(**_: object) -> None:
        signal.signal(signal.SIGRTMIN + PROFILE_START, start)
        signal.signal(signal.SIGRTMIN + PROFILE_DUMP, dump)

    install()
    try:  # a prefork pool child resets its signal handlers: install them again there
        from celery.signals import worker_process_init

        worker_process_init.connect(install, weak=False)
    except ImportError:
        pass


def _short(path: str) -> str:
    for marker in ("site-packages/", "/croqq/"):
        if marker in path:
            return ("croqq/" if marker == "/croqq/" else "") + path.split(marker, 1)[1]
    return path


def _top(stats: Any, key: int, count: int, only: str = "") -> list[str]:
    """The ``count`` functions with most cumulative (key 3) or own (key 2) time, in files under ``only``."""
    items = [kv for kv in stats.stats.items() if only in kv[0][0]]
    rows = sorted(items, key=lambda kv: kv[1][key], reverse=True)[:count]
    return [
        f"{_short(file)}:{line}({func}) cum {ct:.3f}s self {tt:.3f}s calls {nc}"
        for (file, line, func), (_, nc, tt, ct, _) in rows
    ]


def _profiled_run(env: dict[str, str], roles: list[str], server: Any) -> dict[int, str]:
    """A croqq run whose ``roles``' processes profile the submission's window; returns pid -> role."""
    from croqq.processes.local import LocalCluster

    with LocalCluster(env, log_level="WARNING") as cluster:
        cluster.wait_gpus()
        time.sleep(SETTLE_S)
        pids = {pid: name for pid, (name, _) in tree_cpu().items() if name in roles}
        for pid in pids:
            os.kill(pid, signal.SIGRTMIN + PROFILE_START)
        cluster.submit("f16", max_iter=MAX_ITER, limit=SHAPES)
        _wait_stored(server.client(), SHAPES * (MAX_ITER + 1))
        for pid in pids:
            os.kill(pid, signal.SIGRTMIN + PROFILE_DUMP)
        # wall seconds, not stretched by load: a profile not dumped by then is left out, not waited for
        deadline = Deadline(10, wall=True)
        while len(list(Path(os.environ[PROFILE_ENV]).glob("*.prof"))) < len(pids) and not deadline.expired():
            time.sleep(0.1)
    return pids


def profile_roles(work: Path, server: Any, roles: list[str], count: int = 12) -> dict[str, object]:
    """Run croqq again with ``roles``' processes under cProfile (their main thread's CPU time) for the
    submission's window; per role, the top croqq functions by cumulative time and all by own time."""
    import pstats

    hook, out = work / "hook", work / "profiles"
    hook.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(f"from {MODULE} import profile_hook\n\nprofile_hook()\n")
    server.client().flushall()
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", PROFILE_ENV)}
    # the children inherit this environment
    os.environ.update({"PYTHONPATH": _pythonpath(hook), PROFILE_ENV: str(out)})
    try:
        pids = _profiled_run(cluster_env(work, server), roles, server)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    profiles: dict[str, object] = {}
    for role in roles:
        files = [str(out / f"{pid}.prof") for pid, name in pids.items() if name == role]
        files = [f for f in files if Path(f).exists()]
        if not files:
            profiles[role] = {"processes": 0}
            continue
        stats = pstats.Stats(*files)
        profiles[role] = {
            "processes": len(files),
            "cpu_s": round(stats.total_tt, 3),  # type: ignore[attr-defined]
            "top_croqq_cumulative": _top(stats, 3, count, only=f"{os.sep}croqq{os.sep}"),
            "top_self": _top(stats, 2, count),
        }
    return {"cpu_profiles": profiles}


# -- the CPU cost ---------------------------------------------------------------------------------


PART = {  # croqq's roles and the floor's workers, by the queue they serve
    "croqq writer": "store",
    "floor store": "store",
    "croqq coordinator": "control",
    "floor control": "control",
    "croqq build-worker": "build",
    f"floor {QUEUE['b']}": "build",
    "croqq ideate-worker": "ideate",
    "floor ideate": "ideate",
    "croqq gpu-worker": "gpu",
    "croqq beat": "beat",
    "redis-server": "redis",
}


def _by_part(cpu: dict[str, float], iterations: int) -> dict[str, float]:
    """ms per iteration per part (a role with its pool children; the GPU workers together)."""
    parts: dict[str, float] = {}
    for name, seconds in cpu.items():
        role = name.removesuffix(" (pool)")
        part = PART.get(role, "gpu" if role.startswith("floor gpu.") else role)
        parts[part] = parts.get(part, 0.0) + seconds
    return {part: round(1e3 * s / iterations, 2) for part, s in sorted(parts.items())}


def cpu_cost(work: Path, rounds: int = ROUNDS, profile: bool = True) -> dict[str, object]:
    """croqq's and the floor's CPU per stored iteration, alternated ``rounds`` times on one Redis (the
    least of each: other load on a shared machine only ever adds), then a profile of the hottest role."""
    load = os.getloadavg()[0]
    server = _redis(work)
    runs: list[CroqqRun] = []
    floors: list[FloorRun] = []
    try:
        for i in range(rounds):
            server.client().flushall()
            runs.append(run_croqq(work / f"croqq{i}", server))
            server.client().flushall()
            spec = floor_spec(runs[0])  # every floor round makes the first croqq run's hops
            floors.append(run_floor(work / f"floor{i}", server, spec))
            if floors[-1].hops != sum(runs[0].hops.values()):
                raise RuntimeError(
                    f"the floor made {floors[-1].hops} hops, croqq {sum(runs[0].hops.values())}"
                )
        run = min(runs, key=lambda r: sum(r.cpu.values()))
        floor = min(floors, key=lambda f: sum(f.cpu.values()))
        roles = sorted((r for r in run.cpu if r != "redis-server"), key=lambda r: -run.cpu[r])
        prof = profile_roles(work / "profile", server, roles[:2]) if profile else {}
    finally:
        server.stop()
    n, hops = runs[0].iterations, sum(runs[0].hops.values())
    croqq_s = sum(run.cpu.values()) / run.iterations
    floor_s = sum(floor.cpu.values()) / n
    croqq_parts, floor_parts = _by_part(run.cpu, run.iterations), _by_part(floor.cpu, n)
    out: dict[str, object] = {
        "cpu_load_avg_1m": round(load, 2),
        "cpu_iterations": n,
        "cpu_rounds": rounds,
        "cpu_croqq_ms_per_iter": round(1e3 * croqq_s, 2),
        "cpu_croqq_ms_per_iter_rounds": [round(1e3 * sum(r.cpu.values()) / r.iterations, 2) for r in runs],
        "cpu_croqq_ms_per_iter_by_part": croqq_parts,
        "cpu_croqq_wall_s": round(run.wall_s, 1),
        "cpu_hops_per_iter": round(hops / n, 3),
        "cpu_hops_by_queue": {QUEUE.get(k, "gpu"): v for k, v in sorted(runs[0].hops.items())},
        "cpu_steps_by_kind": dict(sorted(runs[0].steps.items())),
        "cpu_floor_chains": spec["chains"],
        "cpu_payload_bytes": round(runs[0].payload_bytes, 1),
        "cpu_floor_payload_bytes": len(json.dumps([_floor_payload(spec)])),
        "cpu_floor_ms_per_iter": round(1e3 * floor_s, 2),
        "cpu_floor_ms_per_iter_rounds": [round(1e3 * sum(f.cpu.values()) / n, 2) for f in floors],
        "cpu_floor_ms_per_iter_by_part": floor_parts,
        "cpu_floor_wall_s": round(floor.wall_s, 1),
        "cpu_croqq_redis_bytes_per_hop": round(run.redis.net_bytes / sum(run.hops.values())),
        "cpu_floor_redis_bytes_per_hop": round(floor.redis.net_bytes / hops),
        "cpu_ratio": round(croqq_s / floor_s, 2),
        "cpu_ratio_target": 3.0,
        **floor_ceiling(floor_parts, floor.redis.net_bytes / n),
        "cpu_hottest_roles": roles[:2],
        **prof,
    }
    log.info("cpu cost: %s", out)
    return out


def floor_ceiling(floor_parts: dict[str, float], bytes_per_iter: float) -> dict[str, object]:
    """The fleet that the bare Celery floor itself would serve, by :func:`capacity_limits`: Redis's CPU
    and bytes per iteration and the store worker's CPU per iteration as the writer's time (CPU only:
    a lower bound of its busy time), nothing idle. No croqq with one Celery message per step and one
    writer process taking every STORE's message serves more on this machine."""
    limits = capacity_limits(1e-3 * floor_parts["redis"], bytes_per_iter, 1e-3 * floor_parts["store"])
    return {f"cpu_floor_{k}": v for k, v in limits.items() if k.startswith("capacity_gpus")} | {
        "cpu_floor_capacity_saturates_first": limits["capacity_saturates_first"]
    }


def _floor_payload(spec: dict[str, Any]) -> dict[str, Any]:
    prefix = f"c{spec['chains'] - 1}#10."
    step_id = prefix + "0" * max(0, spec["step_id_len"] - len(prefix))
    return {"step_id": step_id, "epoch": 0, "sid": spec["sid"], "kind": "measure"}


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "floor-worker":
        _floor_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif len(sys.argv) == 3 and sys.argv[1] in ("capacity", "cpu"):
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        log.setLevel(logging.INFO)  # this module's progress only: the writer's own lines would skew timings
        entry = capacity if sys.argv[1] == "capacity" else cpu_cost
        print(json.dumps(entry(Path(sys.argv[2])), indent=2))
    else:
        print("usage: python -m benchmarks.capacity_bench capacity|cpu <work dir>", file=sys.stderr)
        sys.exit(2)
