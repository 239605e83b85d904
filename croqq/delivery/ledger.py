"""The step ledger: exactly-once application of at-least-once messages.

Each shape has at most one step in flight. A step record (``croqq:step:<id>``) moves
``queued -> running -> done`` (or ``dropped``):

- **publish**: the record is written in the same Redis transaction as the shape state that created it,
  and so is its Celery message (an LPUSH onto its queue's list: the broker is this Redis), so a step is
  never written without its message. A STORE's message is the writer's wake-up, sent after the commit
  only when none is on its way: its record gets an outbox entry instead, removed when the wake-up is
  sent or found unneeded; a crash in between leaves it, and housekeeping publishes it again (as it does
  for every step a ledger without a publisher writes).
- **claim**: a worker may run a step only by moving it ``queued -> running`` for the message's epoch
  (a Lua script); duplicates and stale epochs are refused. The claimer holds a lease: its deadline is
  the step's score in ``croqq:running``, pushed forward by heartbeats (in Redis's memory only: after a
  restart every running step gets one TTL to renew). The writer claims STORE steps from the ledger
  itself (``claim_queued_stores``, the same ``queued -> running`` move): a STORE's message only wakes it,
  and is sent only when no wake-up is on its way already (``croqq:store_wake``); a wake-up lost with its
  writer or with Redis's tail is sent again by housekeeping (:meth:`Ledger.wake_writer`).
- **complete**: the result (an FSM event) is applied in one WATCH/MULTI transaction that checks the
  step is still ours at this epoch, moves the shape's loop, marks the step done and writes the next
  step. First result wins; a stale or duplicate result changes nothing.
- **expire**: housekeeping re-queues a running step whose lease deadline passed, with epoch + 1; the
  old holder's result is then stale.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any, Protocol

import redis
from pydantic import BaseModel, ConfigDict

from croqq.delivery import clock, grace, keys
from croqq.delivery.messages import StepMessage
from croqq.delivery.queues import GPU_KINDS, SHARED_QUEUE, build_queue
from croqq.delivery.redis_client import strs, text
from croqq.delivery.state import ShapeState, release_gpu
from croqq.domain.fsm import Phase
from croqq.errors import StaleStepError

log = logging.getLogger(__name__)


class StepStatus(StrEnum):
    """A step record's ``status`` in Redis (the Lua scripts below spell the same values)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    DROPPED = "dropped"


class ClaimOutcome(StrEnum):
    """The answer to a claim: OK (the claimer now runs the step), or why its message is dropped: the step
    is MISSING, STALE (another epoch or kind), or already RUNNING, DONE or DROPPED."""

    OK = "ok"
    MISSING = "missing"
    STALE = "stale"
    RUNNING = "running"
    DONE = "done"
    DROPPED = "dropped"


PHASE_KIND = {
    Phase.BASELINE: "baseline",
    Phase.PROFILE: "profile",
    Phase.MEASURE: "measure",
    Phase.IDEATE: "ideate",
    Phase.IMPLEMENT: "implement",
    Phase.STORE: "store",
}


def step_kind(state: ShapeState) -> str | None:
    """The step the shape's phase calls for. A GPU host never compiles, so a build worker goes first
    when a GPU step would lack an artifact: BASELINE builds its seed, and PROFILE or MEASURE whose best
    kernel has none (a loop rebuilt from a checkpoint, or its artifact was lost) builds the best."""
    loop = state.loop
    if loop.phase == Phase.BASELINE and (loop.pending is None or loop.pending.build is None):
        return "implement"
    if loop.phase in (Phase.PROFILE, Phase.MEASURE) and loop.best_iter >= 0 and not loop.best_artifact:
        return "implement"
    return PHASE_KIND.get(loop.phase)


_CLAIM = """
local st = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'kind')
if not st[1] then return 'missing' end
if st[2] ~= ARGV[1] or st[3] ~= ARGV[6] then return 'stale' end
if st[1] ~= 'queued' then return st[1] end
redis.call('HSET', KEYS[1], 'status', 'running', 'owner', ARGV[2], 'started_at', ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[5])
redis.call('ZREM', KEYS[5], ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return {'ok', redis.call('GET', KEYS[4])}
"""
_CLAIM_STORES = """
local out = {}
for i = 1, (#KEYS - 3) / 2 do
  local id = ARGV[3 + i]
  local st = redis.call('HMGET', KEYS[2 + 2 * i], 'status', 'epoch', 'kind')
  redis.call('ZREM', KEYS[3], id)
  if st[1] == 'queued' and st[3] == 'store' then
    redis.call('HSET', KEYS[2 + 2 * i], 'status', 'running', 'owner', ARGV[1], 'started_at', ARGV[2])
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[1], ARGV[3], id)
    out[#out + 1] = {id, st[2], redis.call('GET', KEYS[3 + 2 * i])}
  end
end
return out
"""
_READ_STEPS = """
local out = {}
for i = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('HGETALL', KEYS[i])
  out[#out + 1] = redis.call('GET', KEYS[i + 1])
end
return out
"""
_HEARTBEAT = """
redis.set_repl(redis.REPL_NONE)
local renewed = 0
for i = 2, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'owner')
  if st[1] == 'running' and st[2] == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[i + 1])
    renewed = renewed + 1
  end
end
return renewed
"""


class StepRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    step_id: str
    sid: str
    kind: str
    epoch: int
    status: StepStatus
    queue: str
    owner: str = ""
    dispatched_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0

    def held_by(self, owner: str, epoch: int) -> bool:
        """True while ``owner`` runs this step at ``epoch``."""
        return (self.status, self.epoch, self.owner) == (StepStatus.RUNNING, epoch, owner)


Publisher = Callable[[Sequence[StepRecord], Any], None]  # adds each step's message to a Redis pipeline
Write = Callable[[Any], None]


class Advance(Protocol):
    """What a step's result does to its shape (``croqq.work.advance``): the ledger only runs it."""

    def apply(self, record: StepRecord, state: ShapeState, event: Any, now: float) -> Write:
        """Move ``state`` by ``event`` at ``now`` (Redis's clock; reads allowed, before multi); return the
        writes that go with it (called with the pipe in multi mode, inside the same transaction)."""

    def after(self, state: ShapeState) -> None:
        """Called once the transaction committed."""


class Txn:
    """Reads done before ``multi`` and writes queued after it, retried on WatchError."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def run(self, watch: list[str], body: Callable[[Any], Any]) -> Any:
        with self.client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(*watch)
                    result = body(pipe)
                    pipe.execute()
                    return result
                except redis.WatchError:
                    continue
                finally:
                    pipe.reset()


class Ledger:
    def __init__(
        self, client: redis.Redis, lease_ttl_s: float, advance: Advance, publisher: Publisher | None = None
    ) -> None:
        self.client = client
        self.advance = advance
        self.lease_ttl_s = lease_ttl_s
        self.publisher = publisher
        self.txn = Txn(client)
        self._queues: dict[str, str] = {}
        self._claim = client.register_script(_CLAIM)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._claim_stores = client.register_script(_CLAIM_STORES)
        self._read_steps = client.register_script(_READ_STEPS)

    # -- reads --------------------------------------------------------------------------------------

    def load_shape(self, sid: str, conn: Any = None) -> ShapeState | None:
        raw = (conn or self.client).get(keys.shape(sid))
        return ShapeState.loads(raw) if raw else None

    def load_step(self, step_id: str, conn: Any = None) -> StepRecord | None:
        data = (conn or self.client).hgetall(keys.step(step_id))
        return StepRecord.model_validate(data) if data else None

    def load_steps(
        self, pairs: Sequence[tuple[str, str]], conn: Any
    ) -> list[tuple[StepRecord | None, ShapeState | None]]:
        """(step record, shape state) for each (step id, sid) of ``pairs``, in one round trip (``conn``: a
        watching pipe reads in immediate mode, so the reads are watched)."""
        flat = [k for step_id, sid in pairs for k in (keys.step(step_id), keys.shape(sid))]
        try:  # not through the Script object: on a pipe it would add a SCRIPT EXISTS round trip at EXEC
            reply = conn.evalsha(self._read_steps.sha, len(flat), *flat)
        except redis.exceptions.NoScriptError:  # a restarted Redis forgot it
            self._read_steps.sha = conn.script_load(_READ_STEPS)
            reply = conn.evalsha(self._read_steps.sha, len(flat), *flat)
        out = []
        for fields, raw in zip(reply[::2], reply[1::2], strict=True):
            data = dict(zip(strs(fields[::2]), strs(fields[1::2]), strict=True))
            out.append(
                (StepRecord.model_validate(data) if data else None, ShapeState.loads(raw) if raw else None)
            )
        return out

    def gpu_queue(self, uuid: str, conn: Any = None) -> str | None:
        """The queue of a registered GPU (cached: a GPU's queue never changes once registered)."""
        queue = self._queues.get(uuid)
        if queue is None:
            raw = (conn or self.client).hget(keys.gpu(uuid), "queue")
            if not raw:
                return None
            queue = self._queues[uuid] = str(raw)
        return queue

    # -- writes inside a transaction ------------------------------------------------------------------

    @staticmethod
    def save_shape(pipe: Any, state: ShapeState) -> None:
        """Write the shape and its one-line summary (what status views read) in the same transaction."""
        state.updated_at = clock.now(pipe)
        pipe.set(keys.shape(state.sid), state.dumps())
        pipe.hset(keys.SUMMARY, state.sid, state.summary_json())

    def plan_step(self, pipe: Any, state: ShapeState, gpu_queue: str | None) -> StepRecord | None:
        """Write the step the shape's phase calls for (pipe in multi mode); None if it needs none now.

        A GPU step for a shape without a GPU (or whose GPU has no queue) waits in the pending set.
        """
        kind = step_kind(state)
        if kind is None or state.error:
            state.step_id = None
            return None
        if kind in GPU_KINDS:
            if state.gpu_uuid is None or gpu_queue is None:
                state.step_id = None
                release_gpu(pipe, state)
                return None
            queue = gpu_queue
        elif kind == "implement":
            queue = build_queue(state.dsl)
        else:
            queue = SHARED_QUEUE[kind]
        state.step_seq += 1
        now = clock.now(pipe)
        record = StepRecord(
            # <key>#<seq>.<48 random bits>: unique even if Redis forgets (a re-run never reuses one), and
            # short, since a step id crosses the network a dozen times per step
            step_id=f"{state.key}#{state.step_seq}.{secrets.token_hex(6)}",
            sid=state.sid,
            kind=kind,
            epoch=0,
            status=StepStatus.QUEUED,
            queue=queue,
            dispatched_at=now,
        )
        state.step_id = record.step_id
        self._write_step(pipe, record)
        return record

    def drop_step(self, pipe: Any, step_id: str) -> None:
        """Cancel a queued or running step (pipe in multi mode); any message or result for it is stale."""
        pipe.hset(keys.step(step_id), mapping={"status": StepStatus.DROPPED, "owner": ""})
        pipe.expire(keys.step(step_id), keys.STEP_TTL_S)
        for zset in (keys.RUNNING, keys.QUEUED, keys.OUTBOX, keys.QUEUED_STORES):
            pipe.zrem(zset, step_id)

    def _write_step(self, pipe: Any, record: StepRecord) -> None:
        """The step's record and, in the same transaction, its message (a STORE's wake-up, or any message
        where this ledger has no publisher, waits in the outbox for :meth:`publish`)."""
        pipe.hset(keys.step(record.step_id), mapping={k: str(v) for k, v in record.model_dump().items()})
        pipe.zadd(keys.QUEUED, {record.step_id: record.dispatched_at})
        if record.kind == "store":
            pipe.zadd(keys.QUEUED_STORES, {record.step_id: record.dispatched_at})
        if record.kind == "store" or self.publisher is None:
            pipe.zadd(keys.OUTBOX, {record.step_id: record.dispatched_at})
        else:
            self.publisher([record], pipe)

    def queue_for(self, state: ShapeState, conn: Any) -> str | None:
        """The GPU queue a shape's next GPU step would go to (read before multi)."""
        return self.gpu_queue(state.gpu_uuid, conn) if state.gpu_uuid else None

    # -- publishing -----------------------------------------------------------------------------------

    def publish(self, records: Iterable[StepRecord | None]) -> None:
        """After the transaction that wrote these steps: the STOREs' wake-up (the other steps' messages went
        out in that transaction)."""
        self._send([r for r in records if r is not None and r.kind == "store"])

    def _send(self, records: Sequence[StepRecord], force: bool = False) -> None:
        """Send the messages of steps in the outbox and take them off it in one transaction, one round trip:
        a crash before it, or a Redis that refuses it (full), leaves them there, and housekeeping publishes
        them again (duplicates are dropped at claim).

        A STORE's message is only the writer's wake-up (the writer drains every queued STORE from the
        ledger), so it is sent only when none is on its way already, unless ``force`` (a re-publish: the
        pending wake-up may have died with its writer)."""
        if self.publisher is None or not records:
            return
        with self.client.pipeline() as pipe:
            self.publisher([r for r in records if r.kind != "store" or self._wake_due(force)], pipe)
            pipe.zrem(keys.OUTBOX, *(record.step_id for record in records))
            pipe.execute()

    def _wake_due(self, force: bool = False) -> bool:
        """True if the caller is to send the writer a wake-up: none was on its way (or ``force``). The flag
        lives one lease TTL: a wake-up not taken by then counts as lost, and the next STORE (or
        housekeeping's :meth:`wake_writer`) sends another."""
        px = max(1, int(self.lease_ttl_s * 1000))
        return bool(self.client.set(keys.STORE_WAKE, "1", px=px, nx=not force))

    def take_wake(self) -> None:
        """The writer, before it drains: a STORE queued from now on sends a new wake-up (one queued before
        is in the ledger already, so the drain that follows takes it). Counts the wake-ups taken."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(keys.STORE_WAKE)
        pipe.hincrby(keys.STATS, "store_wakeups", 1)
        pipe.execute()

    def wake_writer(self, older_than_s: float = 0.0) -> bool:
        """Send the writer a wake-up if a STORE has waited in the ledger longer than ``older_than_s`` and
        none is on its way: housekeeping's net for a wake-up lost with a killed writer or Redis's tail, and
        the writer's own when it stops draining with STOREs left. Stale index entries met on the way are
        dropped. True if one was sent."""
        if self.publisher is None:
            return False
        cutoff = clock.now(self.client) - older_than_s
        for step_id in strs(self.client.zrangebyscore(keys.QUEUED_STORES, "-inf", cutoff, start=0, num=8)):
            record = self.load_step(step_id)
            if record is None or record.status != StepStatus.QUEUED or record.kind != "store":
                self.client.zrem(keys.QUEUED_STORES, step_id)
                continue
            if not self._wake_due():
                return False
            with self.client.pipeline() as pipe:
                self.publisher([record], pipe)
                pipe.execute()
            return True
        return False

    # -- the step protocol ----------------------------------------------------------------------------

    def claim(
        self, step_id: str, epoch: int, owner: str, kind: str, sid: str
    ) -> tuple[ClaimOutcome, ShapeState | None]:
        """(OK, the shape's state) if this owner now runs the step; else (why not, None)."""
        now = clock.now(self.client)
        reply = self._claim(
            keys=[keys.step(step_id), keys.RUNNING, keys.QUEUED, keys.shape(sid), keys.QUEUED_STORES],
            args=[str(epoch), owner, repr(now), repr(now + self.lease_ttl_s), step_id, kind],
        )
        if isinstance(reply, list):
            raw = reply[1]
            return ClaimOutcome.OK, ShapeState.loads(raw) if raw else None
        return ClaimOutcome(str(reply)), None

    def claim_queued_stores(self, owner: str, limit: int) -> list[tuple[StepMessage, ShapeState | None]]:
        """Claim for ``owner`` up to ``limit`` of the oldest queued STORE steps, whatever their messages
        (the writer drains them into one commit). Returns each claimed step as the message that would have
        run it, with its shape's state. A message of one of them, when it comes, only wakes the writer."""
        ids = strs(self.client.zrange(keys.QUEUED_STORES, 0, limit - 1)) if limit > 0 else []
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for step_id in ids:
            pipe.hget(keys.step(step_id), "sid")
        sids = dict(zip(ids, (text(sid) for sid in pipe.execute()), strict=True))
        gone = [step_id for step_id, sid in sids.items() if not sid]
        if gone:
            self.client.zrem(keys.QUEUED_STORES, *gone)
        live = [step_id for step_id in ids if sids[step_id]]
        if not live:
            return []
        now = clock.now(self.client)
        reply = self._claim_stores(
            keys=[keys.RUNNING, keys.QUEUED, keys.QUEUED_STORES]
            + [k for s in live for k in (keys.step(s), keys.shape(sids[s] or ""))],
            args=[owner, repr(now), repr(now + self.lease_ttl_s), *live],
        )
        claimed = []
        for raw_id, epoch, raw in reply:
            step_id = text(raw_id) or ""
            msg = StepMessage(step_id=step_id, epoch=int(epoch), sid=sids[step_id] or "", kind="store")
            claimed.append((msg, ShapeState.loads(raw) if raw else None))
        return claimed

    def heartbeat(self, step_ids: Sequence[str], owner: str) -> int:
        """Renew the leases of the steps ``owner`` runs (one round trip for all of them: a process renews
        every step it runs in one call); returns how many it still held. A step it no longer holds (expired
        and re-queued, done, dropped) is left alone.

        Renewals change Redis's memory only: they are neither appended to the AOF nor replicated (a
        deadline is worth something only while this Redis runs, and under ``appendfsync always`` each
        persisted renewal would cost an fsync). The claim's deadline is persisted; after a restart every
        running step gets one TTL (:func:`croqq.delivery.grace.grant`)."""
        if not step_ids:
            return 0
        deadline = clock.now(self.client) + self.lease_ttl_s
        return int(
            self._heartbeat(
                keys=[keys.RUNNING, *(keys.step(s) for s in step_ids)],
                args=[owner, repr(deadline), *step_ids],
            )
        )

    def complete(
        self, step_id: str, epoch: int, owner: str, event: Any, sid: str | None = None
    ) -> ShapeState:
        """Apply a step's result exactly once; publish the next step. Raises StaleStepError if not ours.
        ``sid``: the step's shape, as its message named it (saves reading the step record twice; a wrong
        one is stale).

        What the result means for the shape (the FSM, DECIDE, statistics, its GPU slot) is the
        ``advance``'s business; the ledger checks ownership, marks the step done and plans the next one,
        all in one transaction."""
        if sid is None:
            record0 = self.load_step(step_id)
            if record0 is None:
                raise StaleStepError(f"step {step_id} no longer exists")
            sid = record0.sid
        (final,) = self.complete_many([(step_id, epoch, sid, event)], owner)
        if isinstance(final, StaleStepError):
            raise final
        return final

    def complete_many(
        self, results: Sequence[tuple[str, int, str, Any]], owner: str
    ) -> list[ShapeState | StaleStepError]:
        """:meth:`complete` for several steps of ``owner`` in ONE transaction (a group commit's STOREs):
        ``results`` holds (step id, epoch, sid, event) per step. Returns, in order, each shape's new state,
        or the StaleStepError of a step that is no longer ours (it changes nothing; the others complete)."""
        watch = [key for step_id, _, sid, _ in results for key in (keys.step(step_id), keys.shape(sid))]

        def body(pipe: Any) -> tuple[list[ShapeState | StaleStepError], list[StepRecord | None]]:
            outcomes: list[ShapeState | StaleStepError] = []
            plans = []
            now = clock.now(self.client)
            loaded = self.load_steps([(step_id, sid) for step_id, _, sid, _ in results], pipe)
            for (step_id, epoch, sid, event), (record, state) in zip(results, loaded, strict=True):
                try:
                    if record is None or state is None or record.sid != sid:
                        raise StaleStepError(
                            f"step {step_id} or its shape {sid} vanished (or it is another's)"
                        )
                    self._check_holder(record, state, epoch, owner)
                except StaleStepError as exc:
                    outcomes.append(exc)
                    continue
                write = self.advance.apply(record, state, event, now)
                plans.append((step_id, state, write, self.queue_for(state, pipe)))
                outcomes.append(state)
            pipe.multi()
            nexts = []
            for step_id, state, write, queue in plans:
                write(pipe)
                pipe.hset(keys.step(step_id), mapping={"status": StepStatus.DONE, "finished_at": repr(now)})
                pipe.expire(keys.step(step_id), keys.STEP_TTL_S)
                pipe.zrem(keys.RUNNING, step_id)
                nexts.append(self.plan_step(pipe, state, queue))
                self.save_shape(pipe, state)
            return outcomes, nexts

        outcomes, nexts = self.txn.run(watch, body)
        self.publish(nexts)
        for outcome in outcomes:
            if isinstance(outcome, ShapeState):
                self.advance.after(outcome)
        return outcomes

    @staticmethod
    def _check_holder(record: StepRecord, state: ShapeState, epoch: int, owner: str) -> None:
        """StaleStepError unless the caller still runs this step at this epoch and the shape waits for it."""
        if not record.held_by(owner, epoch) or state.step_id != record.step_id:
            raise StaleStepError(
                f"step {record.step_id} epoch {epoch} is stale (now {record.status} epoch {record.epoch})"
            )

    def requeue(
        self,
        step_id: str,
        reason: str,
        expect_owner: str | None = None,
        only_expired: bool = False,
        expect_epoch: int | None = None,
    ) -> bool:
        """Put a running step back in its queue with epoch + 1 (worker gave it up or its lease expired).

        A GPU step whose shape lost its GPU is dropped instead; the shape then waits for a GPU.
        """
        record0 = self.load_step(step_id)
        if record0 is None:
            self.client.zrem(keys.RUNNING, step_id)
            return False

        def body(pipe: Any) -> tuple[StepRecord | None, bool]:
            """Returns (the re-queued record to publish, whether the step left the running state)."""
            record = self.load_step(step_id, pipe)
            state = self.load_shape(record0.sid, pipe)
            deadline = self.client.zscore(keys.RUNNING, step_id)
            if record is None or record.status != StepStatus.RUNNING:
                pipe.multi()
                pipe.zrem(keys.RUNNING, step_id)
                return None, False
            if (expect_owner is not None and record.owner != expect_owner) or (
                expect_epoch is not None and record.epoch != expect_epoch
            ):
                pipe.multi()
                return None, False
            if only_expired and deadline is not None and float(deadline) > clock.now(self.client):
                pipe.multi()
                return None, False
            queue = record.queue
            if record.kind in GPU_KINDS and state is not None:
                queue = self.queue_for(state, pipe) or ""
            pipe.multi()
            pipe.zrem(keys.RUNNING, step_id)
            if only_expired:
                pipe.hincrby(keys.STATS, "lease_expired", 1)
            if state is None or state.step_id != step_id or not queue:
                self.drop_step(pipe, step_id)
                if state is not None and state.step_id == step_id:
                    state.step_id = None
                    release_gpu(pipe, state)
                    self.save_shape(pipe, state)
                return None, True
            now = clock.now(self.client)
            new = record.model_copy(
                update={
                    "epoch": record.epoch + 1,
                    "status": StepStatus.QUEUED,
                    "owner": "",
                    "queue": queue,
                    "dispatched_at": now,
                }
            )
            self._write_step(pipe, new)
            pipe.hincrby(keys.STATS, "redispatch", 1)
            return new, True

        new, done = self.txn.run([keys.step(step_id), keys.shape(record0.sid)], body)
        if new is not None:
            log.warning("re-dispatching %s %s as epoch %d: %s", record0.kind, step_id, new.epoch, reason)
            self.publish([new])
        return bool(done)

    def reclaim_dead_local(self) -> int:
        """Re-queue at once the running steps whose owner was a process of this host that is gone (a
        restarted worker calls this: no need to wait for the lease to expire)."""
        from croqq.delivery.leases import dead_local

        count = 0
        for step_id in strs(self.client.zrange(keys.RUNNING, 0, -1)):
            owner = text(self.client.hget(keys.step(step_id), "owner"))
            if owner and dead_local(owner):
                count += self.requeue(step_id, f"its owner {owner} died", expect_owner=owner)
        return count

    def expire_leases(self) -> int:
        """Re-queue every running step whose lease deadline has passed (after a Redis restart, one TTL
        after it: :func:`croqq.delivery.grace.grant`)."""
        grace.grant(self.client, self.lease_ttl_s)
        expired = strs(self.client.zrangebyscore(keys.RUNNING, "-inf", clock.now(self.client)))
        return sum(self.requeue(sid, "lease expired", only_expired=True) for sid in expired)

    def flush_outbox(self, older_than_s: float) -> int:
        """Publish steps whose publication may have been lost (crash between commit and send)."""
        stale = strs(self.client.zrangebyscore(keys.OUTBOX, "-inf", clock.now(self.client) - older_than_s))
        return self.republish(stale, "unpublished after commit")

    def republish(self, step_ids: Iterable[str], reason: str) -> int:
        count = 0
        for step_id in step_ids:
            record = self.load_step(step_id)
            if record is None or record.status != StepStatus.QUEUED:
                for zset in (keys.OUTBOX, keys.QUEUED, keys.QUEUED_STORES):
                    self.client.zrem(zset, step_id)
                continue
            self.client.zadd(keys.QUEUED, {step_id: clock.now(self.client)})
            log.info("re-publishing %s (%s)", step_id, reason)
            self._send([record], force=True)
            count += 1
        return count

    def fail(
        self, step_id: str, epoch: int, owner: str, reason: str, terminal: bool, max_failures: int
    ) -> bool:
        """A step raised: retry it (new epoch) unless it is terminal or failed too often; then park the
        shape as 'error' (shown by status, kept out of the schedule) instead of looping forever.

        Only the step's current holder (this owner, at this epoch) may: a stale holder's late failure
        changes nothing (returns False), whatever a newer holder is doing."""
        record = self.load_step(step_id)
        if record is None or not record.held_by(owner, epoch):
            log.info("ignoring the failure of %s epoch %d by %s: no longer its holder", step_id, epoch, owner)
            return False
        failures = int(self.client.hincrby(keys.step(step_id), "failures", 1))
        if not terminal and failures < max_failures:
            return self.requeue(step_id, reason, expect_owner=owner, expect_epoch=epoch)

        def body(pipe: Any) -> bool:
            now = self.load_step(step_id, pipe)
            state = self.load_shape(record.sid, pipe)
            if now is None or not now.held_by(owner, epoch):
                pipe.multi()
                return False
            pipe.multi()
            self.drop_step(pipe, step_id)
            if state is not None and state.step_id == step_id:
                state.step_id = None
                state.error = reason[:500]
                if state.gpu_uuid:
                    pipe.srem(keys.active(state.gpu_uuid), state.sid)
                self.save_shape(pipe, state)
            return True

        parked = bool(self.txn.run([keys.step(step_id), keys.shape(record.sid)], body))
        if parked:
            log.error("%s parked as error after %d failure(s): %s", record.sid, failures, reason)
        return parked
