"""Reconciliation, run by the coordinator on every beat tick; idempotent, so missed or doubled ticks
are harmless (every repair is a Redis transaction that re-checks its premise).

Each tick: re-queue steps whose lease expired (epoch + 1), publish outbox entries a crash left behind,
wake the writer when a STORE waited a lease TTL (its wake-up was lost with a killed writer or Redis's tail),
forget dead workers and re-publish steps queued before their consumer died, release the shapes of GPUs
whose worker is gone for good, re-probe quarantined GPUs, repair shapes left without a step, fill GPUs,
and after a Redis restart, restore or flush, and on a schedule, ask the writer to reconcile live state
against the results repo (:mod:`croqq.work.reconcile`: git is the truth; only the writer has the repo).
"""

from __future__ import annotations

import logging
from typing import Any

from croqq.delivery import clock, keys
from croqq.delivery.ledger import StepRecord, StepStatus
from croqq.delivery.queues import STORE, TASK_GIT_RECONCILE, TASK_GPU_RECHECK
from croqq.delivery.redis_client import strs, text
from croqq.delivery.state import ShapeState
from croqq.domain.fsm import Phase
from croqq.placement import registry
from croqq.work.context import Runtime
from croqq.work.reconcile import redis_forgot

log = logging.getLogger(__name__)
OUTBOX_GRACE_S = 2.0
UNSTICK_EVERY_S = 10.0
GIT_RECONCILE_MAX_AGE_S = 30.0  # a reconcile request older than this is skipped (a newer one follows)


def every(rt: Runtime, name: str, seconds: float) -> bool:
    """True at most once per ``seconds`` across all coordinators."""
    return bool(rt.client.set(keys.tick(name), "1", px=int(seconds * 1000), nx=True))


def reconcile(rt: Runtime) -> dict[str, int]:
    out: dict[str, int] = {}
    if git_reconcile_due(rt):
        out["git_reconcile"] = ask_writer_to_reconcile(rt)
    out["expired"] = rt.ledger.expire_leases()
    out["outbox"] = rt.ledger.flush_outbox(OUTBOX_GRACE_S)
    out["store_wake"] = int(rt.ledger.wake_writer(older_than_s=rt.settings.lease_ttl_s))
    out["dead_workers"] = len(registry.reap_dead_workers(rt.client, rt.settings.lease_ttl_s))
    out["republished"] = republish_after_resets(rt)
    gpus = registry.all_gpus(rt.client)  # one read of the registry for the offline check and the fill
    out["offline"] = rt.placement.release_offline_gpus(gpus)
    if every(rt, "recheck", rt.settings.recheck_every_s):
        out["rechecks"] = recheck_quarantined(rt)
    if every(rt, "unstick", UNSTICK_EVERY_S):
        out["unstuck"] = unstick_shapes(rt)
    out["placed"] = rt.placement.fill_all(gpus=None if out["offline"] else gpus)
    if any(v for k, v in out.items() if k != "placed"):
        log.info("reconcile: %s", {k: v for k, v in out.items() if v})
    return out


def git_reconcile_due(rt: Runtime) -> bool:
    """After a Redis restart, restore or flush (checked every tick), and on the git reconcile schedule."""
    if redis_forgot(rt.client) and every(rt, "git-reconcile-now", 2.0):
        log.warning(
            "Redis restarted, was restored or flushed: reconciling live state against the results repo"
        )
        return True
    return every(rt, "git-reconcile", rt.settings.git_reconcile_every_s)


def ask_writer_to_reconcile(rt: Runtime) -> int:
    """Send the writer (the only process with the results repo) its reconcile task; a stale one is skipped."""
    rt.send_task(TASK_GIT_RECONCILE, STORE, GIT_RECONCILE_MAX_AGE_S)
    return 1


def republish_after_resets(rt: Runtime) -> int:
    """Steps still queued from before their queue's consumer died or restarted, or queued too long."""
    queued: list[tuple[str, float]] = list(rt.client.zrange(keys.QUEUED, 0, -1, withscores=True))  # type: ignore[arg-type]
    if not queued:
        return 0
    pipe = rt.client.pipeline(transaction=False)
    for step_id, _ in queued:
        pipe.hget(keys.step(step_id), "queue")
    step_queues = [text(q) for q in pipe.execute()]
    resets: dict[str, float] = {}
    for queue in set(filter(None, step_queues)):
        raw = rt.client.get(keys.queue_reset(queue))
        resets[queue] = float(raw) if raw else 0.0
    now = clock.now(rt.client)
    stale = [
        step_id
        for (step_id, published), queue in zip(queued, step_queues, strict=True)
        if queue is None or resets.get(queue, 0.0) > published or now - published > rt.settings.queue_resend_s
    ]
    return rt.ledger.republish(stale, "its queue's consumer restarted or it waited too long")


def recheck_quarantined(rt: Runtime) -> int:
    """Ask the worker of each quarantined GPU whose cool-down is over to probe it again."""
    count, cooldown = 0, rt.settings.quarantine_cooldown_s
    for gpu in registry.all_gpus(rt.client):
        if gpu.status != registry.QUARANTINED or registry.cooldown_left(rt.client, gpu, cooldown) > 0:
            continue
        if rt.client.exists(keys.lease(f"gpu:{gpu.uuid}")):
            rt.send_task(TASK_GPU_RECHECK, gpu.queue, rt.settings.recheck_every_s, [{"gpu_uuid": gpu.uuid}])
            count += 1
    return count


def recheck_gpu(rt: Runtime, uuid: str) -> bool:
    """In the GPU's worker: lift its quarantine if the cool-down is over and the probe finds it healthy,
    then fill it. True if it is back in service."""
    gpu = registry.get_gpu(rt.client, uuid)
    if gpu is None or gpu.status != registry.QUARANTINED:
        return False
    left = registry.cooldown_left(rt.client, gpu, rt.settings.quarantine_cooldown_s)
    if left > 0:
        log.info("GPU %s stays quarantined for at least %.0fs more (cool-down)", uuid, left)
        return False
    health = rt.probe.health(uuid)
    if not health.ok:
        log.info("GPU %s still unhealthy: %s", uuid, "; ".join(health.problems))
        return False
    return rt.placement.lift(uuid, rt.settings.quarantine_cooldown_s)


def unstick_shapes(rt: Runtime) -> int:
    """Shapes that are neither done, nor stepping, nor waiting for a GPU get their next step planned."""
    sids = sorted(strs(rt.client.smembers(keys.SHAPES)))
    fixed = 0
    for start in range(0, len(sids), 200):
        batch = sids[start : start + 200]
        raws = rt.client.mget([keys.shape(s) for s in batch])
        for raw in raws:
            if raw and _stuck(rt, ShapeState.loads(raw)):
                fixed += _replan(rt, ShapeState.loads(raw).sid)
    return fixed


def _stuck(rt: Runtime, state: ShapeState, conn: Any = None) -> bool:
    if state.loop.phase == Phase.DONE or state.error:
        return False
    if state.step_id is not None:
        record = rt.ledger.load_step(state.step_id, conn)
        return record is None or record.status in (StepStatus.DONE, StepStatus.DROPPED)
    if state.gpu_uuid is None:
        return (conn or rt.client).zscore(keys.pending(state.gpu_type), state.sid) is None
    return True


def _replan(rt: Runtime, sid: str) -> int:
    def body(pipe: Any) -> tuple[StepRecord | None, bool]:
        state = rt.ledger.load_shape(sid, pipe)
        if state is not None and state.step_id is not None:
            pipe.watch(keys.step(state.step_id))  # the step's status is part of the premise
        if state is None or not _stuck(rt, state, pipe):
            pipe.multi()
            return None, False
        queue = rt.ledger.queue_for(state, pipe)
        pipe.multi()
        state.step_id = None
        nxt = rt.ledger.plan_step(pipe, state, queue)
        rt.ledger.save_shape(pipe, state)
        return nxt, True

    nxt, fixed = rt.ledger.txn.run([keys.shape(sid)], body)
    rt.ledger.publish([nxt])
    if fixed:
        log.warning("%s had no step in flight; planned its next step", sid)
    return int(fixed)
