"""Celery task definitions: thin wrappers that validate the payload and call into croqq's modules."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_process_init, worker_process_shutdown, worker_shutdown

from croqq.delivery import queues
from croqq.delivery.messages import FillMessage, SubmitMessage, parse
from croqq.errors import InvalidRecordError
from croqq.processes.app import app
from croqq.processes.runtime import drain_completer, get_runtime
from croqq.settings import get_settings
from croqq.work import housekeeping
from croqq.work.steps import run_step

log = logging.getLogger(__name__)


@worker_process_init.connect
def _reclaim(**_: Any) -> None:
    """A new pool child (its predecessor may have been killed mid-step): re-queue dead processes' steps."""
    try:
        get_runtime().ledger.reclaim_dead_local()
    except Exception as exc:  # bookkeeping must never keep a child from starting
        log.warning("could not reclaim steps of dead processes: %s", exc)


@worker_process_shutdown.connect
def _drain(**_: Any) -> None:
    drain_completer()


@worker_shutdown.connect
def _drain_main(**_: Any) -> None:
    drain_completer()  # solo/threads pools run tasks in the main process


@app.task(name=queues.TASK_GPU)
def gpu_step(payload: Any) -> str:
    return run_step(get_runtime(), payload, queues.TASK_GPU)


@app.task(name=queues.TASK_BUILD)
def build_step(payload: Any) -> str:
    return run_step(get_runtime(), payload, queues.TASK_BUILD)


@app.task(name=queues.TASK_IDEATE, rate_limit=get_settings().ideate_rate_limit or None)
def ideate_step(payload: Any) -> str:
    return run_step(get_runtime(), payload, queues.TASK_IDEATE)


@app.task(name=queues.TASK_STORE)
def store_step(payload: Any) -> str:
    return run_step(get_runtime(), payload, queues.TASK_STORE)


@app.task(name=queues.TASK_SUBMIT)
def submit(payload: Any) -> int:
    try:
        msg = parse(SubmitMessage, payload)
    except InvalidRecordError as exc:
        log.error("rejected message: %s", exc)
        return 0
    return len(get_runtime().intake.submit(msg).sids)


@app.task(name=queues.TASK_FILL)
def fill(payload: Any) -> int:
    try:
        msg = parse(FillMessage, payload or {})
    except InvalidRecordError as exc:
        log.error("rejected message: %s", exc)
        return 0
    coord = get_runtime().placement
    return coord.fill(msg.gpu_uuid) if msg.gpu_uuid else coord.fill_all()


@app.task(name=queues.TASK_RECONCILE)
def reconcile() -> dict[str, int]:
    return housekeeping.reconcile(get_runtime())


@app.task(name=queues.TASK_SUMMARY)
def summary() -> int:
    """Refresh every run's compaction-summary.md (the writer's queue, so only the writer writes)."""
    from croqq.store.load import list_runs

    writer = get_runtime().writer
    runs = list_runs(writer.repo)
    return sum(1 for gpu, dsl in runs if writer.refresh_summary(gpu, dsl))


@app.task(name=queues.TASK_FLUSH)
def flush() -> bool:
    """Bring the results repo's index up to date and wake the background pusher (never waits for a push:
    see croqq.store.push). True when a remote is set."""
    rt = get_runtime()
    rt.writer.repo.sync_index()
    if rt.pusher is None:
        return False
    rt.pusher.poke()
    return True


@app.task(name=queues.TASK_RECORD)
def record_submissions() -> int:
    """Commit the submissions the results repo does not hold yet (the writer's queue)."""
    from croqq.work.intake import record_submissions as record

    rt = get_runtime()
    return record(rt.client, rt.writer)


@app.task(name=queues.TASK_GPU_RECHECK)
def gpu_recheck(payload: Any) -> bool:
    """Health sweep for a quarantined GPU: back in service when its cool-down is over and the probe finds it
    healthy."""
    rt = get_runtime()
    uuid = rt.gpu.uuid
    if not isinstance(payload, dict) or payload.get("gpu_uuid") != uuid:
        log.error("rejected message: recheck payload %r is not for GPU %s", payload, uuid)
        return False
    return housekeeping.recheck_gpu(rt, uuid)
