"""Celery task definitions: thin wrappers that validate the payload and call into croqq's modules."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery.signals import worker_process_init, worker_process_shutdown, worker_shutdown

from croqq.delivery import memory, queues
from croqq.delivery.messages import FillMessage, SubmitMessage, parse
from croqq.errors import DiskFullError, InvalidRecordError, RepoCorruptError
from croqq.processes.app import app, too_old
from croqq.processes.runtime import drain_completer, get_runtime
from croqq.settings import get_settings
from croqq.work import housekeeping, stats
from croqq.work.steps import StepOutcome, run_step

log = logging.getLogger(__name__)
REPO_BYTES_EVERY_S = 30.0  # walking .git is cheap but not free: the exporter's figure lags by at most this
T = TypeVar("T")


def paused_while_full(fn: Callable[..., T]) -> Callable[..., T]:
    """A task that meets a full Redis waits until it has room and runs again (a periodic one may then find
    itself too old and skip). It does not end meanwhile: Celery's ack is a Redis transaction too, and a
    worker whose ack is refused stops."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not memory.is_full_error(exc):
                    raise
                memory.wait_for_room(get_runtime().client)

    return run


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
@paused_while_full
def gpu_step(payload: Any) -> StepOutcome:
    return run_step(get_runtime(), payload, queues.TASK_GPU)


@app.task(name=queues.TASK_BUILD)
@paused_while_full
def build_step(payload: Any) -> StepOutcome:
    return run_step(get_runtime(), payload, queues.TASK_BUILD)


@app.task(name=queues.TASK_IDEATE, rate_limit=get_settings().ideate_rate_limit or None)
@paused_while_full
def ideate_step(payload: Any) -> StepOutcome:
    return run_step(get_runtime(), payload, queues.TASK_IDEATE)


@app.task(name=queues.TASK_STORE)
@paused_while_full
def store_step(payload: Any) -> StepOutcome:
    return run_step(get_runtime(), payload, queues.TASK_STORE)


@app.task(name=queues.TASK_SUBMIT)
@paused_while_full
def submit(payload: Any) -> int:
    try:
        msg = parse(SubmitMessage, payload)
    except InvalidRecordError as exc:
        log.error("rejected message: %s", exc)
        return 0
    return len(get_runtime().intake.submit(msg).sids)


@app.task(name=queues.TASK_FILL)
@paused_while_full
def fill(payload: Any) -> int:
    try:
        msg = parse(FillMessage, payload or {})
    except InvalidRecordError as exc:
        log.error("rejected message: %s", exc)
        return 0
    coord = get_runtime().placement
    return coord.fill(msg.gpu_uuid) if msg.gpu_uuid else coord.fill_all()


def _skip_old(task: Any) -> bool:
    """A periodic or best-effort message past its maximum age (Redis's clock): skip it."""
    if too_old(task.request, get_runtime().client):
        log.info("skipping %s: older than its maximum age", task.name)
        return True
    return False


@app.task(name=queues.TASK_RECONCILE, bind=True)
@paused_while_full
def reconcile(self: Any) -> dict[str, int]:
    return {} if _skip_old(self) else housekeeping.reconcile(get_runtime())


def _repo_damaged(task: Any) -> bool:
    """The results repo is damaged (the alarm is up): the writer's periodic tasks wait for the repair."""
    try:
        get_runtime().repo_guard.require()
    except RepoCorruptError as exc:
        log.debug("%s waits: %s", task.name, exc)  # the alarm (ERROR, once) says why; not every tick
        return True
    return False


@app.task(name=queues.TASK_GIT_RECONCILE, bind=True)
@paused_while_full
def git_reconcile(self: Any) -> dict[str, int]:
    """Reconcile live state against the results repo (the writer's queue: only the writer reads it); not
    while the repo is damaged (its repair may move the branch back: reconcile then)."""
    from croqq.work.reconcile import reconcile as with_git

    return {} if _skip_old(self) or _repo_damaged(self) else with_git(get_runtime())


@app.task(name=queues.TASK_SUMMARY, bind=True)
@paused_while_full
def summary(self: Any) -> int:
    """Refresh every run's compaction-summary.md (the writer's queue, so only the writer writes)."""
    from croqq.store.load import list_runs

    if _skip_old(self) or _repo_damaged(self):
        return 0
    try:
        writer = get_runtime().writer
        runs = list_runs(writer.repo)
        return sum(1 for gpu, dsl in runs if writer.refresh_summary(gpu, dsl))
    except DiskFullError as exc:  # the STOREs raise the alarm; the next refresh catches up
        log.warning("summary not refreshed: %s", exc)
        return 0


@app.task(name=queues.TASK_FLUSH, bind=True)
@paused_while_full
def flush(self: Any) -> bool:
    """Check the results repo (every ``repo_check_every_s``), bring its index up to date, publish the
    repo's size (croqq_results_repo_bytes; at most every REPO_BYTES_EVERY_S) and wake the background
    pusher (never waits for a push: see croqq.store.push). True when a remote is set."""
    if _skip_old(self):
        return False
    rt = get_runtime()
    if housekeeping.every(rt, "repo_check", rt.settings.repo_check_every_s):
        rt.repo_guard.check()
    if _repo_damaged(self):
        return False
    rt.writer.repo.sync_index()
    if housekeeping.every(rt, "repo_bytes", REPO_BYTES_EVERY_S):
        stats.record_repo_bytes(rt.client, rt.writer.repo.size_bytes())
    if rt.pusher is None:
        return False
    rt.pusher.poke()
    return True


@app.task(name=queues.TASK_RECORD, bind=True)
@paused_while_full
def record_submissions(self: Any) -> int:
    """Commit the submissions the results repo does not hold yet (the writer's queue)."""
    from croqq.work.intake import record_submissions as record

    if _skip_old(self) or _repo_damaged(self):
        return 0
    rt = get_runtime()
    try:
        return record(rt.client, rt.writer)
    except DiskFullError as exc:  # recorded by the next call (submissions stay in Redis meanwhile)
        log.warning("submissions not recorded yet: %s", exc)
        return 0


@app.task(name=queues.TASK_GPU_RECHECK, bind=True)
@paused_while_full
def gpu_recheck(self: Any, payload: Any) -> bool:
    """Health sweep for a quarantined GPU: back in service when its cool-down is over and the probe finds it
    healthy."""
    if _skip_old(self):
        return False
    rt = get_runtime()
    uuid = rt.gpu.uuid
    if not isinstance(payload, dict) or payload.get("gpu_uuid") != uuid:
        log.error("rejected message: recheck payload %r is not for GPU %s", payload, uuid)
        return False
    return housekeeping.recheck_gpu(rt, uuid)
