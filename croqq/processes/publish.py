"""Step messages in Celery's own format, several in one Redis round trip.

``send_task`` publishes one message per call: a producer from the pool, a queue declaration, a round trip,
about a millisecond of CPU each. A completion publishes the steps it planned, and the writer's group commit
up to ``store_group`` of them at once. :func:`publish_steps` builds each message as ``send_task`` does
(Celery's protocol-2 headers from ``app.amqp.as_task_v2``, kombu's envelope for Redis) and LPUSHes them all
in one pipeline onto their queues' lists: what kombu's Redis transport does with a message of priority 0
routed by the default exchange. ``tests/unit/test_publish.py`` holds the envelope to what ``send_task``
writes, and every cluster test runs real Celery workers on these messages.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from celery.utils.nodenames import anon_nodename
from kombu.serialization import dumps
from kombu.utils.uuid import uuid

from croqq.delivery.ledger import StepRecord
from croqq.delivery.messages import StepMessage
from croqq.delivery.queues import STEP_TASK

if TYPE_CHECKING:
    from celery import Celery
    from redis.client import Pipeline


def envelope(app: Celery, record: StepRecord) -> str:
    """The message of ``record``'s step, as kombu stores it in the queue's list."""
    msg = StepMessage(step_id=record.step_id, epoch=record.epoch, sid=record.sid, kind=record.kind)
    label = f"{record.kind} {record.sid.rsplit('/', 1)[-1]} e{record.epoch}"  # what Flower shows, short
    task_id = uuid()
    headers, properties, body, _ = app.amqp.as_task_v2(
        task_id,
        STEP_TASK[record.kind],
        args=[msg.model_dump()],
        argsrepr=label,
        kwargsrepr="",
        origin=anon_nodename(),  # as send_task names it: gen<pid>@<host>, per process (a pool child its own)
        reply_to=app.thread_oid,
        ignore_result=True,
    )
    content_type, encoding, data = dumps(body, serializer="json")
    payload = data.encode() if isinstance(data, str) else data
    return json.dumps(
        {
            "body": base64.b64encode(payload).decode("ascii"),
            "content-encoding": encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                **properties,
                "argsrepr": label,  # send_task passes them on as properties too
                "kwargsrepr": "",
                "delivery_mode": 2,  # persistent
                "delivery_info": {"exchange": "", "routing_key": record.queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": uuid(),
            },
        }
    )


def publish_steps(app: Celery, pipe: Pipeline, records: Sequence[StepRecord]) -> None:
    """Add each record's step message to ``pipe``, onto its queue; the caller's ``execute`` sends them all in
    one round trip (the ledger's, with the outbox removal)."""
    for record in records:
        pipe.lpush(record.queue, envelope(app, record))
