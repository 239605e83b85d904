"""Step messages sent in one round trip are the messages ``send_task`` would have sent (the cluster tests
run real Celery workers on them)."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from croqq.delivery.ledger import StepRecord
from croqq.processes.app import make_app
from croqq.processes.publish import publish_steps
from croqq.processes.redis_server import RedisServer
from croqq.settings import Settings


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
    publish_steps(app, redis_client, [ideate, gpu])

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


def test_nothing_to_send_costs_no_round_trip(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    app = make_app(Settings(broker_url=redis_server.url))
    redis_client.config_resetstat()
    publish_steps(app, redis_client, [])
    assert "cmdstat_lpush" not in redis_client.info("commandstats")
