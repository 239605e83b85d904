"""A croqq fleet on the multi-host bed: Redis, the writer, a build host and GPU hosts, nothing shared.

Layout (:class:`Fleet`): host ``redis`` runs a password-protected Redis on TCP (nothing else); host
``writer`` runs ``croqq writer`` with the results repo in its own folder (the only copy); host ``build``
runs the coordinator, beat, a build worker and an ideate worker, and is where ``croqq submit`` is typed;
hosts ``gpu1`` and ``gpu2`` each run ``croqq worker --gpus all`` with two simulated GPUs whose UUIDs name
the machine (``CROQQ_SIM_MACHINE``), not the hostname. Every host sees only its own folder; they talk
through Redis over the bed's network. Each service runs under a restart loop, as a container's restart
policy would run it.

The tests in ``tests/multihost`` and ``python -m benchmarks --only hosts`` use it: faults are injected
on the bed (:mod:`tests.hostbed.bed`) by :mod:`tests.hostbed.faults`, which measures the time from a
fault to the next stored iteration of an affected shape.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from croqq.chaos.invariants import iteration_commits, repo_problems
from croqq.delivery import keys
from croqq.delivery.ledger import StepStatus
from croqq.delivery.queues import GPU_KINDS
from croqq.delivery.redis_client import strs
from croqq.delivery.state import ShapeState
from croqq.errors import ConfigError
from croqq.patience import Deadline
from croqq.placement import registry
from croqq.settings import PROJECT_ROOT
from croqq.work.progress import Snapshot, snapshot, submission_sids
from tests.hostbed.bed import Bed, Host, HostProcess

GPU_HOSTS = ("gpu1", "gpu2")
GPU_SERVICES = [["worker", "--gpus", "all"]]  # every GPU host's, also one that joins later
SERVICES: dict[str, list[list[str]]] = {
    "writer": [["writer"]],
    "build": [["coordinator"], ["beat"], ["build-worker"], ["ideate-worker"]],
    **dict.fromkeys(GPU_HOSTS, GPU_SERVICES),
}
RESTART_LOOP = 'while :; do "$@"; echo "croqq-bed: exited with $?, restarting in 1s" >&2; sleep 1; done'
_SUBMITTED = re.compile(r" as (sub-[\w-]+)")


@dataclass
class FleetConfig:
    lease_ttl_s: float = 3.0
    sim_gpus: int = 2
    time_scale: float = 0.02  # a MEASURE takes 0.2 s, an IMPLEMENT 0.4 s, an IDEATE 1.2 s
    gpu_offline_s: float = 30.0
    faketime: dict[str, str] = field(default_factory=dict)  # host -> libfaketime offset, e.g. "+90s"
    env: dict[str, str] = field(default_factory=dict)  # extra CROQQ_* settings for every host


class Fleet:
    def __init__(self, root: Path, name: str, config: FleetConfig | None = None) -> None:
        self.config = config or FleetConfig()
        self.bed = Bed(root, name)
        self.password = secrets.token_urlsafe(12)
        self.url = ""
        self.services: dict[str, list[HostProcess]] = {}
        self._client: redis.Redis | None = None

    # -- bring-up ----------------------------------------------------------------------------------

    def start(self) -> Fleet:
        try:
            for name in ("redis", "writer", "build", *GPU_HOSTS):
                self.bed.add_host(name, faketime=self.config.faketime.get(name))
            self.url = self.bed.start_redis(self.bed.host("redis"), self.password)
            for host in ("writer", "build", *GPU_HOSTS):
                self.start_services(host)
            self.wait_gpus(len(GPU_HOSTS) * self.config.sim_gpus)
        except BaseException:
            self.close()
            raise
        return self

    def add_gpu_host(self, name: str) -> Host:
        """A new GPU host joins the running fleet (its simulated GPUs named after it); its worker starts."""
        if not name.startswith("gpu"):
            raise ValueError(f"a GPU host's name starts with 'gpu', not {name!r}")
        host = self.bed.add_host(name)
        self.start_services(name)
        return host

    def env(self, host: Host) -> dict[str, str]:
        c = self.config
        return {
            "CROQQ_BROKER_URL": self.url,
            "CROQQ_RUN_DIR": str(host.dir / "run"),
            "CROQQ_RESULTS_REPO": str(host.dir / "results"),  # exists on the writer's host only
            "CROQQ_SIM_GPUS": str(c.sim_gpus),
            "CROQQ_SIM_MACHINE": host.name,
            "CROQQ_PIPELINE_DEPTH": "2",
            "CROQQ_LEASE_TTL_S": str(c.lease_ttl_s),
            "CROQQ_RECONCILE_EVERY_S": "0.5",
            "CROQQ_HEALTH_WAIT_S": "2",
            "CROQQ_GPU_OFFLINE_S": str(c.gpu_offline_s),
            "CROQQ_RECHECK_EVERY_S": "2",
            "CROQQ_TIME_SCALE": str(c.time_scale),
            **c.env,
        }

    def croqq_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "croqq", *args]

    def start_services(self, name: str) -> list[HostProcess]:
        """(Re)start a host's croqq services, each under a restart loop."""
        host = self.bed.host(name)
        procs = [
            host.spawn(
                ["sh", "-c", RESTART_LOOP, "sh", *self.croqq_argv(*args)],
                env=self.env(host),
                log_path=host.log_dir / f"{args[0]}.log",
                cwd=PROJECT_ROOT,
            )
            for args in SERVICES.get(name, GPU_SERVICES if name.startswith("gpu") else [])
        ]
        self.services[name] = procs
        return procs

    def run(
        self, name: str, *args: str, timeout: float = 300.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one `croqq` command on a host; the finished process."""
        host = self.bed.host(name)
        return host.run(self.croqq_argv(*args), env={**self.env(host), **(env or {})}, timeout=timeout,
                        cwd=PROJECT_ROOT)  # fmt: skip

    @property
    def client(self) -> redis.Redis:
        """The operator's view of Redis, from the Redis host's own network (never partitioned)."""
        if self._client is None:
            self._client = self.bed.host("redis").redis_client(self.url, decode_responses=True)
        return self._client

    def wait_gpus(self, count: int, timeout_s: float = 90.0) -> None:
        deadline = Deadline(timeout_s)
        while len(self.live_gpus()) < count:
            if deadline.expired():
                raise ConfigError(
                    f"only {len(self.live_gpus())} of {count} GPUs came up in {deadline.waited_s:.0f}s; "
                    "see the host logs"
                )
            time.sleep(0.2)

    def live_gpus(self) -> list[registry.GpuEntry]:
        return [g for g in registry.all_gpus(self.client) if self.client.exists(keys.lease(f"gpu:{g.uuid}"))]

    def gpu_uuids(self, machine: str) -> list[str]:
        return [f"GPU-sim-{machine}-{i}" for i in range(self.config.sim_gpus)]

    # -- work --------------------------------------------------------------------------------------

    def submit(self, dtype: str = "f16", max_iter: int = 4, limit: int = 4) -> str:
        """`croqq submit` typed on the build host (which has no results repo); the submission id."""
        args = ("submit", "--dtype", dtype, "--max-iter", str(max_iter), "--limit", str(limit))
        done = self.run("build", *args)
        found = _SUBMITTED.search(done.stdout)
        if done.returncode != 0 or found is None:
            raise ConfigError(f"croqq submit failed ({done.returncode}): {done.stdout} {done.stderr}")
        return found.group(1)

    def snapshot(self, submission: str) -> Snapshot:
        return snapshot(self.client, submission_sids(self.client, submission))

    def wait_done(self, submission: str, timeout_s: float = 240.0) -> Snapshot:
        """Wait until every shape of the submission is done or parked (polling only their summaries: the
        operator's own traffic stays out of the fleet's bytes per iteration)."""
        sids = submission_sids(self.client, submission) or []
        deadline = Deadline(timeout_s)
        while True:
            summaries = [json.loads(r) if r else {} for r in self.client.hmget(keys.SUMMARY, sids)]
            if sids and all(s.get("status") in ("done", "error") for s in summaries):
                return self.snapshot(submission)
            if deadline.expired():
                total = self.snapshot(submission).total
                raise ConfigError(f"{submission} not finished after {deadline.waited_s:.0f}s: {total}")
            time.sleep(0.5)

    def shapes(self, sids: Iterable[str]) -> dict[str, ShapeState]:
        sids = list(sids)
        raws = self.client.mget([keys.shape(s) for s in sids]) if sids else []
        return {s: ShapeState.loads(r) for s, r in zip(sids, raws, strict=True) if r}

    def running_gpu_steps(self, uuids: Iterable[str]) -> dict[str, str]:
        """sid -> step id of the GPU steps running now on these GPUs."""
        queues = {f"gpu.{u}" for u in uuids}
        out: dict[str, str] = {}
        for step_id in strs(self.client.zrange(keys.RUNNING, 0, -1)):
            rec = {str(k): str(v) for k, v in self.client.hgetall(keys.step(step_id)).items()}
            if (
                rec.get("status") == StepStatus.RUNNING
                and rec.get("kind") in GPU_KINDS
                and rec.get("queue") in queues
            ):
                out[rec["sid"]] = step_id
        return out

    def wait_running_on(
        self, uuids: Iterable[str], kind: str = "measure", timeout_s: float = 60.0
    ) -> dict[str, str]:
        """Wait until a step of ``kind`` runs on one of these GPUs; sid -> step id of every GPU step there."""
        uuids = list(uuids)
        deadline = Deadline(timeout_s)
        while True:
            running = self.running_gpu_steps(uuids)
            kinds = {self.client.hget(keys.step(s), "kind") for s in running.values()}
            if kind in kinds:
                return running
            if deadline.expired():
                raise ConfigError(f"no {kind} step ran on {uuids} within {deadline.waited_s:.0f}s")
            time.sleep(0.02)

    def stored(self, sids: Iterable[str]) -> dict[str, int]:
        return {s: st.loop.current_iter for s, st in self.shapes(sids).items()}

    # -- what the fleet promises -----------------------------------------------------------------------

    @property
    def repo(self) -> Path:
        return self.bed.host("writer").dir / "results"

    def problems(self, submission: str, max_iter: int) -> list[str]:
        """Lost or duplicated iterations, invalid records, git fsck: [] when the fleet kept its promises."""
        out = [str(p) for p in repo_problems(self.repo)]
        commits = iteration_commits(self.repo)
        out += [f"{k} committed {n} times" for k, n in commits.items() if n != 1]
        keys_ = {s.rsplit("/", 1)[1] for s in submission_sids(self.client, submission) or []}
        for key in sorted(keys_):
            got = sorted(i for (_, k, i) in commits if k == key)
            if got != list(range(max_iter + 1)):
                out.append(f"{key}: iterations {got} in git, expected 0..{max_iter}")
        for name in ("redis", "build", *GPU_HOSTS):
            if (self.bed.host(name).dir / "results").exists():
                out.append(f"host {name} has a results repo: only the writer may")
        return out

    def gpus_measured(self) -> set[str]:
        """The GPU UUIDs the repo's iterations were measured on."""
        from croqq.store.gitrepo import GitRepo
        from croqq.store.load import list_runs, load_rounds, load_state

        repo = GitRepo.open_existing(self.repo, "main")
        out = set()
        for gpu, dsl in list_runs(repo):
            state = load_state(repo, gpu, dsl)
            for key in state.shapes if state else {}:
                out |= {r.gpu_uuid for r in load_rounds(repo, gpu, dsl, key)}
        return out

    def network_bytes(self) -> int:
        """Bytes Redis received plus sent since it started (every client: the fleet's traffic)."""
        info = self.client.info("stats")
        return int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self.bed.close()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
