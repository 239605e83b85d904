"""Step messages sent in one round trip are the messages ``send_task`` would have sent (the cluster tests
run real Celery workers on them)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis

from croqq.delivery import keys, memory
from croqq.delivery.ledger import Ledger, StepRecord
from croqq.processes.app import make_app
from croqq.processes.publish import publish_steps
from croqq.processes.redis_server import RedisServer
from croqq.settings import Settings
from croqq.work.advance import Advance


def _record(kind: str, queue: str, n: int = 1) -> StepRecord:
    return StepRecord(
        step_id=f"f16_256x256x256#{n}.0123456789ab",
        sid="sm90_Simulated_H100_SXM/cuda/f16_256x256x256",
        kind=kind,
        epoch=2,
        status="queued",
        queue=queue,
        dispatched_at=1.0,
    )


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message minus what differs on every send (ids, tags, the sender's name)."""
    out: dict[str, Any] = json.loads(json.dumps(message))
    for key in ("id", "root_id", "origin", "ignore_result"):
        out["headers"].pop(key)
    for key in ("correlation_id", "delivery_tag", "reply_to"):
        out["properties"].pop(key)
    return out


def test_a_batch_holds_the_messages_send_task_would_have_sent(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    app = make_app(Settings(broker_url=redis_server.url))
    ideate, gpu = _record("ideate", "ideate", 1), _record("measure", "gpu.h.GPU-a", 2)
    app.send_task(
        "croqq.step.ideate",
        args=[{"step_id": ideate.step_id, "epoch": 2, "sid": ideate.sid, "kind": "ideate"}],
        queue="ideate",
        argsrepr="ideate f16_256x256x256 e2",
        kwargsrepr="",
    )
    (by_celery,) = (json.loads(m) for m in redis_client.lrange("ideate", 0, -1))
    redis_client.delete("ideate")
    redis_client.config_resetstat()
    pipe = redis_client.pipeline(transaction=False)
    publish_steps(app, pipe, [ideate, gpu])
    assert "cmdstat_lpush" not in redis_client.info("commandstats")  # the caller's execute sends them
    pipe.execute()

    assert redis_client.info("commandstats")["cmdstat_lpush"]["calls"] == 2
    (ours,) = (json.loads(m) for m in redis_client.lrange("ideate", 0, -1))
    assert _without_ids(ours) == _without_ids(by_celery)
    assert ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]
    (measure,) = (json.loads(m) for m in redis_client.lrange("gpu.h.GPU-a", 0, -1))
    assert measure["headers"]["task"] == "croqq.step.gpu"
    assert measure["properties"]["delivery_info"] == {"exchange": "", "routing_key": "gpu.h.GPU-a"}
    args, kwargs, _ = json.loads(base64.b64decode(measure["body"]))
    assert (args, kwargs) == ([{"step_id": gpu.step_id, "epoch": 2, "sid": gpu.sid, "kind": "measure"}], {})
    assert ours["headers"]["id"] != measure["headers"]["id"]


def _write(ledger: Ledger, records: list[StepRecord]) -> None:
    """Write the steps as :meth:`Ledger.plan_step` does, in one transaction."""
    with ledger.client.pipeline() as pipe:
        pipe.multi()
        for record in records:
            ledger._write_step(pipe, record)
        pipe.execute()


def test_a_step_goes_out_with_its_message_in_the_transaction_that_writes_it(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    app = make_app(Settings(broker_url=redis_server.url))
    ledger = Ledger(redis_client, 5.0, Advance(), lambda records, pipe: publish_steps(app, pipe, records))
    ideate, gpu = _record("ideate", "ideate", 1), _record("measure", "gpu.h.GPU-a", 2)
    redis_client.config_resetstat()
    _write(ledger, [ideate, gpu])
    calls = {k: v["calls"] for k, v in redis_client.info("commandstats").items()}
    assert (calls["cmdstat_exec"], calls["cmdstat_lpush"]) == (1, 2)
    assert redis_client.llen("ideate") == redis_client.llen("gpu.h.GPU-a") == 1
    assert redis_client.zcard(keys.OUTBOX) == 0  # nothing left to send
    ledger.publish([ideate, gpu])  # after the commit: only a STORE's wake-up would go out
    assert redis_client.llen("ideate") == 1


def test_the_outbox_is_sent_and_emptied_in_one_transaction_or_kept_when_redis_refuses_it(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Steps written without a publisher (or a STORE's wake-up) wait in the outbox; housekeeping's flush
    sends their messages and takes them off in one round trip, and a full Redis keeps them there."""
    app = make_app(Settings(broker_url=redis_server.url))
    ledger = Ledger(redis_client, 5.0, Advance())
    ideate, gpu = _record("ideate", "ideate", 1), _record("measure", "gpu.h.GPU-a", 2)
    _write(ledger, [ideate, gpu])
    assert redis_client.zcard(keys.OUTBOX) == 2 and not redis_client.exists("ideate")
    ledger.publisher = lambda records, pipe: publish_steps(app, pipe, records)
    redis_client.config_set("maxmemory", memory.read_memory(redis_client).used + 4 * 1024 * 1024)
    try:
        redis_client.setrange("croqq-test-junk", 4 * 1024 * 1024, "x")
        with pytest.raises(redis.exceptions.RedisError) as refused:
            ledger.flush_outbox(older_than_s=0.0)
        assert memory.is_full_error(refused.value), refused.value
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.delete("croqq-test-junk")
    assert redis_client.zcard(keys.OUTBOX) == 2 and not redis_client.exists("ideate")
    redis_client.config_resetstat()
    assert ledger.flush_outbox(older_than_s=0.0) == 2
    calls = {k: v["calls"] for k, v in redis_client.info("commandstats").items()}
    assert calls["cmdstat_lpush"] == 2 and calls["cmdstat_exec"] == 2  # one transaction per step re-published
    assert redis_client.zcard(keys.OUTBOX) == 0
    assert redis_client.llen("ideate") == redis_client.llen("gpu.h.GPU-a") == 1
