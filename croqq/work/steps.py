"""Running one step message: validate, claim, keep the lease alive, execute, complete (or give back).

A GPU step's result is recorded by a background thread (``Runtime.completer``) so that the GPU starts its
next queued step at once; a process killed before the result is recorded leaves the step running under
its lease, and the lease's expiry re-dispatches it (the result is then measured again, never lost).
A GPU step whose artifact is missing from the artifact store (or corrupt) is done: its result is
``ArtifactLost``, and the shape goes to a build worker to rebuild it (a GPU host never compiles).

A full disk (:class:`~croqq.errors.DiskFullError`, from the writer or a build) raises the ``disk_full``
alarm for this worker and defers the step (it waits, then goes back to its queue; never counted against
the shape); the next STORE or build that succeeds in that process (or, after a restart, in the process that
replaced it) clears the alarm.

A STORE message only wakes the writer (messages are triggers, the ledger is the truth): the writer drains
every queued STORE from the ledger, oldest first, ``store_group`` at most per commit and completing
transaction (:func:`_drain_stores`). Most STOREs send no message at all (``Ledger.publish``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import redis

from croqq.delivery import keys, memory
from croqq.delivery.ledger import ClaimOutcome
from croqq.delivery.messages import StepMessage, parse
from croqq.delivery.queues import GPU_KINDS, STEP_TASK
from croqq.delivery.state import ShapeState
from croqq.domain.fsm import ArtifactLost
from croqq.errors import (
    ArtifactMissingError,
    DeferredError,
    DiskFullError,
    GpuLeaseLostError,
    GpuUnavailableError,
    HostError,
    InvalidRecordError,
    RetryableError,
    StaleStepError,
    TerminalError,
)
from croqq.store.schema import StoreReceipt, StoreRequest
from croqq.work import alarms, barriers, hosts
from croqq.work.context import Runtime
from croqq.work.executors import EXECUTORS, store, store_request_for, stored

log = logging.getLogger(__name__)

DISK_FULL = "disk_full"
DISK_KINDS = frozenset({"store", "implement"})  # the steps that write to this host's disk
# commits per wake-up before the writer lets the store queue's other tasks (reconcile, summary, flush) run;
# it wakes itself for the rest
DRAIN_ROUNDS = 16
# disk_full may be raised for this worker: by this process, or by its predecessor under the same name (so a
# restarted worker clears it at its first success)
_disk_alarm: set[str] = {DISK_FULL}


class StepOutcome(StrEnum):
    """What became of one step message: returned by its task and logged with shape, step and GPU."""

    DONE = "done"  # executed and completed (or, from the claim, a duplicate of a done step)
    REJECTED = "rejected"  # a bad payload
    # the claim refused a duplicate or stale message (ClaimOutcome), which is dropped:
    MISSING = "missing"
    STALE = "stale"  # also a result that came too late (the step was re-dispatched)
    RUNNING = "running"
    DROPPED = "dropped"
    REQUEUED = "requeued"  # a retryable fault: back to the queue with a new epoch
    DEFERRED = "deferred"  # an agent backed off or spent its budget: the shape waits
    REFUSED = "refused"  # this host cannot run it: back to the queue, and the worker stops
    QUARANTINED = "quarantined"  # the GPU failed its health check
    FAILED = "failed"  # a terminal fault of the shape: parked as 'error' until `croqq retry`


def wait_barrier(rt: Runtime, name: str, step_id: str) -> None:
    barriers.wait_barrier(rt.client, rt.settings.test_barriers, name, step_id)


def run_step(rt: Runtime, payload: Any, task_name: str) -> StepOutcome:
    try:
        msg = parse(StepMessage, payload)
        if STEP_TASK[msg.kind] != task_name:
            raise InvalidRecordError(f"StepMessage: kind {msg.kind!r} does not belong to task {task_name}")
    except InvalidRecordError as exc:
        rt.client.hincrby(keys.STATS, "rejected", 1)
        log.error("rejected message: %s", exc)
        return StepOutcome.REJECTED
    if msg.kind == "store":
        return _drain_stores(rt, msg)
    status, state = rt.ledger.claim(msg.step_id, msg.epoch, rt.owner, msg.kind, msg.sid)
    if status != ClaimOutcome.OK:
        log.info("dropping %s %s epoch %d: step is %s", msg.kind, msg.step_id, msg.epoch, status)
        return StepOutcome(status)
    leases = rt.step_leases
    leases.add(msg.step_id)
    outcome, event = _guarded(rt, msg, lambda: _execute(rt, msg, state))
    if event is not None and msg.kind in DISK_KINDS:
        _disk_ok(rt)
    if event is None:
        leases.remove(msg.step_id)
        return outcome

    def finish() -> StepOutcome:
        try:
            return _guarded(rt, msg, lambda: _complete(rt, msg, event))[0]
        finally:
            leases.remove(msg.step_id)

    if msg.kind in GPU_KINDS:  # the GPU goes on to its next step while this result is recorded
        rt.completer.submit(finish)
        return StepOutcome.DONE
    return finish()


def _current(rt: Runtime, msg: StepMessage, state: ShapeState | None) -> ShapeState:
    """The shape's state for a claimed step (read again after a test barrier); StaleStepError if the shape
    no longer waits for it."""
    if rt.settings.test_barriers:
        wait_barrier(rt, msg.kind, msg.step_id)
        state = rt.ledger.load_shape(msg.sid)
    if state is None or state.step_id != msg.step_id:
        raise StaleStepError(f"{msg.sid} no longer waits for {msg.step_id}")
    return state


def _execute(rt: Runtime, msg: StepMessage, state: ShapeState | None) -> Any:
    event = EXECUTORS[msg.kind](rt, _current(rt, msg, state), msg)
    wait_barrier(rt, f"{msg.kind}:complete", msg.step_id)
    return event


def _drain_stores(rt: Runtime, msg: StepMessage) -> StepOutcome:
    """A wake-up: store every queued STORE of the ledger, ``store_group`` at most per commit, until none is
    left (or ``DRAIN_ROUNDS`` commits: then it wakes itself for the rest). A round that defers or refuses
    a STORE ends the drain (that STORE went back to the ledger and sent its own wake-up). Returns the
    outcome of the message's own step if this drain ran it, else DONE when it stored any, else DROPPED."""
    rt.ledger.take_wake()
    outcomes: dict[str, StepOutcome] = {}
    for _ in range(DRAIN_ROUNDS):
        group = rt.ledger.claim_queued_stores(rt.owner, rt.settings.store_group)
        if not group:
            break
        done = _run_stores(rt, group)
        outcomes |= done
        if {StepOutcome.DEFERRED, StepOutcome.REFUSED} & set(done.values()):
            break
    else:
        rt.ledger.wake_writer()
    if msg.step_id in outcomes:
        return outcomes[msg.step_id]
    if not outcomes:
        log.info("wake-up %s: no STORE was queued", msg.step_id)
    return StepOutcome.DONE if StepOutcome.DONE in outcomes.values() else StepOutcome.DROPPED


def _run_stores(rt: Runtime, group: list[tuple[StepMessage, ShapeState | None]]) -> dict[str, StepOutcome]:
    """Group commit of claimed STOREs: one commit, then one completing transaction. Each step keeps its own
    fate: one that fails before the commit is failed alone, a group the writer refuses is stored one by
    one, and a stale step does not hold up the others. Returns each step's outcome."""
    leases = rt.step_leases
    for member, _ in group:
        leases.add(member.step_id)
    try:
        settled = _store_group(rt, group)
        if any(event is not None for _, _, event in settled):
            _disk_ok(rt)
        completed = _complete_group(
            rt, [(member, event) for member, _, event in settled if event is not None]
        )
        return {member.step_id: completed.get(member.step_id, outcome) for member, outcome, _ in settled}
    finally:
        for member, _ in group:
            leases.remove(member.step_id)


def _store_group(
    rt: Runtime, group: list[tuple[StepMessage, ShapeState | None]]
) -> list[tuple[StepMessage, StepOutcome, Any]]:
    """(step, outcome, event or None) for each STORE of ``group``, in order."""
    prepared: dict[str, tuple[ShapeState, StoreRequest]] = {}
    refused: dict[str, StepOutcome] = {}  # the outcome of a STORE that failed before the commit
    for member, state in group:

        def prepare(
            m: StepMessage = member, st: ShapeState | None = state
        ) -> tuple[ShapeState, StoreRequest]:
            current = _current(rt, m, st)
            return current, store_request_for(rt, current, m)

        outcome, ready = _guarded(rt, member, prepare)
        if ready is None:
            refused[member.step_id] = outcome
        else:
            prepared[member.step_id] = ready
    receipts: list[StoreReceipt] | None = None
    if len(prepared) > 1:
        try:
            receipts = rt.writer.apply_group([req for _, req in prepared.values()])
        except DiskFullError as exc:  # nothing was written: the whole group waits once, then goes back
            for i, (member, _) in enumerate(m for m in group if m[0].step_id in prepared):
                refused[member.step_id] = _defer(rt, member, exc, wait=i == 0)
            prepared.clear()
        except Exception as exc:  # each STORE goes alone, with its own fate (a committed one is a repeat)
            log.warning("group commit of %d STOREs refused (%s); storing them one by one", len(prepared), exc)
    by_step = dict(zip(prepared, receipts, strict=True)) if receipts is not None else {}
    results = []
    for member, _ in group:
        if member.step_id in refused:
            results.append((member, refused[member.step_id], None))
            continue
        state, req = prepared[member.step_id]
        receipt = by_step.get(member.step_id)

        def finish(
            m: StepMessage = member,
            st: ShapeState = state,
            rq: StoreRequest = req,
            rc: StoreReceipt | None = receipt,
        ) -> Any:
            event = store(rt, st, m, rq) if rc is None else stored(rt, st, m, rq, rc)
            wait_barrier(rt, "store:complete", m.step_id)
            return event

        outcome, event = _guarded(rt, member, finish)
        results.append((member, outcome, event))
    return results


def _complete_group(rt: Runtime, done: list[tuple[StepMessage, Any]]) -> dict[str, StepOutcome]:
    """Complete a group's stored STOREs in one transaction; step id -> outcome."""
    if not done:
        return {}
    try:
        results = rt.ledger.complete_many([(m.step_id, m.epoch, m.sid, event) for m, event in done], rt.owner)
    except Exception as exc:  # one transaction: applied to none (or to all: then each alone is stale)
        log.warning("completing %d STOREs together failed (%s); completing them one by one", len(done), exc)
        return {m.step_id: _guarded(rt, m, _completion(rt, m, event))[0] for m, event in done}
    outcomes = {}
    for (member, _), result in zip(done, results, strict=True):
        if isinstance(result, StaleStepError):
            log.warning("%s: %s", member.step_id, result)
            outcomes[member.step_id] = StepOutcome.STALE
        else:
            log.info("%s store done -> %s", result.key, result.loop.phase)
            outcomes[member.step_id] = StepOutcome.DONE
    return outcomes


def _completion(rt: Runtime, msg: StepMessage, event: Any) -> Callable[[], StepOutcome]:
    return lambda: _complete(rt, msg, event)


def _complete(rt: Runtime, msg: StepMessage, event: Any) -> StepOutcome:
    after = rt.ledger.complete(msg.step_id, msg.epoch, rt.owner, event, msg.sid)
    log.info("%s %s done -> %s", after.key, msg.kind, after.loop.phase)
    return StepOutcome.DONE


def _defer(rt: Runtime, msg: StepMessage, exc: DeferredError, wait: bool = True) -> StepOutcome:
    """Not a failure: pause (the lease is kept alive), then back to the queue."""
    if isinstance(exc, DiskFullError):
        _disk_full(rt, exc)
    log.info("%s %s deferred: %s", msg.kind, msg.step_id, exc)
    if wait:
        time.sleep(exc.wait_s)
    rt.ledger.requeue(msg.step_id, str(exc), expect_owner=rt.owner, expect_epoch=msg.epoch)
    return StepOutcome.DEFERRED


def _disk_full(rt: Runtime, exc: DiskFullError) -> None:
    alarms.raise_alarm(rt.client, DISK_FULL, str(exc))
    _disk_alarm.add(DISK_FULL)


def _disk_ok(rt: Runtime) -> None:
    """A STORE or build of this process wrote its files: the disk_full alarm it raised is over."""
    if _disk_alarm:
        try:
            alarms.clear_alarm(rt.client, DISK_FULL)
        except redis.RedisError as exc:  # the step's own completion goes on; the next success clears it
            log.warning("could not clear the disk_full alarm: %s", exc)
            return
        _disk_alarm.clear()


def _guarded(rt: Runtime, msg: StepMessage, fn: Callable[[], Any]) -> tuple[StepOutcome, Any]:
    """Run ``fn``; map croqq's exceptions to the step's fate: (outcome, fn's value or None). A Redis that
    is full is nobody's fault: wait until it has room, then run ``fn`` again while the step is still ours
    (its lease may have expired meanwhile: then another epoch runs it and this one is stale)."""
    while True:
        try:
            return _fate(rt, msg, fn)
        except Exception as exc:
            if not memory.is_full_error(exc):
                raise
            log.warning("%s %s waits: Redis is full", msg.kind, msg.step_id)
            memory.wait_for_room(rt.client)
            record = rt.ledger.load_step(msg.step_id)
            if record is None or not record.held_by(rt.owner, msg.epoch):
                log.info("%s %s epoch %d is no longer ours after the pause", msg.kind, msg.step_id, msg.epoch)
                return StepOutcome.STALE, None


def _fate(rt: Runtime, msg: StepMessage, fn: Callable[[], Any]) -> tuple[StepOutcome, Any]:
    """:func:`_guarded`'s mapping; an error of a full Redis goes up to it, counted against no shape."""
    try:
        return StepOutcome.DONE, fn()
    except StaleStepError as exc:
        log.warning("%s: %s", msg.step_id, exc)
        return StepOutcome.STALE, None
    except ArtifactMissingError as exc:  # the step's result: a build worker rebuilds it
        log.warning("%s %s: %s; it goes back to a build worker", msg.kind, msg.step_id, exc)
        return StepOutcome.DONE, ArtifactLost(artifact=exc.artifact)
    except GpuLeaseLostError as exc:
        rt.ledger.requeue(msg.step_id, str(exc), expect_owner=rt.owner, expect_epoch=msg.epoch)
        return StepOutcome.REQUEUED, None
    except DeferredError as exc:
        return _defer(rt, msg, exc), None
    except HostError as exc:  # this host's fault, not the shape's: another host takes the step
        log.error("%s %s: this host cannot run it, so it stops taking work: %s", msg.kind, msg.step_id, exc)
        hosts.record(rt.client, str(exc))
        rt.ledger.requeue(msg.step_id, f"refused by {hosts.label()}: {exc}", rt.owner, expect_epoch=msg.epoch)
        return StepOutcome.REFUSED, None
    except GpuUnavailableError as exc:
        rt.placement.quarantine(rt.gpu.uuid, str(exc))
        return StepOutcome.QUARANTINED, None
    except RetryableError as exc:
        if memory.is_full_error(exc):
            raise
        log.warning("%s %s: retryable fault: %s", msg.kind, msg.step_id, exc)
        rt.ledger.fail(
            msg.step_id,
            msg.epoch,
            rt.owner,
            str(exc),
            terminal=False,
            max_failures=rt.settings.max_step_failures,
        )
        return StepOutcome.REQUEUED, None
    except TerminalError as exc:
        log.error("%s %s: %s", msg.kind, msg.step_id, exc)
        rt.ledger.fail(msg.step_id, msg.epoch, rt.owner, str(exc), terminal=True, max_failures=1)
        return StepOutcome.FAILED, None
    except Exception as exc:
        if memory.is_full_error(exc):
            raise
        log.exception("%s %s crashed", msg.kind, msg.step_id)
        rt.ledger.fail(
            msg.step_id,
            msg.epoch,
            rt.owner,
            f"{type(exc).__name__}: {exc}",
            terminal=False,
            max_failures=rt.settings.max_step_failures,
        )
        return StepOutcome.REQUEUED, None
