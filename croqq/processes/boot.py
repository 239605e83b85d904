"""Starting croqq processes: take the leases a role needs, then run its Celery worker (or beat) in this
process, so the lease holder is the process that does the work; release everything on the way out.

Roles and how they run:

    coordinator   -Q control                 solo pool       (stateless, any number)
    build         -Q build                   prefork, N      (nvcc is CPU bound)
    ideate        -Q ideate                  threads, N      (waits on an agent; rate-limited task)
    writer        -Q store                   solo pool       (singleton lease "writer")
    gpu           -Q gpu.<uuid>              prefork -c 1    (GPU lease "gpu:<uuid>", one process per GPU)
    beat          celery beat                                (singleton lease "beat")
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import redis

from croqq.delivery import keys, memory, queues
from croqq.delivery.leases import Heartbeat, Lease, owner_id
from croqq.delivery.redis_client import connect
from croqq.placement import registry
from croqq.processes import health, naming
from croqq.processes.runtime import ENV_GPU_OWNER
from croqq.processes.supervise import EXIT_CONFIG
from croqq.settings import Settings, get_settings
from croqq.work import hosts

if TYPE_CHECKING:
    from croqq.placement.assign import Placement

log = logging.getLogger(__name__)


# A GPU queue has exactly one consumer, so reserving the next step while the current one runs takes work
# from no one; it hands the GPU its next step without a broker round trip. Elsewhere prefetch stays 1.
# A reserved message lost with its worker is re-published (the queue's consumer restarted).
GPU_PREFETCH = 2


def host_name() -> str:
    """This host's name as used in queue names (letters, digits and '-')."""
    raw = socket.gethostname().split(".")[0]
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw) or "host"


def celery_argv(
    queues: Sequence[str], node_name: str, pool: str, concurrency: int, loglevel: str, prefetch: int = 1
) -> list[str]:
    """A worker's Celery arguments; ``node_name`` is the whole ``name@host`` (see :mod:`naming`)."""
    return [
        "worker",
        "-Q",
        ",".join(queues),
        "-n",
        node_name,
        "-P",
        pool,
        "-c",
        str(concurrency),
        "--loglevel",
        loglevel,
        "--without-gossip",
        "--without-mingle",
        "--prefetch-multiplier",
        str(prefetch),
        # Flower lists a worker from its event heartbeats (every 2 s), so they go with the task events
        *([] if get_settings().task_events else ["--without-heartbeat"]),
    ]


def run_celery_worker(
    settings: Settings,
    role: str,
    queues: Sequence[str],
    pool: str,
    concurrency: int,
    loglevel: str = "INFO",
    singleton: str | None = None,
    extra_beats: Callable[[Heartbeat], None] | None = None,
    on_exit: Callable[[], None] | None = None,
    on_start: Callable[[], None] | None = None,
    prefetch: int = 1,
    node: str | None = None,
) -> None:
    """Run one Celery worker in this process, registered and heart-beating, holding ``singleton``. Its
    node name is ``node@host`` when given (a GPU worker's), else the first free ``role[-N]@host``."""
    from croqq.processes.app import app

    client = connect(settings)
    memory.at_start(client)
    owner = owner_id(role)
    lease = None
    if singleton:
        lease = Lease(client, singleton, owner, settings.lease_ttl_s)
        lease.acquire(wait_s=1.5 * settings.lease_ttl_s, what=f"the {role} lock")
    name_lease = None
    if node is None:
        node_name, name_lease = naming.claim_node(client, role, host_name(), owner, settings.lease_ttl_s)
    else:
        node_name = f"{node}@{host_name()}"
    os.environ[hosts.ENV_WORKER], os.environ[hosts.ENV_ROLE] = node_name, role  # for the pool children
    hosts.clear_stopped(client, role, host_name())
    registry.register_worker(client, node_name, list(queues), role)
    from croqq.processes.runtime import get_runtime

    reclaimed = get_runtime().ledger.reclaim_dead_local()
    if reclaimed:
        log.warning("re-queued %d step(s) left running by dead processes of this host", reclaimed)
    hb = Heartbeat(settings.lease_ttl_s / 4, name=f"croqq-{role}-heartbeat", client=client)
    refused = threading.Event()
    hb.add("worker", lambda: _beat_worker(client, node_name, queues, role))
    hb.add("host", lambda: _stop_if_refused(client, node_name, refused))
    if lease is not None:
        hb.add("lease", lambda: _renew_or_die(lease, role))
    if name_lease is not None:
        hb.add("name", lambda: naming.keep_node(name_lease))
    if extra_beats is not None:
        extra_beats(hb)
    hb.add("health", health.reporter(settings, role, node_name))
    hb.start()
    if on_start is not None:
        on_start()
    try:
        app.worker_main(celery_argv(queues, node_name, pool, concurrency, loglevel, prefetch))
    finally:
        if on_exit is not None:
            on_exit()
        hb.stop()
        _forget_worker(client, node_name, queues)
        if name_lease is not None:
            name_lease.release()
        if lease is not None:
            lease.release()
        if refused.is_set():  # not restarted by supervisors: the host must be fixed first
            raise SystemExit(EXIT_CONFIG)


def _forget_worker(client: redis.Redis, node: str, queues: Sequence[str]) -> None:
    """The consumer has stopped: unregister, and mark its queue reset. A message that Redis handed over
    while the worker shut down is dropped by Celery (a BRPOP answer left unread), so
    housekeeping re-publishes the steps queued before now; a duplicate is dropped at claim."""
    try:
        registry.unregister_worker(client, node)
        registry.mark_queues_reset(client, list(queues))
    except redis.RedisError as exc:  # Redis away: the registry's TTL forgets the worker, reaping marks it
        log.warning("could not unregister %s: %s", node, exc)


def _stop_if_refused(client: redis.Redis, label: str, refused: threading.Event) -> None:
    """A step found this host unable to do its work: shut down warm (running steps finish) and exit."""
    problem = hosts.problem(client, label)
    if problem is None or refused.is_set():
        return
    refused.set()
    log.critical(
        "%s stops taking work: %s; fix this host, then start the worker again", label, problem.reason
    )
    os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown


def _beat_worker(client: redis.Redis, node: str, queues: Sequence[str], role: str) -> None:
    """Beat into the worker registry; a Redis that forgot this worker (flushed, restored from an older
    snapshot) also forgot its queue's binding: declare it again, and have housekeeping re-publish the
    steps queued meanwhile."""
    if client.exists(keys.worker(node)):
        registry.beat_worker(client, node)
        return
    from croqq.processes.app import declare_queue

    log.warning(  # it restarted or was flushed, or was full for longer than the registry's TTL
        "Redis no longer knows worker %s: declaring queue(s) %s again", node, ",".join(queues)
    )
    for queue in queues:
        declare_queue(queue)
    registry.register_worker(client, node, list(queues), role)
    registry.mark_queues_reset(client, list(queues))


def _renew_or_die(lease: Lease, role: str) -> None:
    """A singleton that lost its lease (paused past the TTL, Redis flushed) must stop, not carry on twice."""
    if lease.renew() or lease.try_acquire():
        return
    log.critical("the %s lost its lock to %s; exiting", role, lease.client.get(lease.key))
    os._exit(3)


def run_gpu_worker(settings: Settings, uuid: str, index: int, gpu_type: str, loglevel: str = "INFO") -> None:
    """One GPU's worker: claim the GPU (lease, start health check, registry), then consume its queue.

    A GPU that failed its start check, or whose quarantine is stored, gets no shapes but its worker still
    runs, so that the re-checks of housekeeping reach it."""
    from croqq.processes.runtime import get_runtime

    lease, entry = claim_gpu(settings, uuid, index, gpu_type, get_runtime().placement)
    os.environ[ENV_GPU_OWNER] = entry.owner
    client = lease.client

    def gpu_beat(hb: Heartbeat) -> None:
        hb.add("gpu-lease", lambda: _renew_gpu(client, lease, entry))

    try:
        run_celery_worker(
            settings,
            "gpu",
            [entry.queue],
            "prefork",
            1,
            loglevel,
            extra_beats=gpu_beat,
            prefetch=GPU_PREFETCH,
            node=naming.gpu_node(index, uuid),
        )
    finally:
        lease.release()


def claim_gpu(
    settings: Settings, uuid: str, index: int, gpu_type: str, placement: Placement
) -> tuple[Lease, registry.GpuEntry]:
    """Take the GPU's lease, check its health in a spawned process (never NVML in this one), register it
    (a stored quarantine stays) and fill it if healthy. Returns the lease and the registered entry."""
    from croqq.processes.startcheck import start_problems

    client = connect(settings)
    memory.at_start(client)
    owner = owner_id("gpu")
    lease = Lease(client, f"gpu:{uuid}", owner, settings.lease_ttl_s, in_memory=True)  # owner: the entry's
    lease.acquire(wait_s=1.5 * settings.lease_ttl_s, what=f"GPU {uuid}")
    problems = start_problems(settings, uuid)
    entry = registry.GpuEntry(
        uuid=uuid,
        host=host_name(),
        index=index,
        gpu_type=gpu_type,
        queue=queues.gpu_queue(uuid),
        owner=owner,
        status=registry.QUARANTINED if problems else registry.HEALTHY,
        reason=f"failed its health check at start: {'; '.join(problems)}" if problems else "",
    )
    placed = placement.admit(entry)
    _remember_status(client, entry)
    log.info(
        "claimed GPU %s (%s) as %s; queue %s; %s, %d shape(s) placed",
        uuid,
        gpu_type,
        owner,
        entry.queue,
        entry.status,
        placed,
    )
    return lease, entry


def _remember_status(client: redis.Redis, entry: registry.GpuEntry) -> None:
    """Keep ``entry`` in step with the registry's status, so that a re-registration after Redis forgot the
    GPU does not undo a quarantine this worker knew of."""
    stored = registry.get_gpu(client, entry.uuid)
    if stored is not None and stored.status in (registry.HEALTHY, registry.QUARANTINED):
        entry.status, entry.reason, entry.quarantined_at = stored.status, stored.reason, stored.quarantined_at


def _renew_gpu(client: redis.Redis, lease: Lease, entry: registry.GpuEntry) -> None:
    """Keep the GPU claimed; re-register it if Redis lost its registry (cold start), with the status it
    had when this worker last looked (a quarantine stays a quarantine)."""
    if not lease.renew() and not lease.try_acquire():
        log.error(
            "GPU %s lease is held by %s; this worker no longer measures on it",
            entry.uuid,
            lease.client.get(lease.key),
        )
        return
    if registry.is_registered(client, entry.uuid):
        _remember_status(client, entry)
        return
    log.warning("Redis no longer knows GPU %s: registering it again (%s)", entry.uuid, entry.status)
    registry.register_gpu(client, entry)  # Redis forgot (a flush, an old snapshot)


def run_beat(settings: Settings, loglevel: str = "INFO") -> None:
    """The single beat: hold the "beat" lease, then tick the housekeeping schedule."""
    from celery.apps.beat import Beat

    from croqq.processes.app import app

    client = connect(settings)
    memory.at_start(client)
    lease = Lease(client, "beat", owner_id("beat"), settings.lease_ttl_s)
    lease.acquire(wait_s=1.5 * settings.lease_ttl_s, what="the beat lock")
    hb = Heartbeat(settings.lease_ttl_s / 4, name="croqq-beat-heartbeat", client=client)
    hb.add("lease", lambda: _renew_or_die(lease, "beat"))
    hb.add("health", health.reporter(settings, "beat", f"beat@{host_name()}"))
    hb.start()
    try:
        Beat(
            app=app,
            scheduler="croqq.processes.app:PausingScheduler",
            max_interval=max(1, int(settings.reconcile_every_s)),
            loglevel=loglevel,
            redirect_stdouts=False,
            quiet=True,
        ).run()
    finally:
        hb.stop()
        lease.release()
