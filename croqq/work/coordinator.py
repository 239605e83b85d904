"""The coordinator: registers submitted shapes, assigns them to GPUs, migrates them off quarantined GPUs,
and rebuilds live state from the results repo after a cold start. Stateless: every decision is a Redis
transaction, so any number of coordinators (and the workers that advance shapes inline) can run at once.

Assignment: each healthy GPU holds up to ``pipeline_depth`` active shapes (so it measures one while the
others ideate and compile). A shape keeps its GPU for life unless that GPU is quarantined or goes offline;
it then waits in the pending set (ahead of new shapes) and re-measures its best on its next GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from croqq.delivery import keys
from croqq.delivery.ledger import Ledger, StepRecord
from croqq.delivery.messages import SubmitMessage
from croqq.delivery.queues import GPU_KINDS
from croqq.delivery.redis_client import strs
from croqq.delivery.state import ShapeState, make_sid
from croqq.domain.fsm import Loop, Phase, Reopen, Start, transition
from croqq.domain.manifest import Manifest
from croqq.domain.schedule import ScheduledShape, build_schedule
from croqq.placement import registry
from croqq.settings import Settings
from croqq.store.schema import Checkpoint
from croqq.work.persist import loop_from_checkpoint

log = logging.getLogger(__name__)

CheckpointLoader = Callable[[str, str, str], Checkpoint | None]


@dataclass
class SubmitReport:
    new: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def sids(self) -> list[str]:
        return self.new + self.resumed + self.reopened + self.skipped


class Coordinator:
    def __init__(
        self,
        settings: Settings,
        manifest: Manifest,
        client: redis.Redis,
        ledger: Ledger,
        checkpoints: CheckpointLoader | None = None,
    ) -> None:
        self.settings = settings
        self.manifest = manifest
        self.client = client
        self.ledger = ledger
        self.checkpoints = checkpoints

    # -- submit ----------------------------------------------------------------------------------------

    def submit(self, msg: SubmitMessage) -> SubmitReport:
        """Register every shape of a submission (idempotent), then fill the GPUs of its type."""
        report = SubmitReport()
        for entry in msg.shapes:
            sid = make_sid(msg.gpu_type, msg.dsl, entry.key)
            outcome = self._register(sid, entry, msg)
            getattr(report, outcome).append(sid)
        pipe = self.client.pipeline()
        pipe.set(keys.submission(msg.submission), __import__("json").dumps(report.sids))
        pipe.rpush(keys.SUBMISSIONS, msg.submission)
        pipe.execute()
        log.info(
            "submission %s: %d new, %d resumed, %d reopened, %d already complete",
            msg.submission,
            len(report.new),
            len(report.resumed),
            len(report.reopened),
            len(report.skipped),
        )
        self.fill_all(msg.gpu_type)
        return report

    def _new_loop(self, max_iter: int) -> Loop:
        return Loop(
            max_iter=max_iter,
            profile_every=self.settings.profile_every,
            noise_margin=self.settings.noise_margin,
        )

    def _fresh_state(self, sid: str, entry: ScheduledShape, msg: SubmitMessage) -> tuple[ShapeState, str]:
        ckpt = self.checkpoints(msg.gpu_type, msg.dsl, entry.key) if self.checkpoints else None
        if ckpt is None:
            loop, outcome = self._new_loop(msg.max_iter), "new"
        else:
            loop = loop_from_checkpoint(ckpt, self.settings, msg.max_iter)
            outcome = "skipped" if loop.phase == Phase.DONE else "resumed"
        state = ShapeState(
            sid=sid,
            gpu_type=msg.gpu_type,
            dsl=msg.dsl,
            key=entry.key,
            dtype=entry.dtype,
            m=entry.m,
            n=entry.n,
            k=entry.k,
            mode=ckpt.mode if ckpt else msg.mode,
            scenarios=entry.scenarios,
            region=entry.region,
            rank=entry.rank,
            loop=loop,
            needs_rebase=loop.current_iter >= 0,
        )
        return state, outcome

    def _register(self, sid: str, entry: ScheduledShape, msg: SubmitMessage) -> str:
        def body(pipe: Any) -> str:
            state = self.ledger.load_shape(sid, pipe)
            if state is None:
                state, outcome = self._fresh_state(sid, entry, msg)
                pipe.multi()
                pipe.sadd(keys.SHAPES, sid)
                if outcome != "skipped":
                    pipe.zadd(keys.pending(state.gpu_type), {sid: state.pending_score()})
                self.ledger.save_shape(pipe, state)
                return outcome
            loop = state.loop
            if loop.phase == Phase.DONE and msg.max_iter > loop.current_iter:
                state.loop = transition(loop, Reopen(max_iter=msg.max_iter))
                pipe.multi()
                self.ledger.release_gpu(pipe, state)
                self.ledger.save_shape(pipe, state)
                return "reopened"
            pipe.multi()
            if loop.phase == Phase.DONE:
                return "skipped"
            if msg.max_iter > loop.max_iter:
                state.loop = loop.model_copy(update={"max_iter": msg.max_iter})
                self.ledger.save_shape(pipe, state)
            return "resumed"

        return str(self.ledger.txn.run([keys.shape(sid)], body))

    # -- assignment ------------------------------------------------------------------------------------

    def fill_all(self, gpu_type: str | None = None) -> int:
        placed = 0
        for gpu in registry.all_gpus(self.client):
            if gpu.status == registry.HEALTHY and (gpu_type is None or gpu.gpu_type == gpu_type):
                placed += self.fill(gpu.uuid)
        return placed

    def fill(self, uuid: str) -> int:
        """Give a healthy GPU pending shapes until it holds ``pipeline_depth`` of them."""
        gpu = registry.get_gpu(self.client, uuid)
        if gpu is None or gpu.status != registry.HEALTHY:
            return 0
        placed = 0
        while True:
            outcome = self._place_one(gpu.uuid, gpu.gpu_type, gpu.queue)
            if outcome is None:
                return placed
            if isinstance(outcome, StepRecord):
                self.ledger.publish([outcome])
            placed += 1

    def _place_one(self, uuid: str, gpu_type: str, queue: str) -> Any:
        """Move the best pending shape onto the GPU: a StepRecord to publish, _Skip, or None (full/empty)."""
        pending_key, active_key = keys.pending(gpu_type), keys.active(uuid)

        def body(pipe: Any) -> Any:
            if pipe.scard(active_key) >= self.settings.pipeline_depth:
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
                return _Skip()
            if state.loop.phase == Phase.INIT:
                state.loop = transition(state.loop, Start())
                # the first iteration's clock starts with its GPU slot: waiting for capacity is not overhead
                state.iter_t0, state.iter_exec_s = time.time(), 0.0
            pipe.multi()
            pipe.zrem(pending_key, sid)
            pipe.sadd(active_key, sid)
            state.gpu_uuid = uuid
            record: StepRecord | _Skip | None = None
            if state.step_id is None:
                record = self.ledger.plan_step(pipe, state, queue)
            record = record or _Skip()
            self.ledger.save_shape(pipe, state)
            log.info("%s assigned to GPU %s", state.key, uuid)
            return record

        return self.ledger.txn.run([pending_key, active_key], body)

    # -- quarantine / offline --------------------------------------------------------------------------

    def quarantine(self, uuid: str, reason: str, status: str = registry.QUARANTINED) -> int:
        """Stop using a GPU and release its shapes (they re-measure their best on their next GPU)."""
        registry.set_status(self.client, uuid, status, reason)
        moved = 0
        for sid in sorted(strs(self.client.smembers(keys.active(uuid)))):
            moved += self._evict(sid, uuid)
        registry_gpu = registry.get_gpu(self.client, uuid)
        self.client.hincrby(keys.STATS, "quarantines" if status == registry.QUARANTINED else "offline", 1)
        self.client.hincrby(keys.STATS, "migrations", moved)
        log.warning("GPU %s %s (%s): %d shape(s) released to other GPUs", uuid, status, reason, moved)
        self.fill_all(registry_gpu.gpu_type if registry_gpu else None)
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
            if step is not None and step.kind in GPU_KINDS and step.status in ("queued", "running"):
                self.ledger.drop_step(pipe, step.step_id)
                state.step_id = None
            if state.loop.phase == Phase.DONE:
                pipe.srem(keys.active(uuid), sid)
                return 0
            self.ledger.release_gpu(pipe, state)
            self.ledger.save_shape(pipe, state)
            return 1

        return int(self.ledger.txn.run(watch, body))

    # -- cold start ------------------------------------------------------------------------------------

    def rebuild_from_repo(
        self,
        runs: list[tuple[str, str]],
        state_keys: Callable[[str, str], list[str]],
        tried: Callable[[str, str, str], list[str]],
    ) -> int:
        """Recreate live state for every incomplete shape recorded in the results repo (Redis was emptied)."""
        if self.checkpoints is None:
            return 0
        ranks = {s.key: s for s in build_schedule(self.manifest, "all")}
        count = 0
        for gpu_type, dsl in runs:
            for key in state_keys(gpu_type, dsl):
                ckpt = self.checkpoints(gpu_type, dsl, key)
                if ckpt is None:
                    continue
                entry = ranks.get(key) or ScheduledShape(
                    key=key,
                    dtype=ckpt.dtype,
                    m=ckpt.m,
                    n=ckpt.n,
                    k=ckpt.k,
                    scenarios=ckpt.scenarios,
                    region=ckpt.region,
                    rank=len(ranks),
                )
                msg = SubmitMessage(
                    submission="rebuild",
                    gpu_type=gpu_type,
                    dsl=dsl,
                    mode=ckpt.mode,
                    max_iter=ckpt.max_iter,
                    shapes=[entry],
                )
                sid = make_sid(gpu_type, dsl, key)
                if self._register(sid, entry, msg) == "resumed":
                    hashes = tried(gpu_type, dsl, key)
                    if hashes:
                        self.client.sadd(keys.ideas(sid), *hashes)
                    count += 1
        log.warning("cold start: rebuilt live state of %d shape(s) from the results repo", count)
        return count


class _Skip:
    """A pending entry that was consumed without publishing a step (done, vanished, or already stepping)."""
