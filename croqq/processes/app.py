"""The Celery application: JSON only, late acks, requeue on worker loss, prefetch 1, no eta/countdown.

``celery -A croqq.processes.app worker ...`` works, but the ``croqq`` commands are the supported way to
start processes: they take the singleton and GPU leases before the worker consumes anything.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

from celery import Celery, beat, bootsteps
from celery.signals import before_task_publish
from celery.worker.consumer import Consumer

from croqq.delivery import memory, queues, transport
from croqq.delivery.redis_client import kombu_url
from croqq.settings import Settings, get_settings

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 5.0
RECORD_EVERY_S = 1.0  # a submission is durable (in the results repo) within about this long
# Periodic writer tasks wait behind the STOREs on the store queue: a maximum age shorter than a busy
# writer's backlog would skip every one of them (submissions never recorded). A pile of them is cheap.
STORE_PERIODIC_MAX_AGE_S = 60.0
CONNECT_TIMEOUT_S = 2.0
RECONNECT_MAX_S = 1.0  # a worker cut off from the broker tries again at least this often


# Celery's own ``expires`` is a wall-clock date checked with the consumer's wall clock, so a host whose
# clock runs ahead would drop every such message. croqq's periodic and best-effort messages carry their
# maximum age instead; the publisher stamps them with Redis's time and the consumer checks that age on
# Redis's clock (``too_old``).
MAX_AGE_HEADER = "croqq_max_age_s"
SENT_HEADER = "croqq_sent"


def max_age(seconds: float) -> dict[str, object]:
    """Publish options for a message that is useless once older than ``seconds`` (Redis's clock)."""
    return {"headers": {MAX_AGE_HEADER: float(seconds)}}


@before_task_publish.connect
def _stamp_sent(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is None or MAX_AGE_HEADER not in headers:
        return
    from croqq.delivery import clock
    from croqq.delivery.redis_client import connect

    try:
        headers[SENT_HEADER] = clock.now(connect(get_settings()))
    except Exception as exc:  # unstamped: the consumer runs it whatever its age
        log.warning("could not stamp a message with Redis's time: %s", exc)


def too_old(request: Any, client: Any) -> bool:
    """True for a message whose maximum age (Redis's clock) has passed: the consumer skips it."""
    limit, sent = getattr(request, MAX_AGE_HEADER, None), getattr(request, SENT_HEADER, None)
    if limit is None or sent is None:
        return False
    from croqq.delivery import clock

    return clock.now(client) - float(sent) > float(limit)


def beat_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    every = settings.reconcile_every_s
    return {
        "reconcile": {
            "task": queues.TASK_RECONCILE,
            "schedule": timedelta(seconds=every),
            "options": {"queue": queues.CONTROL, **max_age(max(2.0, 5 * every))},
        },
        "flush": {
            "task": queues.TASK_FLUSH,
            "schedule": timedelta(seconds=FLUSH_EVERY_S),
            "options": {"queue": queues.STORE, **max_age(STORE_PERIODIC_MAX_AGE_S)},
        },
        "record": {
            "task": queues.TASK_RECORD,
            "schedule": timedelta(seconds=RECORD_EVERY_S),
            "options": {"queue": queues.STORE, **max_age(STORE_PERIODIC_MAX_AGE_S)},
        },
        "summary": {
            "task": queues.TASK_SUMMARY,
            "schedule": timedelta(seconds=60),
            "options": {"queue": queues.STORE, **max_age(120)},
        },
    }


def transport_options(settings: Settings) -> dict[str, object]:
    """kombu's Redis options. A partition leaves half-open TCP connections behind (no FIN, no RST): without
    timeouts a consumer's BRPOP waits long past the heal and a publish forever. A connection silent for
    2x the lease TTL is taken for dead (as a lease holder silent for one TTL loses its lease), dropped and
    reopened once the network is back (:class:`PromptReconnectConsumer`); a shorter partition leaves it
    alone, so a worker does not lose its pool child over a blip."""
    dead_after_s = 2 * settings.lease_ttl_s
    return {
        "socket_timeout": dead_after_s + CONNECT_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_keepalive": True,
        "health_check_interval": max(1, round(dead_after_s)),
    }


def celery_config(settings: Settings) -> dict[str, object]:
    url = kombu_url(settings)
    conf: dict[str, object] = dict(  # noqa: C408 - keyword form reads like Celery's settings docs
        broker_url=url,
        task_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_prefetch_multiplier=1,
        task_default_queue=queues.CONTROL,
        task_create_missing_queues=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport_options=transport_options(settings),
        worker_consumer="croqq.processes.app:PromptReconnectConsumer",
        broker_heartbeat=0,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=settings.task_events,
        # no task-sent events: one more publish per step message on the hot path, and Flower shows a task
        # from its task-received event anyway
        task_send_sent_event=False,
        beat_schedule=beat_schedule(settings),
        timezone="UTC",
    )
    if url.startswith("rediss://"):
        import ssl

        reqs = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
        conf["broker_use_ssl"] = {"ssl_cert_reqs": reqs[settings.redis_ssl_cert_reqs]}
    return conf


def make_app(settings: Settings | None = None) -> Celery:
    """The app; its configuration is read from the settings lazily (at first use) unless given."""
    transport.install()  # one redis.Redis per broker connection pool (see croqq.delivery.transport)
    celery = Celery("croqq", include=["croqq.processes.tasks"])
    if settings is not None:
        celery.conf.update(celery_config(settings))
    else:
        celery.add_defaults(lambda: celery_config(get_settings()))
    return celery


def configure(settings: Settings) -> None:
    """Re-point this process's app at ``settings`` (in-process tools and tests that set CROQQ_* late)."""
    app.conf.update(celery_config(settings))
    pool = getattr(app, "_pool", None)
    if pool is not None:
        pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None


def declare_queue(name: str) -> None:
    """Declare a queue and its binding again (a Redis that forgot them routes its messages nowhere)."""
    queue = app.amqp.queues[name]
    with app.connection_for_write() as conn:
        queue.bind(conn.default_channel).declare()


class PromptReconnectConsumer(Consumer):
    """Celery's consumer, reconnecting to the broker every second or so instead of backing off to 30 s:
    after a partition heals, a worker consumes again within about a second, not up to half a minute."""

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=0.5, interval_step=0.5, interval_max=RECONNECT_MAX_S
        )
        return super().ensure_connected(conn)


class PausingScheduler(beat.Scheduler):
    """Celery beat's scheduler, quiet while Redis is full: a due task it cannot send is skipped (the
    schedule sends it again next time; housekeeping tolerates missed ticks), said once per pause instead
    of a traceback per tick."""

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:
            if not memory.is_full_error(exc):
                log.error("could not send %s: %s", entry.task, exc, exc_info=True)
                return
            memory.note_full(self._client)
        else:
            memory.note_room(self._client)

    @functools.cached_property
    def _client(self) -> Any:
        from croqq.delivery.redis_client import connect

        return connect(get_settings())


class QueueResetStep(bootsteps.StartStopStep):
    """On every broker (re)connection, mark this worker's queues reset: a message it had reserved when the
    connection dropped was lost with it (kombu keeps reservations in memory, :mod:`croqq.delivery.transport`),
    so housekeeping re-publishes the steps queued before now (duplicates are dropped at claim)."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c: Any) -> None:
        from croqq.delivery.redis_client import connect
        from croqq.placement import registry

        queues = [q.name for q in c.task_consumer.queues]
        try:
            registry.mark_queues_reset(connect(get_settings()), queues)
        except Exception as exc:  # never stop a worker from consuming over bookkeeping
            log.warning("could not mark queues %s reset: %s", queues, exc)


def make_app_with_steps(settings: Settings | None = None) -> Celery:
    celery = make_app(settings)
    celery.steps["consumer"].add(QueueResetStep)
    return celery


app = make_app_with_steps()
