"""Which GPU holds which shape: the one place that puts shapes on GPUs and takes them off.

Each healthy GPU holds up to its pipeline depth of active shapes (so it measures one while the others
ideate and compile); :mod:`croqq.placement.depth` chooses that depth from the step times it observes. A
shape keeps its GPU for life unless that GPU is quarantined or goes offline; it then waits in the pending
set (ahead of new shapes) and re-measures its best on its next GPU. A shape that is done leaves its GPU,
which is then filled again.

Every decision is a Redis transaction, so any number of coordinators (and the workers that advance shapes
inline) can place at once.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from croqq.delivery import clock, keys
from croqq.delivery.ledger import Ledger, StepStatus
from croqq.delivery.queues import GPU_KINDS
from croqq.delivery.redis_client import strs, text
from croqq.delivery.state import ShapeState, release_gpu
from croqq.domain.fsm import Phase, Start, transition
from croqq.placement import depth, registry
from croqq.settings import Settings

log = logging.getLogger(__name__)


def leave_if_finished(pipe: Any, state: ShapeState) -> None:
    """A shape that is done or parked frees its GPU slot (pipe in multi mode); it keeps the GPU's name."""
    if state.gpu_uuid and (state.loop.phase == Phase.DONE or state.error):
        pipe.srem(keys.active(state.gpu_uuid), state.sid)


class Placement:
    def __init__(self, settings: Settings, client: redis.Redis, ledger: Ledger) -> None:
        self.settings = settings
        self.client = client
        self.ledger = ledger

    # -- assignment ------------------------------------------------------------------------------------

    def fill_all(self, gpu_type: str | None = None, gpus: list[registry.GpuEntry] | None = None) -> int:
        """:meth:`fill` every healthy GPU (of ``gpu_type``): the registry (``gpus``, if the caller has just
        read it), the shapes on each GPU and the depths read in a few round trips; only a GPU below its
        depth with shapes waiting for its type opens a transaction, which checks the GPU is still healthy.
        Costs a few commands per GPU and writes nothing when there is nothing to do."""
        gpus = registry.all_gpus(self.client) if gpus is None else gpus
        ready = [g for g in gpus if g.status == registry.HEALTHY and gpu_type in (None, g.gpu_type)]
        now = depth.load(self.client, gpus)
        limits = depth.choose_all(self.client, self.settings, ready, now)
        return sum(
            self._fill(g, limits[g.uuid])
            for g in ready
            if now.active[g.uuid] < limits[g.uuid] and now.pending.get(g.gpu_type, 0)
        )

    def fill(self, uuid: str) -> int:
        """Give a healthy GPU pending shapes until it holds its pipeline depth of them."""
        gpu = registry.get_gpu(self.client, uuid)
        if gpu is None or gpu.status != registry.HEALTHY:
            return 0
        return self._fill(gpu, depth.choose(self.client, self.settings, gpu))

    def _fill(self, gpu: registry.GpuEntry, limit: int) -> int:
        placed = 0
        while True:
            outcome = self._place_one(gpu.uuid, gpu.gpu_type, gpu.queue, limit)
            if outcome is None:
                return placed
            if outcome is not _SKIP:
                self.ledger.publish([outcome])
            placed += 1

    def _place_one(self, uuid: str, gpu_type: str, queue: str, limit: int) -> Any:
        """Move the best pending shape onto the GPU: a StepRecord to publish, _SKIP, or None (full/empty)."""
        pending_key, active_key = keys.pending(gpu_type), keys.active(uuid)

        def body(pipe: Any) -> Any:
            if (
                pipe.scard(active_key) >= limit
                or text(pipe.hget(keys.gpu(uuid), "status")) != registry.HEALTHY
            ):
                pipe.multi()
                return None
            head = pipe.zrange(pending_key, 0, 0)
            if not head:
                pipe.multi()
                return None
            sid = head[0]
            pipe.watch(keys.shape(sid))
            state = self.ledger.load_shape(sid, pipe)
            if state is None or state.loop.phase == Phase.DONE or state.error:
                pipe.multi()
                pipe.zrem(pending_key, sid)
                return _SKIP
            if state.loop.phase == Phase.INIT:
                state.loop = transition(state.loop, Start())
            if state.loop.phase == Phase.BASELINE or not state.iter_t0:
                # an iteration's clock starts with its GPU slot: waiting for capacity is not overhead
                state.iter_t0, state.iter_exec_s = clock.now(pipe), 0.0
            pipe.multi()
            pipe.zrem(pending_key, sid)
            pipe.sadd(active_key, sid)
            state.gpu_uuid = uuid
            record = self.ledger.plan_step(pipe, state, queue) if state.step_id is None else None
            self.ledger.save_shape(pipe, state)
            log.info("%s assigned to GPU %s", state.key, uuid)
            return record or _SKIP

        return self.ledger.txn.run([pending_key, active_key], body)

    # -- quarantine / offline --------------------------------------------------------------------------

    def admit(self, entry: registry.GpuEntry) -> int:
        """A GPU worker (re)starts: register its GPU (``entry.status``: what its start health check found)
        and fill it if healthy. A stored quarantine outlives the restart; a quarantined GPU keeps no shapes.
        Returns the shapes placed on it."""
        before = registry.register_gpu(self.client, entry)
        gpu = registry.get_gpu(self.client, entry.uuid)
        if gpu is not None and gpu.status == registry.HEALTHY:
            return self.fill(entry.uuid)
        if before != registry.QUARANTINED:
            self.client.hincrby(keys.STATS, "quarantines", 1)
            log.warning("GPU %s quarantined at start: %s", entry.uuid, entry.reason)
        else:
            log.warning("GPU %s stays quarantined (%s)", entry.uuid, gpu.reason if gpu else "")
        self._release_shapes(entry.uuid, entry.gpu_type)
        return 0

    def lift(self, uuid: str, cooldown_s: float = 0.0) -> bool:
        """End a GPU's quarantine once ``cooldown_s`` has passed since it began; fill it. True if lifted."""
        if not registry.lift_quarantine(self.client, uuid, cooldown_s):
            return False
        self.fill(uuid)
        return True

    def quarantine(self, uuid: str, reason: str, status: str = registry.QUARANTINED) -> int:
        """Stop using a GPU and release its shapes (they re-measure their best on their next GPU)."""
        registry.set_status(self.client, uuid, status, reason)
        registry_gpu = registry.get_gpu(self.client, uuid)
        self.client.hincrby(keys.STATS, "quarantines" if status == registry.QUARANTINED else "offline", 1)
        moved = self._release_shapes(uuid, registry_gpu.gpu_type if registry_gpu else None)
        log.warning("GPU %s %s (%s): %d shape(s) released to other GPUs", uuid, status, reason, moved)
        return moved

    def _release_shapes(self, uuid: str, gpu_type: str | None) -> int:
        """Every shape on the GPU goes back to pending and on to other GPUs of its type."""
        moved = 0
        for sid in sorted(strs(self.client.smembers(keys.active(uuid)))):
            moved += self._evict(sid, uuid)
        self.client.hincrby(keys.STATS, "migrations", moved)
        self.fill_all(gpu_type)
        return moved

    def _evict(self, sid: str, uuid: str) -> int:
        state0 = self.ledger.load_shape(sid)
        watch = [keys.shape(sid)] + ([keys.step(state0.step_id)] if state0 and state0.step_id else [])

        def body(pipe: Any) -> int:
            state = self.ledger.load_shape(sid, pipe)
            if state is None or state.gpu_uuid != uuid:
                pipe.multi()
                pipe.srem(keys.active(uuid), sid)
                return 0
            step = self.ledger.load_step(state.step_id, pipe) if state.step_id else None
            pipe.multi()
            if (
                step is not None
                and step.kind in GPU_KINDS
                and step.status in (StepStatus.QUEUED, StepStatus.RUNNING)
            ):
                self.ledger.drop_step(pipe, step.step_id)
                state.step_id = None
            if state.loop.phase == Phase.DONE:
                pipe.srem(keys.active(uuid), sid)
                return 0
            release_gpu(pipe, state)
            self.ledger.save_shape(pipe, state)
            return 1

        return int(self.ledger.txn.run(watch, body))

    def release_offline_gpus(self, gpus: list[registry.GpuEntry] | None = None) -> int:
        """GPUs (of ``gpus``, if the caller has just read the registry) whose worker's lease is gone for
        longer than ``gpu_offline_s`` give their shapes back.

        A quarantined GPU holds no shapes and stays quarantined while its worker is away (offline would
        let a returning worker bring it back without its cool-down)."""
        now, count = clock.now(self.client), 0
        gpus = registry.all_gpus(self.client) if gpus is None else gpus
        watched = [g for g in gpus if g.status not in (registry.OFFLINE, registry.QUARANTINED)]
        pipe = self.client.pipeline(transaction=False)
        for gpu in watched:
            pipe.exists(keys.lease(f"gpu:{gpu.uuid}"))
        for gpu, claimed in zip(watched, pipe.execute(), strict=True):
            if claimed:
                if gpu.missing_since:
                    self.client.hset(keys.gpu(gpu.uuid), "missing_since", "0")
                continue
            if not gpu.missing_since:
                self.client.hset(keys.gpu(gpu.uuid), "missing_since", repr(now))
            elif now - gpu.missing_since > self.settings.gpu_offline_s:
                self.quarantine(gpu.uuid, "its worker is gone", status=registry.OFFLINE)
                count += 1
        return count


class _Skip:
    """A pending entry that was consumed without publishing a step (done, vanished, or already stepping)."""


_SKIP = _Skip()
