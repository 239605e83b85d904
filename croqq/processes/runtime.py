"""One croqq process's context: settings, manifest, Redis, ledger, coordinator, and the role's parts
(backend, proposer, probe, writer), each created lazily, once per process (so after a prefork fork).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from croqq.delivery import keys
from croqq.delivery.leases import Heartbeat, StepLeases, owner_id
from croqq.delivery.ledger import Ledger, Publisher, StepRecord
from croqq.delivery.redis_client import connect, text
from croqq.domain.manifest import Manifest
from croqq.errors import ConfigError, RepoCorruptError
from croqq.placement.assign import Placement
from croqq.processes.publish import publish_steps
from croqq.settings import Settings, get_settings
from croqq.work import history, stats
from croqq.work.advance import Advance
from croqq.work.intake import Intake

if TYPE_CHECKING:
    from celery import Celery

    from croqq.backends._base import Backend, GpuContext
    from croqq.probes._base import GpuProbe
    from croqq.proposers._base import Proposer
    from croqq.store.integrity import RepoGuard
    from croqq.store.push import Pusher
    from croqq.store.writer import ResultsWriter

log = logging.getLogger(__name__)

ENV_GPU_UUID = "CROQQ_GPU_UUID"
ENV_GPU_INDEX = "CROQQ_GPU_INDEX"
ENV_GPU_TYPE = "CROQQ_GPU_TYPE"
ENV_GPU_OWNER = "CROQQ_GPU_OWNER"
REPO_ALARM = "repo_corrupt"
UNKNOWN = "?"  # a lease holder that cannot be read: never taken for a previous writer being gone


def celery_publisher(records: Sequence[StepRecord], pipe: Any, celery: Celery | None = None) -> None:
    """Add the steps' messages to ``pipe`` (this process's app unless another is given)."""
    if celery is None:
        from croqq.processes.app import app

        celery = app
    publish_steps(celery, pipe, records)


def publisher_for(settings: Settings) -> Publisher:
    """A publisher with its own app for ``settings`` (tools talking to a cluster other than the env's)."""
    from croqq.processes.app import make_app

    celery = make_app(settings)
    return lambda records, pipe: celery_publisher(records, pipe, celery)


@dataclass(frozen=True)
class GpuIdentity:
    uuid: str
    index: int
    gpu_type: str
    owner: str  # the GPU lease owner (the worker's main process)

    @classmethod
    def from_env(cls) -> GpuIdentity | None:
        uuid = os.environ.get(ENV_GPU_UUID)
        if not uuid:
            return None
        return cls(
            uuid=uuid,
            index=int(os.environ.get(ENV_GPU_INDEX, "0")),
            gpu_type=os.environ.get(ENV_GPU_TYPE, ""),
            owner=os.environ.get(ENV_GPU_OWNER, ""),
        )


class Runtime:
    """This process's parts, each made on first use (work sees it as :class:`croqq.work.context.Runtime`)."""

    def __init__(self, settings: Settings, publisher: Publisher | None = None) -> None:
        self.settings = settings
        self.owner = owner_id()
        self._publisher = publisher
        self.pusher: Pusher | None = None  # the results branch's background pusher (writer, with a remote)
        self._lazy = threading.Lock()
        self._step_leases: StepLeases | None = None

    @cached_property
    def manifest(self) -> Manifest:
        from croqq.backends import backend_manifest

        return backend_manifest(self.settings)  # with backend=replay: plus the replay dsl

    @cached_property
    def client(self) -> redis.Redis:
        return connect(self.settings)

    @cached_property
    def ledger(self) -> Ledger:
        refill = lambda uuid: self.placement.fill(uuid)  # noqa: E731,PLW0108 - placement needs the ledger first
        advance = Advance([stats.on_stored, history.on_stored], refill=refill)
        publisher = self._publisher or celery_publisher
        return Ledger(self.client, self.settings.lease_ttl_s, advance, publisher)

    @cached_property
    def placement(self) -> Placement:
        return Placement(self.settings, self.client, self.ledger)

    @cached_property
    def intake(self) -> Intake:
        return Intake(self.settings, self.manifest, self.client, self.ledger, self.placement)

    @cached_property
    def heartbeat(self) -> Heartbeat:
        name = f"croqq-heartbeat-{os.getpid()}"
        return Heartbeat(self.settings.lease_ttl_s / 4, name=name, client=self.client).start()

    @property
    def step_leases(self) -> StepLeases:
        """The leases of the steps this process runs (a property under a lock, not a cached one: the ideate
        pool's threads ask at once, and a second instance would leave the first one's steps unrenewed)."""
        with self._lazy:
            if self._step_leases is None:
                renew = lambda steps: self.ledger.heartbeat(steps, self.owner)  # noqa: E731
                self._step_leases = StepLeases(renew, self.heartbeat)
            return self._step_leases

    @cached_property
    def completer(self) -> Completer:
        return Completer()

    @cached_property
    def backend(self) -> Backend:
        from croqq.backends import make_backend
        from croqq.delivery.artifacts import ArtifactStore

        return make_backend(self.settings, self.manifest, ArtifactStore(self.settings, self.client))

    @cached_property
    def proposer(self) -> Proposer:
        from croqq.proposers import make_proposer

        return make_proposer(self.settings, self.manifest)

    @cached_property
    def probe(self) -> GpuProbe:
        from croqq.probes import make_probe

        return make_probe(self.settings, self.client)

    @cached_property
    def gpu_identity(self) -> GpuIdentity:
        ident = GpuIdentity.from_env()
        if ident is None:
            raise ConfigError(
                f"this process serves no GPU ({ENV_GPU_UUID} is unset); start it with `croqq worker`"
            )
        return ident

    @cached_property
    def gpu(self) -> GpuContext:
        from croqq.backends._base import GpuContext

        ident = self.gpu_identity
        return GpuContext(uuid=ident.uuid, index=ident.index, gpu_type=ident.gpu_type, probe=self.probe)

    @cached_property
    def repo_guard(self) -> RepoGuard:
        """The results repo's integrity verdict (the writer's): damage raises the alarm ``repo_corrupt``,
        repair clears it (and the open repo forgets the files it knew)."""
        from croqq.store.integrity import RepoCheck, RepoGuard
        from croqq.work import alarms

        def changed(problem: str | None) -> None:
            try:
                if problem is not None:
                    alarms.raise_alarm(self.client, REPO_ALARM, problem)
                else:
                    alarms.clear_alarm(self.client, REPO_ALARM)
            except redis.RedisError as exc:  # the verdict stands whatever Redis can record of it
                log.warning("could not record the results repo's state in Redis: %s", exc)
            if problem is None and "writer" in vars(self):
                self.writer.repo.reopen()

        check = RepoCheck(Path(self.settings.results_repo), self.settings.results_branch)
        return RepoGuard(check, changed, recheck_s=min(10.0, self.settings.repo_check_every_s))

    @cached_property
    def writer(self) -> ResultsWriter:
        """The results writer; raises RepoCorruptError (and is not kept) while the repo is damaged, and
        DiskFullError while its disk is full."""
        from croqq import diskspace
        from croqq.store.gitrepo import GitRepo
        from croqq.store.writer import ResultsWriter

        s = self.settings
        self.repo_guard.require()
        holder = self._writer_lease_holder()  # this process holds the lease: a previous writer is gone
        try:
            with diskspace.guard(Path(s.results_repo), "the results repo", s.disk_retry_s):
                repo = GitRepo(
                    Path(s.results_repo),
                    s.results_branch,
                    s.sync_worktree,
                    fsync=s.git_fsync,
                    owner=holder if holder not in (None, UNKNOWN) else self.owner,
                    previous_gone=lambda previous: holder not in (previous, UNKNOWN),
                    reserve_bytes=s.disk_reserve_bytes,
                    retry_s=s.disk_retry_s,
                )
        except RepoCorruptError as exc:  # damage the check did not see (it reads less than git does)
            self.repo_guard.found(str(exc))
            raise
        if s.test_barriers:
            from croqq.work.barriers import wait_barrier

            repo.before_ref_move = lambda: wait_barrier(self.client, True, "store:commit")
        if s.results_remote:
            from croqq.store.push import Pusher

            remote = s.results_remote
            self.pusher = Pusher(lambda: repo.push(remote), s.push_every_s, remote).start()
            repo.after_commit = self.pusher.poke
            self.pusher.poke()  # commits made before a restart
        repo.on_damage = self.repo_guard.found
        writer = ResultsWriter(repo)
        writer.guard = self.repo_guard
        writer.on_commit = lambda seconds: stats.record_commit(self.client, seconds)  # commit latency
        return writer

    def send_task(self, name: str, queue: str, max_age_s: float, args: list[Any] | None = None) -> None:
        """Send a task message through this process's Celery app, useless once older than ``max_age_s``."""
        from croqq.processes.app import app, max_age

        app.send_task(name, args=args, queue=queue, **max_age(max_age_s))

    def _writer_lease_holder(self) -> str | None:
        """The writer lease's owner token (this process's, in the writer), None when nobody holds it,
        UNKNOWN when Redis cannot tell."""
        try:
            return text(self.client.get(keys.lease("writer")))
        except redis.RedisError as exc:
            log.warning("cannot read the writer lease: %s", exc)
            return UNKNOWN


class Completer:
    """One background thread that runs submitted callables in order (recording GPU steps' results)."""

    def __init__(self, depth: int = 8) -> None:
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="croqq-completer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object]) -> None:
        self._queue.put(fn)  # blocks when results pile up: never outrun the ledger by much

    def drain(self, timeout_s: float = 30.0) -> None:
        """Finish what was submitted (called at worker shutdown)."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (fn := self._queue.get()) is not None:
            try:
                fn()
            except Exception:
                log.exception("recording a step result failed; its lease will expire and re-dispatch it")


_RUNTIMES: dict[int, Runtime] = {}


def get_runtime() -> Runtime:
    """The runtime of this process (a fresh one after fork)."""
    pid = os.getpid()
    rt = _RUNTIMES.get(pid)
    if rt is None:
        rt = _RUNTIMES[pid] = Runtime(get_settings())
    return rt


def drain_completer() -> None:
    """At process shutdown: record the results still waiting in the completer."""
    rt = _RUNTIMES.get(os.getpid())
    if rt is not None and "completer" in vars(rt):
        rt.completer.drain()
