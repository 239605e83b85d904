"""Git is the truth; Redis is a cache that may lose its tail.

Redis can forget: a crash with ``appendfsync everysec`` or ``no`` drops its last writes, a restore from a
snapshot drops minutes, a FLUSHALL drops everything. Live state is therefore reconciled against the
results repo after every Redis restart (its run id changed, or the marker is gone) and on a schedule:

- a shape the repo holds but Redis does not know is registered again from its checkpoint;
- a shape whose stored iterations and attempts (``current_iter``, ``attempts``) differ from the repo's
  takes the repo's loop: iterations in git but not in Redis are adopted, results in Redis but not in git
  are run again (its in-flight step is dropped; it keeps its GPU slot and re-measures its best);
- a shape whose STORE is queued or running is left alone: the writer settles it (a repeat of the same
  step is acknowledged, another step's result or a gap makes the loop reload from the repo).

Every repair is a transaction on the shape's key that re-reads the checkpoint after WATCH, so a STORE
committed meanwhile either shows in the checkpoint or aborts the repair.

It runs in the writer (a task on the ``store`` queue that the coordinator's housekeeping sends when it is
due), the only process with the results repo; a rebuilt loop carries its best kernel's source, read back
here, so no other host ever reads the repo.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis

from croqq.delivery import keys
from croqq.delivery.ledger import StepRecord, StepStatus
from croqq.delivery.redis_client import redis_run_id, strs, text
from croqq.delivery.state import make_sid, release_gpu, split_sid
from croqq.domain.fsm import Phase
from croqq.work import history
from croqq.work.context import Runtime
from croqq.work.persist import resumable_loop

if TYPE_CHECKING:
    from croqq.store.gitrepo import GitRepo

log = logging.getLogger(__name__)


def redis_forgot(client: redis.Redis) -> bool:
    """True when Redis restarted, was restored or flushed since the writer last reconciled live state."""
    return text(client.get(keys.REDIS_RUN)) != redis_run_id(client)


def reconcile(rt: Runtime) -> dict[str, int]:
    """Reconcile every shape against the results repo; returns counts of what was repaired."""
    started = time.monotonic()
    run_id = redis_run_id(rt.client)
    repo = rt.writer.repo
    out = {"registered": register_missing(rt, repo), "adopted": 0, "rerun": 0}
    for sid in sorted(strs(rt.client.smembers(keys.SHAPES))):
        outcome = _reconcile_shape(rt, repo, sid)
        if outcome:
            out[outcome] += 1
    rt.client.set(keys.REDIS_RUN, run_id)
    took = time.monotonic() - started
    if any(out.values()):
        log.warning("reconciled live state against the results repo in %.2fs: %s", took, out)
    else:
        log.info("reconciled live state against the results repo in %.2fs: nothing to repair", took)
    return out


def register_missing(rt: Runtime, repo: GitRepo) -> int:
    """Register the shapes the repo records but Redis does not know: those with a checkpoint (with their
    tried ideas and history), then the rest of every recorded submission."""
    from croqq.store.load import list_runs, load_state, load_submissions, tried_hashes

    def state_keys(gpu_type: str, dsl: str) -> list[str]:
        state = load_state(repo, gpu_type, dsl)
        return sorted(
            key
            for key in (state.shapes if state else {})
            if not rt.client.exists(keys.shape(make_sid(gpu_type, dsl, key)))
        )

    def restore(sid: str) -> None:
        """The shape's memory: the ideas it tried (not to be proposed again) and its history."""
        hashes = tried_hashes(repo, *split_sid(sid))
        if hashes:
            rt.client.sadd(keys.ideas(sid), *hashes)
        history.rebuild(rt.client, repo, sid)

    runs = list_runs(repo)
    count = rt.intake.rebuild_from_repo(repo, runs, state_keys, restore)
    return count + sum(rt.intake.register_recorded(load_submissions(repo, g, d), repo) for g, d in runs)


def _reconcile_shape(rt: Runtime, repo: GitRepo, sid: str) -> str:
    """'' when the shape agrees with the repo (or its STORE will settle it); else 'adopted' (git ahead)
    or 'rerun' (Redis ahead) after the repair."""
    from croqq.store.load import load_best_source, load_checkpoint

    gpu_type, dsl, key = split_sid(sid)

    def body(pipe: Any) -> tuple[str, StepRecord | None]:
        state = rt.ledger.load_shape(sid, pipe)
        step = rt.ledger.load_step(state.step_id, pipe) if state and state.step_id else None
        if step is not None:
            pipe.watch(keys.step(step.step_id))
        in_flight = step is not None and step.status in (StepStatus.QUEUED, StepStatus.RUNNING)
        if state is None or state.error or (in_flight and step is not None and step.kind == "store"):
            pipe.multi()
            return "", None
        ckpt = load_checkpoint(repo, gpu_type, dsl, key)  # read after WATCH: a STORE since aborts us
        live = (state.loop.current_iter, state.loop.attempts)
        stored = (ckpt.current_iter, ckpt.attempts) if ckpt else (-1, 0)
        if live == stored:
            pipe.multi()
            return "", None
        outcome = "adopted" if stored > live else "rerun"
        keep_gpu = bool(state.gpu_uuid) and bool(pipe.sismember(keys.active(state.gpu_uuid or ""), sid))
        queue = rt.ledger.queue_for(state, pipe) if keep_gpu else None
        pipe.multi()
        if step is not None and in_flight:
            rt.ledger.drop_step(pipe, step.step_id)
        state.step_id = None
        best = load_best_source(repo, ckpt) if ckpt else ""
        state.loop = resumable_loop(ckpt, rt.settings, state.loop.max_iter, best)
        state.needs_rebase = state.loop.current_iter >= 0
        nxt = None
        if state.loop.phase == Phase.DONE:
            if state.gpu_uuid:
                pipe.srem(keys.active(state.gpu_uuid), sid)
        elif keep_gpu:
            nxt = rt.ledger.plan_step(pipe, state, queue)
        else:
            release_gpu(pipe, state)
        rt.ledger.save_shape(pipe, state)
        log.warning(
            "%s: live state at iteration %d (attempts %d), the repo at %d (%d): %s",
            key,
            live[0],
            live[1],
            stored[0],
            stored[1],
            "adopting the repo's iterations" if outcome == "adopted" else "running the lost ones again",
        )
        return outcome, nxt

    outcome, nxt = rt.ledger.txn.run([keys.shape(sid)], body)
    rt.ledger.publish([nxt])
    if outcome:
        history.rebuild(rt.client, repo, sid)
    return str(outcome)
