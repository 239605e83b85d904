"""A step message runs its step at most once: one that must not run is dropped, and its outcome says why
in the same words Redis and the logs have always used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from croqq.delivery import keys
from croqq.delivery.ledger import ClaimOutcome, StepRecord, StepStatus
from croqq.delivery.messages import StepMessage, SubmitMessage
from croqq.delivery.queues import TASK_BUILD
from croqq.domain.schedule import build_schedule
from croqq.placement import registry
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.settings import Settings
from croqq.work.steps import StepOutcome, _guarded, run_step

GPU_TYPE = "sm90_Simulated_H100_SXM"


@pytest.fixture
def rt(redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    settings = Settings(broker_url=redis_server.url, run_dir=tmp_path / "run", results_repo=tmp_path / "r")
    yield Runtime(settings, publisher=lambda records, pipe: None)


def first_step(rt: Runtime) -> StepRecord:
    """Submit one shape to a GPU; its first step (building its seed, on the build queue) is queued."""
    entry = registry.GpuEntry(uuid="GPU-a", host="h", index=0, gpu_type=GPU_TYPE, queue="gpu.h.GPU-a")
    registry.register_gpu(rt.client, entry)
    shapes = build_schedule(rt.manifest, "f16")[:1]
    msg = SubmitMessage(
        submission="s1", gpu_type=GPU_TYPE, dsl="cuda", mode="from_current_best", max_iter=1, shapes=shapes
    )
    (sid,) = rt.intake.submit(msg).sids
    state = rt.ledger.load_shape(sid)
    assert state is not None and state.step_id is not None
    record = rt.ledger.load_step(state.step_id)
    assert record is not None and record.kind == "implement"
    return record


def message(record: StepRecord, **change: object) -> dict[str, object]:
    msg = StepMessage(step_id=record.step_id, epoch=record.epoch, sid=record.sid, kind="implement")
    return msg.model_copy(update=change).model_dump()


def test_a_message_that_must_not_run_is_dropped_with_its_reason(rt: Runtime) -> None:
    record = first_step(rt)
    assert record.status is StepStatus.QUEUED
    assert run_step(rt, {"step_id": record.step_id}, TASK_BUILD) is StepOutcome.REJECTED
    assert run_step(rt, message(record), "croqq.step.gpu") is StepOutcome.REJECTED  # another task's kind
    assert run_step(rt, message(record, step_id="gone#1.0"), TASK_BUILD) is StepOutcome.MISSING
    assert run_step(rt, message(record, epoch=7), TASK_BUILD) is StepOutcome.STALE
    claim = rt.ledger.claim(record.step_id, 0, "another-worker", "implement", record.sid)
    assert claim[0] is ClaimOutcome.OK
    assert run_step(rt, message(record), TASK_BUILD) is StepOutcome.RUNNING  # a duplicate message
    assert rt.client.hget(keys.step(record.step_id), "status") == "running"
    assert rt.client.hget(keys.STATS, "rejected") == "2"


def test_outcomes_keep_the_words_redis_and_the_logs_hold() -> None:
    assert [str(s) for s in StepStatus] == ["queued", "running", "done", "dropped"]
    assert {str(c) for c in ClaimOutcome} == {"ok", "missing", "stale", "running", "done", "dropped"}
    assert {str(c) for c in ClaimOutcome} - {"ok"} <= {str(o) for o in StepOutcome}  # a refused claim
    assert f"{StepOutcome.REQUEUED}" == "requeued"


def test_a_step_meeting_a_full_redis_runs_again_once_it_has_room_and_counts_no_failure(rt: Runtime) -> None:
    record = first_step(rt)
    assert rt.ledger.claim(record.step_id, 0, rt.owner, "implement", record.sid)[0] is ClaimOutcome.OK
    msg = StepMessage.model_validate(message(record))
    refusal = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    calls: list[int] = []

    def once_refused() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise refusal
        return "result"

    assert _guarded(rt, msg, once_refused) == (StepOutcome.DONE, "result")  # Redis has room: at once
    assert len(calls) == 2
    assert rt.client.hget(keys.step(record.step_id), "failures") is None

    def refused() -> None:
        raise refusal

    rt.ledger.requeue(record.step_id, "its lease expired while Redis was full", expect_owner=rt.owner)
    assert _guarded(rt, msg, refused) == (StepOutcome.STALE, None)  # no longer ours: dropped, not failed
    assert rt.client.hget(keys.step(record.step_id), "failures") is None
    assert rt.ledger.load_shape(record.sid).error == ""  # type: ignore[union-attr]  # not parked
