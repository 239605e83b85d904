"""Faults for chaos tests and `croqq stress`: a seeded schedule and one injector per kind.

Kills land mid-step deterministically: the harness raises a barrier (``croqq.work.barriers``), waits
until a process reports it has reached it, SIGKILLs that process (or its worker's main process), then
drops the barrier; the supervisor restarts what died, as systemd or Kubernetes would.

Each injection returns what recovery means for it: the steps that were in flight on the victim (recovered
when each is done, or its shape has stored a later round), or a progress check (recovered when the cluster
has stored a new round and the victim is back).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import redis

from croqq.delivery import keys
from croqq.delivery.redis_client import strs, text
from croqq.delivery.state import ShapeSummary
from croqq.errors import ConfigError
from croqq.patience import Deadline
from croqq.placement import registry
from croqq.probes.sim import inject_fault
from croqq.processes.local import REDIS, LocalCluster

BARRIER_WAIT_S = 30.0  # unloaded seconds (croqq.patience) for a process to reach a barrier

# kind -> (barrier to land on, which process to kill: "reached" = the one at the barrier, or a role)
KILLS: dict[str, tuple[str | None, str]] = {
    "kill_gpu_child": ("measure", "reached"),
    "kill_gpu_main": ("measure", "gpu-main"),
    "kill_writer": ("store", "writer"),
    "kill_writer_mid_commit": ("store:commit", "writer"),
    "kill_writer_after_commit": ("store:complete", "writer"),
    "kill_redis_mid_store": ("store:commit", REDIS),  # Redis restarts while the writer commits a batch
    "kill_build": ("implement", "reached"),
    "kill_ideate": ("ideate", "ideate"),
    "kill_beat": (None, "beat"),
    "kill_coordinator": (None, "coordinator"),
}
GPU_FAULTS = ("gpu_foreign_process", "gpu_overheat", "gpu_xid", "gpu_hang")
KINDS: tuple[str, ...] = (*KILLS, "kill_redis", *GPU_FAULTS)


@dataclass(frozen=True)
class PlannedFault:
    index: int
    at_round: int  # inject once this many rounds are stored
    kind: str
    gpu: int  # target GPU index for GPU faults (ignored otherwise)


@dataclass
class Injected:
    fault: PlannedFault
    at: float
    landed: bool
    target: str = ""
    steps: list[str] = field(default_factory=list)  # in flight on the victim
    shapes: dict[str, int] = field(default_factory=dict)  # sid -> current_iter at injection
    baseline_rounds: int = 0
    role: str = ""  # a killed process with no step in flight: recovered when it is back
    gpu: str = ""  # the GPU (uuid) the fault hit, where there is one
    recovered_at: float | None = None
    note: str = ""

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else round(self.recovered_at - self.at, 3)


def parse_kinds(spec: str) -> list[str]:
    """``default`` (every kind), ``none``, or a comma-separated list of kinds."""
    if spec == "default":
        return list(KINDS)
    if spec == "none":
        return []
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ConfigError(
            f"--faults: unknown fault kind(s) {unknown}; use default, none, or some of {', '.join(KINDS)}"
        )
    return kinds


def plan(seed: int, kinds: list[str], count: int, total_rounds: int, gpus: int) -> list[PlannedFault]:
    """A deterministic schedule: every kind at least once, then random kinds, spread over the run."""
    if not kinds or count <= 0:
        return []
    rng = random.Random(seed)
    chosen = list(kinds) + [rng.choice(kinds) for _ in range(max(0, count - len(kinds)))]
    rng.shuffle(chosen)
    span = max(1, int(total_rounds * 0.85))
    start = max(1, total_rounds // 20)
    return [
        PlannedFault(
            index=i,
            at_round=start + (span - start) * i // max(1, len(chosen)),
            kind=kind,
            gpu=rng.randrange(gpus),
        )
        for i, kind in enumerate(chosen)
    ]


class Injector:
    """Injects planned faults into a running LocalCluster and tells when each has recovered."""

    def __init__(self, cluster: LocalCluster, fault_seconds: float) -> None:
        self.cluster = cluster
        self.fault_seconds = fault_seconds

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.cluster.client

    def rounds(self) -> int:
        return int(self.client.hget(keys.STATS, "stored") or 0)

    def _shapes(self) -> dict[str, ShapeSummary]:
        raw = self.client.hgetall(keys.SUMMARY)
        return {str(k): ShapeSummary.model_validate_json(v) for k, v in raw.items()}

    def inject(self, fault: PlannedFault, avoid_gpus: Collection[str] = ()) -> Injected:
        """Inject ``fault``; a GPU fault spares ``avoid_gpus`` (GPUs still recovering from an earlier fault,
        so that each recovery time belongs to one fault) unless every busy GPU is among them."""
        now = time.time()
        if fault.kind in KILLS:
            return self._kill(fault, now)
        if fault.kind == "kill_redis":
            return self._kill_redis(fault, now)
        return self._gpu_fault(fault, now, set(avoid_gpus))

    # -- kills ---------------------------------------------------------------------------------------

    def _kill(self, fault: PlannedFault, now: float) -> Injected:
        barrier, victim = KILLS[fault.kind]
        shot = Injected(fault, now, landed=False, baseline_rounds=self.rounds())
        if barrier is None:
            shot.target, shot.role = victim, victim
            shot.landed = self._signal(victim) is not None
            shot.note = "" if shot.landed else f"{victim} was not running (restarting after an earlier kill)"
            return shot
        reached = self._land(barrier)
        if reached is None:
            shot.note = f"no process reached barrier {barrier!r} within {BARRIER_WAIT_S:.0f}s"
            return shot
        host_pid, step_id = reached
        try:
            pid = self._victim_pid(victim, host_pid, step_id)
            if pid is not None:
                steps = [step_id] if step_id else []  # read before the kill: the victim may be Redis
                gpu, shapes = self._gpu_of_step(step_id) if step_id else "", self._iters_of_steps(steps)
                self._kill_pid(pid)
                shot.at = time.time()  # recovery counts from the kill, not from raising the barrier
                shot.landed, shot.target = True, f"{victim} pid {pid} at {barrier}"
                shot.steps, shot.gpu, shot.shapes = steps, gpu, shapes
        finally:
            self._drop_barrier(barrier)
        return shot

    def _drop_barrier(self, barrier: str) -> None:
        """Delete the barrier, once Redis is back if the victim was Redis (its AOF kept the barrier)."""
        deadline = Deadline(BARRIER_WAIT_S)
        while True:
            try:
                self.client.delete(keys.barrier(barrier))
                return
            except redis.ConnectionError:
                if deadline.expired():
                    raise
                self.cluster.poll()
                time.sleep(0.1)

    def _land(self, barrier: str) -> tuple[str, str] | None:
        self.client.delete(keys.barrier(f"{barrier}:reached"))
        self.client.set(keys.barrier(barrier), "1")
        deadline = Deadline(BARRIER_WAIT_S)
        while not deadline.expired():
            reached = text(self.client.get(keys.barrier(f"{barrier}:reached")))
            if reached:
                host, pid, step_id = reached.split(":", 2)
                return f"{host}:{pid}", step_id
            self.cluster.poll()
            time.sleep(0.02)
        self.client.delete(keys.barrier(barrier))
        return None

    def _victim_pid(self, victim: str, host_pid: str, step_id: str) -> int | None:
        if victim == "reached":
            return int(host_pid.split(":")[1])
        if victim == "gpu-main":
            return self._gpu_main_pid(step_id)
        sup = self.cluster.supervisor
        return sup.children[victim].pid if sup is not None and victim in sup.children else None

    def _sid(self, step_id: str) -> str:
        """The shape a step belongs to (its ledger record says; a step id names only the key)."""
        return text(self.client.hget(keys.step(step_id), "sid")) or ""

    def _gpu_of_step(self, step_id: str) -> str:
        raw = self.client.hget(keys.SUMMARY, self._sid(step_id))
        return ShapeSummary.model_validate_json(raw).gpu if raw else ""

    def _gpu_main_pid(self, step_id: str) -> int | None:
        uuid = self._gpu_of_step(step_id)
        entry = registry.get_gpu(self.client, uuid) if uuid else None
        sup = self.cluster.supervisor
        name = f"gpu{entry.index}" if entry is not None else ""
        return sup.children[name].pid if sup is not None and name in sup.children else None

    def _signal(self, name: str) -> int | None:
        sup = self.cluster.supervisor
        return sup.signal(name, signal.SIGKILL) if sup is not None and name in sup.children else None

    @staticmethod
    def _kill_pid(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _kill_redis(self, fault: PlannedFault, now: float) -> Injected:
        """SIGKILL the embedded Redis; the supervisor restarts it on the same AOF and socket."""
        baseline = self.rounds()
        pid = self._signal(REDIS)
        if pid is None:
            return Injected(fault, now, landed=False, note="no embedded Redis running to kill")
        return Injected(fault, now, landed=True, target=f"redis-server pid {pid}", baseline_rounds=baseline)

    # -- GPU faults ----------------------------------------------------------------------------------

    def _gpu_fault(self, fault: PlannedFault, now: float, avoid: set[str]) -> Injected:
        """Fault one of the GPUs that hold shapes (the planned index picks among them)."""
        busy = sorted({s.gpu for s in self._shapes().values() if s.gpu and s.status == "active"})
        busy = [u for u in busy if u not in avoid] or busy
        uuids = busy or sorted(strs(self.client.smembers(keys.GPUS)))
        uuid = uuids[fault.gpu % len(uuids)]
        kind = fault.kind.removeprefix("gpu_")
        # a foreign process is transient: gone well inside the health wait, so the GPU waits it out
        transient = kind == "foreign_process"
        seconds = self.cluster.settings.health_wait_s / 3 if transient else self.fault_seconds
        value = 79 if kind == "xid" else 1
        shot = Injected(fault, now, landed=True, target=uuid, gpu=uuid, baseline_rounds=self.rounds())
        shot.shapes = {
            sid: s.current_iter for sid, s in self._shapes().items() if s.gpu == uuid and s.status == "active"
        }
        inject_fault(self.client, uuid, kind, seconds=seconds, value=value)
        return shot

    # -- recovery ------------------------------------------------------------------------------------

    def _iters_of_steps(self, step_ids: list[str]) -> dict[str, int]:
        shapes = self._shapes()
        sids = {self._sid(s) for s in step_ids}
        return {sid: shapes[sid].current_iter for sid in sids if sid in shapes}

    def recovered(self, shot: Injected) -> bool:
        """Every step in flight on the victim is done (or its shape stored a later round); else, for a
        fault with none, the cluster stored a new round after it."""
        if not shot.landed:
            return True
        try:
            if shot.role:
                return self._role_back(shot.role)
            if shot.steps:
                return all(self._step_finished(step_id, shot) for step_id in shot.steps)
            if shot.shapes:
                shapes = self._shapes()
                return all(
                    sid not in shapes or shapes[sid].current_iter > it or shapes[sid].status == "done"
                    for sid, it in shot.shapes.items()
                )
            return self.rounds() > shot.baseline_rounds or self._all_done()
        except Exception:  # Redis restarting
            return False

    def _step_finished(self, step_id: str, shot: Injected) -> bool:
        """The killed step was finished by someone else, or its shape has moved past it."""
        if text(self.client.hget(keys.step(step_id), "status")) == "done":
            return True
        sid = self._sid(step_id)
        shape = self._shapes().get(sid)
        return shape is None or shape.status == "done" or shape.current_iter > shot.shapes.get(sid, 1 << 30)

    def _role_back(self, role: str) -> bool:
        """The restarted process of ``role`` holds its lease (beat) or is registered (workers)."""
        sup = self.cluster.supervisor
        child = sup.children.get(role) if sup is not None else None
        if child is None or not child.alive():
            return False
        if role == "beat":
            owner = text(self.client.get(keys.lease("beat"))) or ""
            return owner.split(":")[1:2] == [str(child.pid)]
        nodes = strs(self.client.zrange(keys.WORKERS, 0, -1))  # names carry no pid: the registry does
        return any(text(self.client.hget(keys.worker(node), "pid")) == str(child.pid) for node in nodes)

    def _all_done(self) -> bool:
        return all(s.status in ("done", "error") for s in self._shapes().values())
