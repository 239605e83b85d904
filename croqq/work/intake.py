"""Intake: registers submitted shapes (idempotently: a resubmission resumes, reopens or skips) and
recreates live state from the results repo after a cold start; then hands the GPUs to placement.
Stateless: every registration is a Redis transaction, so any number of coordinators can run at once.

A submission is registered from Redis alone (any host may submit); only the writer, which alone has the
results repo, registers shapes from their checkpoints (``rebuild_from_repo``, ``register_recorded`` with
its repo), when Redis forgot them. ``croqq submit`` waits for that to have happened after a Redis restart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from croqq.delivery import clock, keys
from croqq.delivery.ledger import Ledger
from croqq.delivery.messages import SubmitMessage
from croqq.delivery.redis_client import strs
from croqq.delivery.state import ShapeState, make_sid, release_gpu
from croqq.domain.fsm import Phase, Reopen, transition
from croqq.domain.manifest import Manifest
from croqq.domain.schedule import ScheduledShape, build_schedule
from croqq.patience import wait_until
from croqq.placement.assign import Placement
from croqq.settings import Settings
from croqq.store.schema import SubmissionRecord
from croqq.work.persist import loop_from_checkpoint, new_loop, now_iso

if TYPE_CHECKING:
    from croqq.store.gitrepo import GitRepo
    from croqq.store.writer import ResultsWriter

log = logging.getLogger(__name__)


@dataclass
class SubmitReport:
    new: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)

    @property
    def sids(self) -> list[str]:
        return self.new + self.resumed + self.reopened + self.skipped + self.parked


class Intake:
    def __init__(
        self,
        settings: Settings,
        manifest: Manifest,
        client: redis.Redis,
        ledger: Ledger,
        placement: Placement,
    ) -> None:
        self.settings = settings
        self.manifest = manifest
        self.client = client
        self.ledger = ledger
        self.placement = placement

    # -- submit ----------------------------------------------------------------------------------------

    def submit(self, msg: SubmitMessage) -> SubmitReport:
        """Register every shape of a submission (idempotent), then fill the GPUs of its type."""
        report = SubmitReport()
        for entry in msg.shapes:
            sid = make_sid(msg.gpu_type, msg.dsl, entry.key)
            outcome = self._register(sid, entry, msg)
            getattr(report, outcome).append(sid)
        pipe = self.client.pipeline()
        pipe.set(keys.submission(msg.submission), json.dumps(report.sids))
        pipe.rpush(keys.SUBMISSIONS, msg.submission)
        pipe.set(keys.submitted(msg.submission), msg.model_dump_json())  # until the writer records it
        pipe.zadd(keys.UNRECORDED, {msg.submission: clock.now(self.client)})
        pipe.execute()
        log.info(
            "submission %s: %d new, %d resumed, %d reopened, %d already complete, %d parked",
            msg.submission,
            len(report.new),
            len(report.resumed),
            len(report.reopened),
            len(report.skipped),
            len(report.parked),
        )
        self.placement.fill_all(msg.gpu_type)
        return report

    def _fresh_state(
        self, sid: str, entry: ScheduledShape, msg: SubmitMessage, repo: GitRepo | None
    ) -> tuple[ShapeState, str]:
        from croqq.store.load import load_best_source, load_checkpoint

        ckpt = load_checkpoint(repo, msg.gpu_type, msg.dsl, entry.key) if repo is not None else None
        if repo is None or ckpt is None:
            loop, outcome = new_loop(self.settings, msg.max_iter), "new"
        else:
            loop = loop_from_checkpoint(ckpt, self.settings, msg.max_iter, load_best_source(repo, ckpt))
            outcome = "skipped" if loop.phase == Phase.DONE else "resumed"
        loop = loop.model_copy(update={"candidates": msg.candidates})
        state = ShapeState(
            **entry.model_dump(),
            sid=sid,
            gpu_type=msg.gpu_type,
            dsl=msg.dsl,
            mode=ckpt.mode if ckpt else msg.mode,
            loop=loop,
            needs_rebase=loop.current_iter >= 0,
        )
        return state, outcome

    def _register(
        self, sid: str, entry: ScheduledShape, msg: SubmitMessage, repo: GitRepo | None = None
    ) -> str:
        """Register one shape (a transaction); a shape Redis does not know starts from its checkpoint in
        ``repo`` (the writer's), else as new."""

        def body(pipe: Any) -> str:
            state = self.ledger.load_shape(sid, pipe)
            if state is None:
                state, outcome = self._fresh_state(sid, entry, msg, repo)
                pipe.multi()
                pipe.sadd(keys.SHAPES, sid)
                if outcome != "skipped":
                    pipe.zadd(keys.pending(state.gpu_type), {sid: state.pending_score()})
                self.ledger.save_shape(pipe, state)
                return outcome
            loop = state.loop
            if loop.phase == Phase.DONE and msg.max_iter > loop.current_iter:
                reopened = transition(loop, Reopen(max_iter=msg.max_iter))
                state.loop = reopened.model_copy(update={"candidates": msg.candidates})
                pipe.multi()
                release_gpu(pipe, state)
                self.ledger.save_shape(pipe, state)
                return "reopened"
            pipe.multi()
            if loop.phase == Phase.DONE:
                return "skipped"
            update = {"max_iter": max(msg.max_iter, loop.max_iter), "candidates": msg.candidates}
            if any(getattr(loop, name) != value for name, value in update.items()):
                state.loop = loop.model_copy(update=update)  # for the iterations that follow
                self.ledger.save_shape(pipe, state)
            return "parked" if state.error else "resumed"

        return str(self.ledger.txn.run([keys.shape(sid)], body))

    def retry(self, sids: list[str]) -> list[str]:
        """Resume parked shapes (their cause fixed): the error is cleared and each waits for a GPU again,
        re-measuring its best there first. Returns the sids resumed (those not parked are left alone)."""
        resumed = []
        for sid in sids:

            def body(pipe: Any, sid: str = sid) -> bool:
                state = self.ledger.load_shape(sid, pipe)
                pipe.multi()
                if state is None or not state.error:
                    return False
                log.warning("%s resumed by retry (it was parked: %s)", state.key, state.error)
                state.error, state.step_id = "", None
                state.loop = state.loop.model_copy(update={"attempts_in_a_row": 0})  # its proposer: fixed
                release_gpu(pipe, state)
                self.ledger.save_shape(pipe, state)
                return True

            if self.ledger.txn.run([keys.shape(sid)], body):
                resumed.append(sid)
        if resumed:
            self.placement.fill_all()
        return resumed

    def register_recorded(self, records: list[SubmissionRecord], repo: GitRepo) -> int:
        """The writer: register again the shapes of recorded submissions that Redis no longer knows (it
        was flushed or restored from an older snapshot); returns how many."""
        count = 0
        for rec in records:
            missing = [
                s
                for s in rec.shapes
                if not self.client.exists(keys.shape(make_sid(rec.gpu_type, rec.dsl, s.key)))
            ]
            if not missing:
                continue
            msg = SubmitMessage(**rec.model_dump(exclude={"shapes", "timestamp"}), shapes=missing)
            for entry in missing:
                self._register(make_sid(rec.gpu_type, rec.dsl, entry.key), entry, msg, repo)
            count += len(missing)
        if count:
            log.warning("registered %d shape(s) of recorded submissions that Redis had forgotten", count)
        return count

    # -- cold start ------------------------------------------------------------------------------------

    def rebuild_from_repo(
        self,
        repo: GitRepo,
        runs: list[tuple[str, str]],
        state_keys: Callable[[str, str], list[str]],
        restore: Callable[[str], None],
    ) -> int:
        """The writer: register the shapes ``state_keys`` names from their checkpoints in ``repo`` (Redis
        forgot them), calling ``restore(sid)`` for each that resumes (its tried ideas and history); returns
        how many resume (the others are complete)."""
        from croqq.store.load import load_checkpoint

        ranks = {s.key: s for s in build_schedule(self.manifest, "all")}
        count = 0
        for gpu_type, dsl in runs:
            for key in state_keys(gpu_type, dsl):
                ckpt = load_checkpoint(repo, gpu_type, dsl, key)
                if ckpt is None:
                    continue
                entry = ranks.get(key) or ScheduledShape(
                    **ckpt.model_dump(include={"dtype", "m", "n", "k", "scenarios", "region"}),
                    key=key,
                    rank=len(ranks),
                )
                msg = SubmitMessage(
                    submission="rebuild",
                    gpu_type=gpu_type,
                    dsl=dsl,
                    mode=ckpt.mode,
                    max_iter=ckpt.max_iter,
                    candidates=ckpt.candidates,
                    shapes=[entry],
                )
                sid = make_sid(gpu_type, dsl, key)
                if self._register(sid, entry, msg, repo) == "resumed":
                    restore(sid)
                    count += 1
        if count:
            log.warning("rebuilt the live state of %d shape(s) from the results repo", count)
        return count


def record_submissions(client: redis.Redis, writer: ResultsWriter) -> int:
    """The writer's part (its queue, every few seconds): commit to the results repo the submissions Redis
    holds but the repo does not yet, then forget them in Redis. Returns how many were recorded."""
    ids = strs(client.zrange(keys.UNRECORDED, 0, -1))
    if not ids:
        return 0
    records = []
    for raw in client.mget([keys.submitted(i) for i in ids]):
        if raw is None:
            continue
        msg = SubmitMessage.model_validate_json(raw)
        records.append(SubmissionRecord(**msg.model_dump(), timestamp=now_iso()))
    writer.record_submissions(records)
    pipe = client.pipeline()
    pipe.zrem(keys.UNRECORDED, *ids)
    pipe.delete(*[keys.submitted(i) for i in ids])
    pipe.execute()
    return len(records)


def recorded(client: redis.Redis, sub_id: str) -> bool:
    """True once the writer has recorded the submission in the results repo."""
    return client.zscore(keys.UNRECORDED, sub_id) is None


RECORD_WAIT_S = 10.0  # how long `croqq submit` (and `croqq up`) wait for the writer to record a submission


def wait_recorded(client: redis.Redis, sub_id: str, timeout_s: float = RECORD_WAIT_S) -> bool:
    """Wait until the writer has recorded the submission in the results repo (from then on it survives a
    Redis that forgets); False if it has not within ``timeout_s`` (no writer running?). A wait for croqq's
    own writer: the budget stretches with the machine's load (:mod:`croqq.patience`)."""
    try:
        wait_until(lambda: recorded(client, sub_id), timeout_s, f"submission {sub_id} recorded")
    except TimeoutError:
        return False
    return True
