"""The step ledger and the coordinator on a real Redis: at-least-once messages applied exactly once."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from croqq.delivery import grace, keys
from croqq.delivery.leases import Heartbeat, Lease, StepLeases, owner_id
from croqq.delivery.ledger import Ledger, StepRecord
from croqq.delivery.messages import SubmitMessage
from croqq.delivery.redis_client import strs
from croqq.delivery.state import ShapeState, make_sid
from croqq.domain.fsm import BaselineMeasured, Built, Phase, Proposed, Stored
from croqq.domain.manifest import load_manifest
from croqq.domain.records import BuildOutcome, Idea, Measurement
from croqq.domain.schedule import build_schedule
from croqq.errors import LeaseHeldError, StaleStepError
from croqq.placement import registry
from croqq.placement.assign import Placement
from croqq.processes.redis_server import RedisServer
from croqq.settings import Settings
from croqq.work import history, stats
from croqq.work.advance import Advance
from croqq.work.intake import Intake

ROOT = Path(__file__).resolve().parents[2]
GPU_TYPE = "sm90_Simulated_H100_SXM"


class Cluster:
    """A ledger + coordinator whose 'broker' is a list of published steps."""

    def __init__(self, client: redis.Redis, depth: int = 2, ttl: float = 5.0) -> None:
        self.client = client
        self.settings = Settings(pipeline_depth=depth, lease_ttl_s=ttl)
        self.manifest = load_manifest(ROOT / "kernels" / "manifest.json")
        self.published: list[StepRecord] = []
        self.ledger = Ledger(
            client,
            ttl,
            Advance(refill=lambda uuid: self.placement.fill(uuid)),  # noqa: PLW0108 - placement comes next
            self.record,
        )
        self.placement = Placement(self.settings, client, self.ledger)
        self.coord = Intake(self.settings, self.manifest, client, self.ledger, self.placement)

    def add_gpu(self, uuid: str) -> None:
        registry.register_gpu(
            self.client,
            registry.GpuEntry(uuid=uuid, host="h", index=0, gpu_type=GPU_TYPE, queue=f"gpu.h.{uuid}"),
        )

    def submit(self, shapes: int, max_iter: int = 3) -> list[str]:
        schedule = build_schedule(self.manifest, "f16")[:shapes]
        msg = SubmitMessage(
            submission="s1",
            gpu_type=GPU_TYPE,
            dsl="cuda",
            mode="from_current_best",
            max_iter=max_iter,
            shapes=schedule,
        )
        return self.coord.submit(msg).sids

    def record(self, records: Sequence[StepRecord], pipe: Any) -> None:
        """The publisher: each message 'sent' is kept in ``published`` (called inside the transaction that
        writes the step; these tests run no concurrent writer, so no retried transaction sends twice)."""
        self.published.extend(records)

    def take(self) -> StepRecord:
        return self.published.pop(0)


def baseline_step(cluster: Cluster) -> StepRecord:
    """Build the next published seed (an IMPLEMENT on the build queue) and return its BASELINE step."""
    build = cluster.take()
    assert build.kind == "implement" and build.queue == "build.cuda"
    cluster.ledger.claim(build.step_id, 0, "builder", build.kind, build.sid)
    cluster.ledger.complete(build.step_id, 0, "builder", Built(build=BuildOutcome(ok=True, artifact="seed")))
    step = cluster.published.pop()
    assert step.kind == "baseline" and step.sid == build.sid
    return step


def baseline_event(tflops: float = 100.0) -> BaselineMeasured:
    return BaselineMeasured(knobs={"TILE_M": 128}, measurement=Measurement(outcome="ok", tflops=tflops))


@pytest.fixture
def cluster(redis_client: redis.Redis) -> Cluster:
    c = Cluster(redis_client)
    c.add_gpu("GPU-a")
    return c


def test_submit_fills_gpu_up_to_pipeline_depth(cluster: Cluster) -> None:
    sids = cluster.submit(5)
    assert len(sids) == 5
    assert cluster.client.scard(keys.active("GPU-a")) == 2
    assert [(r.kind, r.queue) for r in cluster.published] == [("implement", "build.cuda")] * 2
    assert baseline_step(cluster).queue == "gpu.h.GPU-a"
    assert cluster.client.zcard(keys.pending(GPU_TYPE)) == 3


def test_resubmitting_changes_nothing(cluster: Cluster) -> None:
    cluster.submit(3)
    cluster.published.clear()
    again = cluster.coord.submit(
        SubmitMessage(
            submission="s2",
            gpu_type=GPU_TYPE,
            dsl="cuda",
            mode="from_current_best",
            max_iter=3,
            shapes=build_schedule(cluster.manifest, "f16")[:3],
        )
    )
    assert len(again.resumed) == 3 and not again.new
    assert cluster.published == []


def test_duplicate_message_is_claimed_once(cluster: Cluster) -> None:
    cluster.submit(1)
    step = baseline_step(cluster)
    assert cluster.ledger.claim(step.step_id, 0, "w1", step.kind, step.sid)[0] == "ok"
    assert cluster.ledger.claim(step.step_id, 0, "w2", step.kind, step.sid)[0] == "running"
    assert cluster.ledger.claim(step.step_id, 7, "w2", step.kind, step.sid)[0] == "stale"
    assert cluster.ledger.claim("nope#1", 0, "w2", "baseline", step.sid)[0] == "missing"
    assert cluster.ledger.claim(step.step_id, 0, "w2", "store", step.sid)[0] == "stale"


def test_first_result_wins_and_a_duplicate_result_changes_nothing(cluster: Cluster) -> None:
    cluster.submit(1)
    step = baseline_step(cluster)
    cluster.ledger.claim(step.step_id, 0, "w1", step.kind, step.sid)[0]
    state = cluster.ledger.complete(step.step_id, 0, "w1", baseline_event())
    assert state.loop.phase == Phase.STORE
    with pytest.raises(StaleStepError):
        cluster.ledger.complete(step.step_id, 0, "w1", baseline_event(999.0))
    assert [r.kind for r in cluster.published] == ["store"]


def test_a_completion_reads_its_step_and_shape_in_one_command_also_after_redis_forgot_its_scripts(
    cluster: Cluster,
) -> None:
    cluster.submit(1)
    step = baseline_step(cluster)
    cluster.ledger.claim(step.step_id, 0, "w1", step.kind, step.sid)
    cluster.client.script_flush()  # as a restarted Redis would have
    cluster.client.config_resetstat()
    state = cluster.ledger.complete(step.step_id, 0, "w1", baseline_event(), step.sid)
    assert state.loop.phase == Phase.STORE
    stats = cluster.client.info("commandstats")
    # the reads under WATCH: one script (EVALSHA, NOSCRIPT, loaded, EVALSHA again), whose HGETALL is the
    # only one (Redis counts a script's commands too)
    assert stats["cmdstat_evalsha"]["calls"] == 2
    assert stats["cmdstat_script|load"]["calls"] == 1
    assert stats["cmdstat_hgetall"]["calls"] == 1
    assert stats["cmdstat_exec"]["calls"] == 2  # the completion's, then its STORE's wake-up


def test_expired_lease_requeues_with_new_epoch_and_old_result_is_stale(redis_client: redis.Redis) -> None:
    cluster = Cluster(redis_client, ttl=0.2)
    cluster.add_gpu("GPU-a")
    cluster.submit(1)
    step = baseline_step(cluster)
    assert cluster.ledger.claim(step.step_id, 0, "dead-worker", step.kind, step.sid)[0] == "ok"
    time.sleep(0.3)
    assert cluster.ledger.expire_leases() == 1
    again = cluster.take()
    assert (again.step_id, again.epoch) == (step.step_id, 1)
    with pytest.raises(StaleStepError):
        cluster.ledger.complete(step.step_id, 0, "dead-worker", baseline_event())
    assert cluster.ledger.claim(step.step_id, 1, "w2", step.kind, step.sid)[0] == "ok"
    cluster.ledger.complete(step.step_id, 1, "w2", baseline_event())


def test_heartbeat_keeps_a_lease_alive(redis_client: redis.Redis) -> None:
    cluster = Cluster(redis_client, ttl=5.0)  # 4 beats span 1.2 TTLs; each leaves 3.5 s of slack
    cluster.add_gpu("GPU-a")
    cluster.submit(1)
    step = baseline_step(cluster)
    cluster.ledger.claim(step.step_id, 0, "w1", step.kind, step.sid)[0]
    for _ in range(4):
        time.sleep(1.5)
        assert cluster.ledger.heartbeat([step.step_id], "w1") == 1
        assert cluster.ledger.expire_leases() == 0
    assert cluster.ledger.heartbeat([step.step_id], "intruder") == 0


def test_one_heartbeat_renews_every_step_its_owner_runs_and_no_other(redis_client: redis.Redis) -> None:
    cluster = Cluster(redis_client, depth=3, ttl=5.0)
    cluster.add_gpu("GPU-a")
    cluster.submit(3)
    steps = [r for r in cluster.published if r.kind == "implement"]
    assert len(steps) == 3
    for step, owner in zip(steps, ("w1", "w1", "w2"), strict=True):
        assert cluster.ledger.claim(step.step_id, 0, owner, step.kind, step.sid)[0] == "ok"
    ids = [s.step_id for s in steps]
    for _ in range(4):  # 1.2 TTLs (at least): only what a beat renewed is still running
        time.sleep(1.5)
        assert cluster.ledger.heartbeat(ids, "w1") == 2
    assert cluster.ledger.expire_leases() == 1  # w2's step, which w1's beats left alone
    assert {r.step_id for r in cluster.published if r.kind == "implement"} == set(ids)
    assert cluster.ledger.load_step(ids[2]).epoch == 1  # type: ignore[union-attr]
    assert [cluster.ledger.load_step(i).status for i in ids[:2]] == ["running", "running"]  # type: ignore[union-attr]
    assert cluster.ledger.heartbeat([], "w1") == 0


def test_lost_publication_is_republished_from_the_outbox(cluster: Cluster) -> None:
    cluster.ledger.publisher = None  # the process "dies" between commit and publish
    cluster.submit(1)
    assert cluster.client.zcard(keys.OUTBOX) == 1
    cluster.ledger.publisher = cluster.record
    assert cluster.ledger.flush_outbox(older_than_s=0.0) == 1
    assert [r.kind for r in cluster.published] == ["implement"]
    assert cluster.client.zcard(keys.OUTBOX) == 0


def test_idea_hash_is_recorded_once_with_the_proposal(cluster: Cluster) -> None:
    sid = cluster.submit(1)[0]
    step = baseline_step(cluster)
    cluster.ledger.claim(step.step_id, 0, "w", step.kind, step.sid)[0]
    state = cluster.ledger.complete(step.step_id, 0, "w", baseline_event())
    # jump the loop to IDEATE as if stored
    state.loop = state.loop.model_copy(update={"phase": Phase.IDEATE, "pending": None, "current_iter": 0})
    cluster.client.set(keys.shape(sid), state.dumps())
    rec = StepRecord(step_id=f"{sid}#99", sid=sid, kind="ideate", epoch=0, status="queued", queue="ideate")
    cluster.client.hset(keys.step(rec.step_id), mapping={k: str(v) for k, v in rec.model_dump().items()})
    state.step_id = rec.step_id
    cluster.client.set(keys.shape(sid), state.dumps())
    cluster.ledger.claim(rec.step_id, 0, "w", rec.kind, rec.sid)[0]
    idea = Idea(summary="s", tag="t", knobs={"TILE_M": 64}, content_hash="abcdef0123456789")
    cluster.ledger.complete(rec.step_id, 0, "w", Proposed(idea=idea))
    assert cluster.client.smembers(keys.ideas(sid)) == {"abcdef0123456789"}


def test_quarantine_releases_shapes_drops_gpu_steps_and_migrates(cluster: Cluster) -> None:
    cluster.add_gpu("GPU-b")
    registry.set_status(cluster.client, "GPU-b", registry.QUARANTINED, "setup")
    sids = cluster.submit(2)
    first, _second = baseline_step(cluster), baseline_step(cluster)
    cluster.ledger.claim(first.step_id, 0, "w", first.kind, first.sid)[0]
    cluster.ledger.complete(first.step_id, 0, "w", baseline_event())  # that shape moves on to STORE
    registry.set_status(cluster.client, "GPU-b", registry.HEALTHY)
    cluster.published.clear()
    moved = cluster.placement.quarantine("GPU-a", "XID 79")
    assert moved == 2
    assert registry.get_gpu(cluster.client, "GPU-a").status == registry.QUARANTINED  # type: ignore[union-attr]
    states = {sid: cluster.ledger.load_shape(sid) for sid in sids}
    assert all(s is not None and s.gpu_uuid == "GPU-b" for s in states.values())
    # the queued baseline on GPU-a was dropped and re-planned on GPU-b; the STORE step kept running
    assert [r.kind for r in cluster.published] == ["baseline"]
    assert cluster.published[0].queue == "gpu.h.GPU-b"
    stored_shape = next(s for s in states.values() if s is not None and s.loop.phase == Phase.STORE)
    assert stored_shape.step_id is not None and stored_shape.needs_rebase is False


def test_submit_refills_a_gpu_when_a_shape_completes(cluster: Cluster) -> None:
    sids = cluster.submit(3, max_iter=1)
    assert make_sid(GPU_TYPE, "cuda", build_schedule(cluster.manifest, "f16")[0].key) == sids[0]
    assert cluster.client.zcard(keys.pending(GPU_TYPE)) == 1


def test_a_retried_transaction_returns_only_the_committed_attempts_result(redis_client: redis.Redis) -> None:
    from croqq.delivery.ledger import Txn

    redis_client.set("k", "0")
    attempts: list[str] = []

    def body(pipe):  # type: ignore[no-untyped-def]
        attempts.append(pipe.get("k"))
        if len(attempts) == 1:
            redis_client.set("k", "changed")  # another process commits in between: EXEC must fail
        pipe.multi()
        pipe.set("k", f"written-by-{len(attempts)}")
        return len(attempts)

    assert Txn(redis_client).run(["k"], body) == 2
    assert redis_client.get("k") == "written-by-2" and attempts == ["0", "changed"]


def test_a_stale_holders_late_failure_neither_parks_the_shape_nor_drops_the_newer_step(
    redis_client: redis.Redis,
) -> None:
    cluster = Cluster(redis_client, ttl=0.2)
    cluster.add_gpu("GPU-a")
    sid = cluster.submit(1)[0]
    step = baseline_step(cluster)
    assert cluster.ledger.claim(step.step_id, 0, "paused-worker", step.kind, step.sid)[0] == "ok"
    time.sleep(0.3)
    assert cluster.ledger.expire_leases() == 1  # re-dispatched as epoch 1, taken by another worker
    again = cluster.take()
    assert cluster.ledger.claim(again.step_id, 1, "w2", again.kind, again.sid)[0] == "ok"
    # the paused worker wakes up and reports a terminal failure of its (epoch 0) run
    assert not cluster.ledger.fail(step.step_id, 0, "paused-worker", "boom", terminal=True, max_failures=1)
    state = cluster.ledger.load_shape(sid)
    record = cluster.ledger.load_step(step.step_id)
    assert state is not None and state.error == "" and state.step_id == step.step_id
    assert record is not None and (record.status, record.epoch, record.owner) == ("running", 1, "w2")
    assert cluster.client.hget(keys.step(step.step_id), "failures") is None
    cluster.ledger.complete(step.step_id, 1, "w2", baseline_event())  # the newer holder's result counts


def parked_message(cluster: Cluster) -> SubmitMessage:
    schedule = build_schedule(cluster.manifest, "f16")[:1]
    return SubmitMessage(
        submission="s2", gpu_type=GPU_TYPE, dsl="cuda", mode="from_current_best", max_iter=3, shapes=schedule
    )


def test_retry_resumes_a_parked_shape_on_a_gpu(cluster: Cluster) -> None:
    sid = cluster.submit(1)[0]
    step = baseline_step(cluster)
    cluster.ledger.claim(step.step_id, 0, "w", step.kind, step.sid)
    assert cluster.ledger.fail(step.step_id, 0, "w", "the seed kernel does not build", True, 1)
    parked = cluster.ledger.load_shape(sid)
    assert parked is not None and parked.status == "error" and parked.step_id is None
    assert cluster.submit(1) == [sid]  # submitting again says so, instead of calling it resumed
    assert cluster.coord.submit(parked_message(cluster)).parked == [sid]
    assert cluster.coord.retry([sid]) == [sid]
    assert cluster.coord.retry([sid]) == []  # no longer parked: nothing to do
    state = cluster.ledger.load_shape(sid)
    assert state is not None and state.error == "" and state.gpu_uuid == "GPU-a"
    assert cluster.published[-1].kind == "baseline" and state.step_id == cluster.published[-1].step_id


def test_a_shape_is_stored_packed_and_read_back_whole_also_from_plain_json(cluster: Cluster) -> None:
    from croqq.delivery.state import PACKED, ShapeState

    sid = cluster.submit(1)[0]
    raw = cluster.client.get(keys.shape(sid))
    assert raw.startswith(PACKED)  # what crosses the network on every step is deflated
    state = cluster.ledger.load_shape(sid)
    assert state is not None and len(raw) < len(state.model_dump_json())
    assert ShapeState.loads(raw) == state == ShapeState.loads(state.model_dump_json())


def test_the_store_hooks_see_the_shape_as_it_was_before_the_store(cluster: Cluster) -> None:
    seen: list[tuple[ShapeState, ShapeState]] = []
    cluster.ledger.advance.on_stored = [  # type: ignore[attr-defined]
        lambda pipe, before, after, event: seen.append((before, after)),
        stats.on_stored,
        history.on_stored,
    ]
    sid = cluster.submit(1)[0]
    step = baseline_step(cluster)
    cluster.ledger.claim(step.step_id, 0, "w1", step.kind, step.sid)
    cluster.ledger.complete(step.step_id, 0, "w1", baseline_event(123.0))
    store = cluster.take()
    cluster.ledger.claim(store.step_id, 0, "writer", store.kind, store.sid)
    cluster.ledger.complete(store.step_id, 0, "writer", Stored(iteration=0))
    [(before, after)] = seen
    assert before.loop.phase == Phase.STORE and before.loop.pending is not None
    assert after.loop.phase != Phase.STORE and after.loop.pending is None
    assert after.iter_exec_s == 0.0  # the next iteration's clock starts
    assert (
        cluster.client.hget(keys.STATS, "stored") == "1"
        and cluster.client.hget(keys.STATS, "BASELINE") == "1"
    )
    [entry] = cluster.client.hvals(keys.history(sid))
    assert '"decision":"BASELINE"' in entry and '"tflops":123.0' in entry


def test_a_process_renews_all_its_step_leases_in_one_call_per_beat() -> None:
    calls: list[list[str]] = []
    heartbeat = Heartbeat(60.0)  # not started: the test beats by hand
    leases = StepLeases(calls.append, heartbeat)
    heartbeat.beat_now()
    assert calls == []  # no step, no round trip
    leases.add("b#2.x")
    leases.add("a#1.x")
    heartbeat.beat_now()
    leases.remove("a#1.x")
    leases.remove("a#1.x")  # removing twice (a step given back, then finished) is harmless
    heartbeat.beat_now()
    assert calls == [["a#1.x", "b#2.x"], ["b#2.x"]]


def store_steps(cluster: Cluster, shapes: int) -> list[StepRecord]:
    """``shapes`` shapes measured to their first STORE (baseline done); their STORE steps, oldest first."""
    cluster.submit(shapes)
    for _ in range(shapes):
        step = baseline_step(cluster)
        cluster.ledger.claim(step.step_id, 0, "gpu", step.kind, step.sid)
        cluster.ledger.complete(step.step_id, 0, "gpu", baseline_event())
    assert [r.kind for r in cluster.published].count("store") == 1  # one wake-up for all of them
    stores = [cluster.ledger.load_step(i) for i in strs(cluster.client.zrange(keys.QUEUED_STORES, 0, -1))]
    assert len(stores) == shapes
    return stores  # type: ignore[return-value]


def test_stores_queued_while_a_wake_up_is_on_its_way_send_no_message(redis_client: redis.Redis) -> None:
    cluster = Cluster(redis_client, depth=4)
    cluster.add_gpu("GPU-a")
    first, *_ = store_steps(cluster, 3)  # the first STORE woke the writer; the others sent nothing
    cluster.ledger.take_wake()  # the writer drains: a STORE queued from now on wakes it again
    cluster.published.clear()
    cluster.ledger.publish([first, first])
    assert [r.step_id for r in cluster.published] == [first.step_id]
    assert redis_client.zcard(keys.OUTBOX) == 0  # a STORE without a message is published all the same


def test_a_lost_wake_up_is_sent_again_once_a_store_waited_a_lease_ttl(redis_client: redis.Redis) -> None:
    ttl = 0.2
    cluster = Cluster(redis_client, depth=4, ttl=ttl)
    cluster.add_gpu("GPU-a")
    oldest = store_steps(cluster, 2)[0]
    cluster.published.clear()  # the wake-up is lost (its writer was killed, or Redis lost its tail)
    assert not cluster.ledger.wake_writer(older_than_s=ttl)  # not yet: a wake-up may still be on its way
    time.sleep(ttl + 0.05)
    assert cluster.ledger.wake_writer(older_than_s=ttl)
    assert [r.step_id for r in cluster.published] == [oldest.step_id]
    assert not cluster.ledger.wake_writer(older_than_s=ttl)  # one on its way again
    assert cluster.ledger.republish([oldest.step_id], "its consumer restarted") == 1  # a re-publish is sent
    assert len(cluster.published) == 2


def test_the_writer_claims_the_oldest_queued_stores_before_their_messages(redis_client: redis.Redis) -> None:
    cluster = Cluster(redis_client, depth=4)
    cluster.add_gpu("GPU-a")
    first, *queued = store_steps(cluster, 4)
    assert cluster.ledger.claim(first.step_id, 0, "writer", "store", first.sid)[0] == "ok"
    assert redis_client.zcard(keys.QUEUED_STORES) == 3  # a claim takes its step out of the index
    claimed = cluster.ledger.claim_queued_stores("writer", 2)
    assert [(m.step_id, m.epoch, m.sid, m.kind) for m, _ in claimed] == [
        (r.step_id, 0, r.sid, "store") for r in queued[:2]
    ]
    assert all(state is not None and state.step_id == m.step_id for m, state in claimed)
    for msg, _ in claimed:  # running under the writer's lease; their own messages are duplicates now
        assert cluster.ledger.load_step(msg.step_id).owner == "writer"  # type: ignore[union-attr]
        assert redis_client.zscore(keys.RUNNING, msg.step_id) is not None
        assert cluster.ledger.claim(msg.step_id, 0, "writer", "store", msg.sid)[0] == "running"
    assert [m.step_id for m, _ in cluster.ledger.claim_queued_stores("writer", 8)] == [queued[2].step_id]
    assert cluster.ledger.claim_queued_stores("writer", 8) == []
    assert redis_client.zcard(keys.QUEUED_STORES) == 0
    done = cluster.ledger.complete(claimed[0][0].step_id, 0, "writer", Stored(iteration=0))
    assert done.loop.phase != Phase.STORE


def test_a_dropped_or_requeued_store_is_claimed_only_as_it_now_is(redis_client: redis.Redis) -> None:
    cluster = Cluster(redis_client, depth=4, ttl=0.05)
    cluster.add_gpu("GPU-a")
    dropped, expired = store_steps(cluster, 2)
    with redis_client.pipeline() as pipe:
        pipe.multi()
        cluster.ledger.drop_step(pipe, dropped.step_id)
        pipe.execute()
    assert cluster.ledger.claim(expired.step_id, 0, "old-writer", "store", expired.sid)[0] == "ok"
    time.sleep(0.1)
    assert cluster.ledger.expire_leases() == 1  # back in the queue with epoch 1
    [(msg, _)] = cluster.ledger.claim_queued_stores("writer", 8)
    assert (msg.step_id, msg.epoch) == (expired.step_id, 1)
    with pytest.raises(StaleStepError):  # the old holder's result changes nothing
        cluster.ledger.complete(expired.step_id, 0, "old-writer", Stored(iteration=0))
    cluster.ledger.complete(expired.step_id, 1, "writer", Stored(iteration=0))


def test_lease_renewals_stay_out_of_the_aof_and_a_restart_grants_every_running_step_one_ttl(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    ttl = 5.0  # the live holder's beats, ttl / 2.8 apart, leave it most of a TTL of slack
    cluster = Cluster(redis_client, depth=2, ttl=ttl)
    cluster.add_gpu("GPU-a")
    cluster.submit(2)
    alive, dead = baseline_step(cluster), baseline_step(cluster)
    for step, owner in ((alive, "w-alive"), (dead, "w-dead")):
        assert cluster.ledger.claim(step.step_id, 0, owner, step.kind, step.sid)[0] == "ok"
    assert cluster.ledger.expire_leases() == 0  # the first tick records the run id
    aof = redis_client.info("persistence")["aof_current_size"]
    for _ in range(20):
        assert cluster.ledger.heartbeat([alive.step_id], "w-alive") == 1
    assert redis_client.info("persistence")["aof_current_size"] == aof  # renewals: memory only
    time.sleep(ttl + 0.2)  # both claims' persisted deadlines pass
    redis_server.kill()
    redis_server.start(timeout=180)
    client = redis_server.client()
    ledger = Ledger(client, ttl, cluster.ledger.advance, cluster.record)
    assert client.zcard(keys.RUNNING) == 2  # the AOF kept the claims, with their deadlines
    assert ledger.expire_leases() == 0  # a new run id: one TTL for each running step
    assert grace.grant(client, ttl) == (0, 0, 0)  # once per run id
    for _ in range(3):  # the live holder renews; the dead one's lease runs out one TTL after the restart
        time.sleep(ttl / 2.8)  # 3 of them: more than a TTL
        ledger.heartbeat([alive.step_id], "w-alive")
    assert ledger.expire_leases() == 1
    assert (ledger.load_step(dead.step_id).epoch, ledger.load_step(alive.step_id).status) == (1, "running")  # type: ignore[union-attr]
    client.close()


def test_a_result_naming_another_shape_is_stale_and_changes_nothing(cluster: Cluster) -> None:
    first, second = cluster.submit(2)
    step = baseline_step(cluster)
    other = second if step.sid == first else first
    cluster.ledger.claim(step.step_id, 0, "w1", step.kind, step.sid)
    with pytest.raises(StaleStepError):
        cluster.ledger.complete(step.step_id, 0, "w1", baseline_event(), sid=other)
    assert cluster.ledger.load_step(step.step_id).status == "running"  # type: ignore[union-attr]
    state = cluster.ledger.complete(step.step_id, 0, "w1", baseline_event(), sid=step.sid)
    assert state.loop.phase == Phase.STORE


def test_a_group_completes_in_one_transaction_and_a_stale_member_holds_up_no_other(
    redis_client: redis.Redis,
) -> None:
    cluster = Cluster(redis_client, depth=3)
    cluster.add_gpu("GPU-a")
    first = store_steps(cluster, 3)[0]
    assert cluster.ledger.claim(first.step_id, 0, "writer", "store", first.sid)[0] == "ok"
    claimed = [m for m, _ in cluster.ledger.claim_queued_stores("writer", 8)]
    assert len(claimed) == 2
    cluster.published.clear()
    results = cluster.ledger.complete_many(
        [(first.step_id, 0, first.sid, Stored(iteration=0))]
        + [(m.step_id, 7 if i == 0 else m.epoch, m.sid, Stored(iteration=0)) for i, m in enumerate(claimed)],
        "writer",
    )
    assert isinstance(results[1], StaleStepError)  # another epoch: not this writer's to complete
    assert [r.loop.phase for r in (results[0], results[2])] == [Phase.PROFILE] * 2  # type: ignore[union-attr]
    assert [
        s.status for s in map(cluster.ledger.load_step, (first.step_id, *(m.step_id for m in claimed)))
    ] == [  # type: ignore[union-attr]
        "done",
        "running",
        "done",
    ]
    assert sorted(r.sid for r in cluster.published) == sorted([first.sid, claimed[1].sid])  # next steps
    assert redis_client.zcard(keys.OUTBOX) == 0


def test_a_group_whose_messages_cannot_be_sent_commits_nothing_and_leaves_no_step_without_one(
    redis_client: redis.Redis,
) -> None:
    """The next steps' messages go out in the completion's transaction: a publisher that fails commits
    none of the group (its STOREs stay running, to be completed again: the writer's commits are
    idempotent), so no step is written without its message and nothing waits in the outbox."""
    cluster = Cluster(redis_client, depth=3)
    cluster.add_gpu("GPU-a")
    first = store_steps(cluster, 3)[0]
    assert cluster.ledger.claim(first.step_id, 0, "writer", "store", first.sid)[0] == "ok"
    claimed = [m for m, _ in cluster.ledger.claim_queued_stores("writer", 8)]
    results = [(m.step_id, m.epoch, m.sid, Stored(iteration=0)) for m in (first, *claimed)]

    def broken(records: Sequence[StepRecord], pipe: Any) -> None:
        raise ConnectionError("broker gone")

    cluster.ledger.publisher = broken
    with pytest.raises(ConnectionError):
        cluster.ledger.complete_many(results, "writer")
    for m in (first, *claimed):
        assert cluster.ledger.load_step(m.step_id).status == "running"  # type: ignore[union-attr]
    assert redis_client.zcard(keys.OUTBOX) == 0
    cluster.published.clear()
    cluster.ledger.publisher = cluster.record
    cluster.ledger.complete_many(results, "writer")
    assert sorted(r.sid for r in cluster.published) == sorted(m.sid for m in (first, *claimed))
    assert redis_client.zcard(keys.OUTBOX) == 0


def _commands(client: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in client.info("commandstats").values())


@pytest.mark.parametrize("gpus", [4, 16])
def test_a_fill_tick_costs_a_few_commands_per_gpu_and_writes_nothing_when_nothing_changed(
    redis_client: redis.Redis, gpus: int
) -> None:
    """The coordinator fills every GPU on every tick: over a fleet that must cost O(GPUs) commands (the fair
    share was once re-read for each GPU: O(GPUs^2)), and an idle tick must append nothing to the AOF."""
    cluster = Cluster(redis_client, depth=2)
    for i in range(gpus):
        cluster.add_gpu(f"GPU-{i:02d}")
    cluster.submit(2 * gpus + 3)  # every GPU full, three shapes waiting
    assert all(redis_client.scard(keys.active(f"GPU-{i:02d}")) == 2 for i in range(gpus))
    cluster.placement.fill_all()  # the first tick after the submission may settle the depths
    aof, before = redis_client.info("persistence")["aof_current_size"], _commands(redis_client)
    assert cluster.placement.fill_all() == 0
    used = _commands(redis_client) - before - 1  # the INFO that read the counters
    assert used <= 4 * gpus + 4, f"{used} commands for {gpus} GPUs"
    assert redis_client.info("persistence")["aof_current_size"] == aof


def test_worker_beats_and_gpu_lease_renewals_stay_out_of_the_aof_and_a_restart_gives_them_one_ttl(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A GPU worker's beats cost no fsync; a Redis restart neither reaps it nor leaves its GPU unclaimed."""
    ttl, queue = 5.0, "gpu.h.GPU-a"
    gpu = registry.GpuEntry(uuid="GPU-a", host="h", index=0, gpu_type=GPU_TYPE, queue=queue, owner="w-gpu")
    registry.register_gpu(redis_client, gpu)
    registry.register_worker(redis_client, "gpu-0@h", [queue], "gpu")
    lease = Lease(redis_client, "gpu:GPU-a", "w-gpu", ttl, in_memory=True)
    assert lease.try_acquire()
    assert grace.grant(redis_client, ttl) == (0, 0, 0)  # the first tick records the run id
    aof = redis_client.info("persistence")["aof_current_size"]
    for _ in range(6):  # past the claim's and the registration's persisted times
        time.sleep(ttl / 4)
        assert lease.renew()
        registry.beat_worker(redis_client, "gpu-0@h")
    assert redis_client.info("persistence")["aof_current_size"] == aof  # beats: memory only
    assert registry.live_workers(redis_client, ttl) == ["gpu-0@h"]
    redis_server.kill()
    redis_server.start(timeout=180)
    client = redis_server.client()
    assert client.get(keys.lease("gpu:GPU-a")) is None  # the AOF had the claim's expiry only
    assert grace.grant(client, ttl) == (0, 1, 1)
    assert client.get(keys.lease("gpu:GPU-a")) == "w-gpu"  # back for the owner the registry names
    assert registry.reap_dead_workers(client, ttl) == []
    assert Lease(client, "gpu:GPU-a", "w-gpu", ttl, in_memory=True).renew()
    assert grace.grant(client, ttl) == (0, 0, 0)  # once per run id
    client.close()


def test_a_fill_from_a_stale_registry_read_places_nothing_on_a_gpu_quarantined_since(
    cluster: Cluster,
) -> None:
    cluster.add_gpu("GPU-a")
    snapshot = registry.all_gpus(cluster.client)  # the tick's read: healthy
    cluster.placement.quarantine("GPU-a", "its start check failed")
    cluster.submit(2)
    assert cluster.placement.fill_all(gpus=snapshot) == 0
    assert cluster.client.scard(keys.active("GPU-a")) == 0
    assert cluster.client.zcard(keys.pending(GPU_TYPE)) == 2


def test_waiting_for_a_held_lease_counts_wall_seconds_whatever_the_load(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's TTL runs on Redis's clock: a busy host neither waits longer nor gives up sooner."""
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0 * (os.cpu_count() or 1), 0.0, 0.0))
    monkeypatch.setenv("CROQQ_PATIENCE", "100")
    holder = owner_id("first")  # this live process: never taken for dead
    assert Lease(redis_client, "writer", holder, ttl_s=0.5).try_acquire()
    started = time.monotonic()
    Lease(redis_client, "writer", owner_id("second"), ttl_s=5).acquire(3.0, "the writer lock")
    assert time.monotonic() - started < 2.5  # taken once the holder's TTL ran out
    started = time.monotonic()
    with pytest.raises(LeaseHeldError, match=r"^the writer lock is already held by .*:second \(lease "):
        Lease(redis_client, "writer", owner_id("third"), ttl_s=5).acquire(0.3, "the writer lock")
    assert time.monotonic() - started < 2.0  # 0.3 wall seconds, not stretched by load or CROQQ_PATIENCE
