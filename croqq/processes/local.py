"""A whole cluster on this machine: embedded Redis (unless a broker is configured), coordinator, writer,
beat, build and ideate workers and one worker per GPU, each a real supervised process.

Used by `croqq up`, `croqq stress`, the benchmarks and the integration tests; everything about the
cluster comes from ``env`` (CROQQ_* variables), so several clusters can run side by side (one per run
folder: a cluster holds its run folder's lock and keeps ``supervisor.json`` there, so a second one on the
same folder refuses, and one that finds the leftovers of a killed supervisor stops them first).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable

from croqq.domain.manifest import DEFAULT_MODE
from croqq.errors import ConfigError
from croqq.patience import Deadline
from croqq.processes import record
from croqq.processes.redis_server import RedisServer
from croqq.processes.supervise import Child, Supervisor
from croqq.settings import Settings
from croqq.work.progress import Snapshot, snapshot, submission_sids

log = logging.getLogger(__name__)
REDIS = "redis"  # the embedded Redis's name among the supervisor's children
ROLES: dict[str, list[str]] = {
    "coordinator": ["coordinator"],
    "writer": ["writer"],
    "beat": ["beat"],
    "build": ["build-worker"],
    "ideate": ["ideate-worker"],
}


def settings_from(env: dict[str, str]) -> Settings:
    """Settings from this process's CROQQ_* variables overlaid with ``env``."""
    merged = {k: v for k, v in os.environ.items() if k.startswith("CROQQ_")} | env
    return Settings(**{k[len("CROQQ_") :].lower(): v for k, v in merged.items()})  # type: ignore[arg-type]


def gpu_children(
    gpus: str, settings: Settings, log_level: str, env: dict[str, str] | None = None
) -> list[Child]:
    """One supervised `croqq gpu-worker` child per selected GPU, each with its own CUDA environment."""
    from croqq.probes import make_probe
    from croqq.processes.runtime import ENV_GPU_INDEX, ENV_GPU_TYPE, ENV_GPU_UUID

    probe = make_probe(settings)
    found = probe.discover()
    probe.close()
    if gpus != "all":
        try:
            wanted = {int(x) for x in gpus.split(",") if x.strip()}
        except ValueError as exc:
            raise ConfigError(f"--gpus {gpus!r}: use 'all' or GPU indexes like 0,1,3") from exc
        unknown = sorted(wanted - {g.index for g in found})
        if unknown:
            raise ConfigError(f"--gpus: no GPU with index {unknown} on this host (found {len(found)})")
        found = [g for g in found if g.index in wanted]
    children = []
    for g in found:
        gpu_env = {
            "CUDA_VISIBLE_DEVICES": g.uuid,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            ENV_GPU_UUID: g.uuid,
            ENV_GPU_INDEX: str(g.index),
            ENV_GPU_TYPE: g.gpu_type,
        }
        argv = [
            sys.executable,
            "-m",
            "croqq",
            "gpu-worker",
            "--uuid",
            g.uuid,
            "--index",
            str(g.index),
            "--type",
            g.gpu_type,
            "--log-level",
            log_level,
        ]
        logfile = settings.run_dir / "logs" / f"gpu{g.index}.log"
        children.append(Child(f"gpu{g.index}", argv, {**(env or {}), **gpu_env}, logfile))
    return children


class LocalCluster:
    def __init__(
        self, env: dict[str, str], log_level: str = "INFO", roles: dict[str, list[str]] | None = None
    ) -> None:
        self.env = dict(env)
        self.log_level = log_level
        self.roles = ROLES if roles is None else roles
        self.settings = settings_from(self.env)
        self.redis: RedisServer | None = None
        self.supervisor: Supervisor | None = None
        self.claim: record.Claim | None = None
        self.gpu_names: list[str] = []

    # -- lifecycle -------------------------------------------------------------------------------------

    def claim_run_dir(self) -> None:
        """Take the run folder (refused while another live cluster holds it) and stop what a dead
        supervisor left running there."""
        self.claim = record.claim(self.settings.run_dir.resolve())
        note = self.claim.note()
        if note:
            log.warning("%s", note)

    def start_redis(self) -> None:
        """The embedded Redis, as the supervisor's first child (unless a broker URL is configured)."""
        if self.settings.broker_url:
            return
        from croqq.delivery.redis_client import require_redis

        try:
            require_redis(self.settings, timeout_s=1.0)
        except ConfigError:
            pass
        else:
            raise ConfigError(f"a croqq cluster already runs in {self.settings.run_dir}; stop it first")
        assert self.supervisor is not None
        self.redis = RedisServer(self.settings.run_dir.resolve() / "redis")
        child = self.redis.child(REDIS)
        self.supervisor.add(child)
        self.supervisor.start(child)
        self.env["CROQQ_BROKER_URL"] = self.redis.url
        self.settings = settings_from(self.env)

    def children(self) -> list[Child]:
        logs = self.settings.run_dir / "logs"
        level = ["--log-level", self.log_level]
        roles = [
            Child(name, [sys.executable, "-m", "croqq", *argv, *level], self.env, logs / f"{name}.log")
            for name, argv in self.roles.items()
        ]
        gpus = gpu_children("all", self.settings, self.log_level, self.env)
        self.gpu_names = [g.name for g in gpus]
        return roles + gpus

    def start(self) -> LocalCluster:
        """Claim the run folder, start Redis and wait until it answers, then every other child; from
        then on the supervisor's thread restarts whatever dies (Redis included)."""
        self.claim_run_dir()
        try:
            self.supervisor = Supervisor([], record=self.settings.run_dir.resolve() / record.RECORD_NAME)
            self.start_redis()
            for child in self.children():
                self.supervisor.add(child)
                self.supervisor.start(child)
            self.supervisor.watch()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- talking to it ---------------------------------------------------------------------------------

    @property
    def client(self):  # type: ignore[no-untyped-def]
        from croqq.delivery.redis_client import connect

        return connect(self.settings)

    def runtime(self):  # type: ignore[no-untyped-def]
        from croqq.processes.runtime import Runtime, publisher_for

        return Runtime(self.settings, publisher=publisher_for(self.settings))

    def wait_gpus(self, count: int | None = None, timeout_s: float = 60.0) -> None:
        from croqq.delivery import keys
        from croqq.placement import registry

        want = len(self.gpu_names) if count is None else count
        deadline = Deadline(timeout_s)
        while not deadline.expired():
            live = [
                g for g in registry.all_gpus(self.client) if self.client.exists(keys.lease(f"gpu:{g.uuid}"))
            ]
            if len(live) >= want:
                return
            self.poll()
            time.sleep(0.2)
        raise ConfigError(
            f"only some of the {want} GPU workers registered within {deadline.waited_s:.0f}s; see the logs"
        )

    def submit(
        self,
        dtype: str,
        shape: str | None = None,
        max_iter: int | None = None,
        mode: str = DEFAULT_MODE,
        gpu_type: str | None = None,
        limit: int | None = None,
        dsl: str | None = None,
        candidates: int | None = None,
    ) -> str:
        """Register a submission (in-process coordinator; ``limit``: the first N shapes; ``candidates``
        per iteration, default the setting); return its id."""
        from croqq.backends import make_backend
        from croqq.delivery.messages import SubmitMessage
        from croqq.domain.manifest import load_manifest
        from croqq.domain.schedule import build_schedule
        from croqq.domain.shapes import parse_dims
        from croqq.placement import registry
        from croqq.work import intake

        manifest = load_manifest(self.settings.manifest)
        dsl = manifest.family(dsl or self.settings.dsl, mode)
        make_backend(self.settings, manifest).check_dsl(dsl)
        schedule = build_schedule(manifest, dtype, only=parse_dims(shape) if shape else None)[:limit]
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        msg = SubmitMessage(
            submission=f"sub-{stamp}-{secrets.token_hex(3)}",
            gpu_type=registry.pick_gpu_type(self.settings, manifest, gpu_type),
            dsl=dsl,
            mode=mode,
            max_iter=max_iter or manifest.mode(mode).max_iter,
            candidates=candidates or self.settings.candidates,
            shapes=schedule,
        )
        self.runtime().intake.submit(msg)
        if not intake.wait_recorded(self.client, msg.submission):  # as `croqq submit` does: then durable
            log.warning("the writer has not recorded %s within %.0fs", msg.submission, intake.RECORD_WAIT_S)
        return msg.submission

    def snapshot(self, submission: str | None = None) -> Snapshot:
        return snapshot(self.client, submission_sids(self.client, submission) if submission else None)

    def poll(self) -> list[str]:
        """The children restarted since the last call (the supervisor's thread restarts them)."""
        return self.supervisor.take_restarted() if self.supervisor is not None else []

    def wait_done(
        self,
        submission: str,
        timeout_s: float,
        on_tick: Callable[[Snapshot], None] | None = None,
        every_s: float = 0.5,
    ) -> Snapshot:
        """Wait until the submission is finished (the supervisor restarts what dies); ConfigError if late
        (``timeout_s`` stretches with the machine's load: :mod:`croqq.patience`)."""
        deadline = Deadline(timeout_s)
        while True:
            snap = self.snapshot(submission)
            if on_tick is not None:
                on_tick(snap)
            if snap.finished:
                return snap
            if deadline.expired():
                raise ConfigError(
                    f"submission {submission} not finished after {deadline.waited_s:.0f}s: {snap.total}"
                )
            self.poll()
            time.sleep(every_s)
