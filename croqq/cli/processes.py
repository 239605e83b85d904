"""Process commands: one per role (coordinator, build, ideate, writer, beat, GPU workers, Flower), and
`croqq health`, their container probe."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from croqq.cli import app, fail
from croqq.cli.common import load_settings
from croqq.delivery import queues
from croqq.errors import ConfigError
from croqq.logs import configure
from croqq.settings import Settings

if TYPE_CHECKING:
    from croqq.delivery.leases import Heartbeat

log = logging.getLogger(__name__)
LogLevel = typer.Option("INFO", "--log-level", help="DEBUG | INFO | WARNING | ERROR.")


def _prepare(level: str) -> None:
    configure(level)
    from croqq.delivery.redis_client import require_redis

    require_redis(load_settings())


@app.command()
def coordinator(log_level: str = LogLevel) -> None:
    """Run a coordinator (queue `control`): submissions, GPU filling, reconciliation. Run one or more."""
    from croqq.processes.boot import run_celery_worker

    _prepare(log_level)
    run_celery_worker(load_settings(), "coordinator", [queues.CONTROL], "solo", 1, log_level)


def _shared_worker(
    role: str, names: list[str], pool: str, concurrency: int, log_level: str, jail_alarm: bool = False
) -> None:
    """A worker of the shared queues ``names`` (the caller has run :func:`_prepare`)."""
    from croqq.processes.boot import run_celery_worker

    settings = load_settings()
    beats, on_exit = _jail_alarm(settings) if jail_alarm else (None, None)
    run_celery_worker(settings, role, names, pool, concurrency, log_level, extra_beats=beats, on_exit=on_exit)


def _jail_alarm(settings: Settings) -> tuple[Callable[[Heartbeat], None], Callable[[], None]]:
    """An ideate worker that runs agents keeps the alarm ``agents_unjailed`` raised while they run
    without a jail on its host (cleared when a jail works, and when the worker stops)."""
    from croqq.delivery.redis_client import connect
    from croqq.proposers.agent import jail
    from croqq.work import alarms

    client = connect(settings)
    message = jail.unjailed_reason(settings) if jail.jail_mode(settings) == "none" else ""

    def beat() -> None:
        if message:
            alarms.raise_alarm(client, jail.ALARM, message)
        else:
            alarms.clear_alarm(client, jail.ALARM)

    def clear() -> None:
        alarms.clear_alarm(client, jail.ALARM)

    return (lambda hb: hb.add("jail", beat)), clear


@app.command("build-worker")
def build_worker(
    concurrency: int = typer.Option(
        0, "-c", "--concurrency", help="Parallel compiles (default CROQQ_BUILD_CONCURRENCY)."
    ),
    log_level: str = LogLevel,
) -> None:
    """Run a build worker: materializes and compiles candidates. Run any number. It consumes the queue
    `build.<dsl>` of each kernel family this host can build, and says in one line at start-up why it
    takes none of another family's work (e.g. `nvidia-cutlass` missing or another version)."""
    from croqq.backends import backend_manifest, make_backend

    _prepare(log_level)
    settings = load_settings()
    manifest = backend_manifest(settings)
    problems = make_backend(settings, manifest).build_problems()
    for dsl, exc in problems.items():
        level = logging.INFO if isinstance(exc, ConfigError) else logging.ERROR  # by design / a host fault
        log.log(level, "this build worker takes no work of dsl %r: %s", dsl, exc)
    families = [dsl for dsl in manifest.dsls if dsl not in problems]
    if not families:
        fail("this host can build no kernel family: " + "; ".join(map(str, problems.values())), 2)
    concurrency = concurrency or settings.build_concurrency
    names = [queues.build_queue(dsl) for dsl in families]
    _shared_worker("build", names, settings.build_pool, concurrency, log_level)


@app.command("ideate-worker")
def ideate_worker(
    concurrency: int = typer.Option(
        0, "-c", "--concurrency", help="Parallel proposals (default CROQQ_IDEATE_CONCURRENCY)."
    ),
    log_level: str = LogLevel,
) -> None:
    """Run an ideate worker (queue `ideate`): the proposer (CROQQ_PROPOSER: model, search, or a coding agent
    CROQQ_AGENT). A preset whose executable is missing refuses at start-up (exit 2): this worker then
    takes no IDEATE work, and the shapes go to other ideate workers."""
    from croqq.domain.manifest import load_manifest
    from croqq.proposers import make_proposer

    settings = load_settings()
    proposer = make_proposer(settings, load_manifest(settings.manifest))
    proposer.check_ready()
    concurrency = concurrency or settings.ideate_concurrency
    _prepare(log_level)
    _shared_worker("ideate", [queues.IDEATE], "threads", concurrency, log_level, jail_alarm=proposer.is_agent)


@app.command()
def writer(log_level: str = LogLevel) -> None:
    """Run THE writer (queue `store`), the only process that commits to the results repo; a second refuses."""
    from croqq.processes.boot import run_celery_worker

    _prepare(log_level)
    settings = load_settings()
    run_celery_worker(
        settings,
        "writer",
        [queues.STORE],
        "solo",
        1,
        log_level,
        singleton="writer",
        on_exit=_close_writer,
        on_start=_check_repo,
    )


def _check_repo() -> None:
    """Check the results repo before the first STORE: damage raises the alarm ``repo_corrupt`` and the
    writer then commits nothing (STOREs wait) until `croqq repo repair` (see croqq.store.integrity)."""
    from croqq.processes.runtime import get_runtime

    get_runtime().repo_guard.check()


def _close_writer() -> None:
    """Flush the results repo's index and release git's processes (tasks ran in this thread: solo pool)."""
    from croqq.processes.runtime import get_runtime

    rt = get_runtime()
    if rt.pusher is not None:
        rt.pusher.close()  # one last push of pending commits, if the remote answers within seconds
    if "writer" in vars(rt):
        rt.writer.repo.close()


@app.command()
def beat(log_level: str = LogLevel) -> None:
    """Run THE beat: ticks reconciliation (expired leases, lost messages, dead GPUs) and summary refresh."""
    from croqq.processes.boot import run_beat

    _prepare(log_level)
    run_beat(load_settings(), log_level)


@app.command("gpu-worker", hidden=True)
def gpu_worker(
    uuid: str = typer.Option(..., "--uuid"),
    index: int = typer.Option(0, "--index"),
    gpu_type: str = typer.Option(..., "--type"),
    log_level: str = LogLevel,
) -> None:
    """One GPU's worker process (started by `croqq worker`, with CUDA_VISIBLE_DEVICES set to the UUID)."""
    from croqq.processes.boot import run_gpu_worker

    _prepare(log_level)
    run_gpu_worker(load_settings(), uuid, index, gpu_type, log_level)


@app.command()
def worker(
    gpus: str = typer.Option("all", "--gpus", help="'all' or GPU indexes, e.g. 0,1,3."),
    log_level: str = LogLevel,
) -> None:
    """Run one GPU worker process per GPU (prefork, concurrency 1, CUDA_VISIBLE_DEVICES=<uuid>), restarting
    any that dies. With no NVIDIA GPU (NVML finds none) it runs CROQQ_SIM_GPUS simulated GPUs."""
    from croqq.processes import health as hc
    from croqq.processes.boot import host_name
    from croqq.processes.local import gpu_children
    from croqq.processes.runtime import ENV_GPU_UUID
    from croqq.processes.supervise import Supervisor

    _prepare(log_level)
    settings = load_settings()
    children = gpu_children(gpus, settings, log_level)
    refuse_claimed_gpus(settings, [c.env[ENV_GPU_UUID] for c in children])
    sup = Supervisor(children)
    sup.start_all()
    uuids = [c.env[ENV_GPU_UUID] for c in children]
    gpus_ready = lambda: hc.gpu_problems(settings, uuids)  # noqa: E731
    hb = hc.start_heartbeat(
        settings, hc.Reporter(settings, "worker", f"worker@{host_name()}", problems=gpus_ready)
    )
    typer.echo(
        f"started {len(children)} GPU worker(s); logs in {settings.run_dir / 'logs'}; Ctrl-C stops them"
    )
    _supervise_until_signal(sup)
    hb.stop()


def refuse_claimed_gpus(settings: Settings, uuids: list[str]) -> None:
    """One worker per GPU, fleet-wide: refuse (exit 2, one line) when another live worker, on any host,
    holds one of these GPUs. A holder that does not renew (this pod's killed predecessor) is waited for:
    its lease ends within the TTL."""
    from croqq.delivery import keys
    from croqq.delivery.leases import dead_local
    from croqq.delivery.redis_client import connect, text
    from croqq.errors import LeaseHeldError
    from croqq.patience import Deadline

    client = connect(settings)
    # wall seconds, not stretched by load: a dead holder's lease ends on Redis's clock, whatever the load
    deadline = Deadline(1.5 * settings.lease_ttl_s, wall=True)
    while True:
        held = {u: text(client.get(keys.lease(f"gpu:{u}"))) for u in uuids}
        claimed = {u: owner for u, owner in held.items() if owner and not dead_local(owner)}
        if not claimed:
            return
        if deadline.expired():
            uuid, owner = sorted(claimed.items())[0]
            others = f" (and {len(claimed) - 1} more)" if len(claimed) > 1 else ""
            raise LeaseHeldError(
                f"GPU {uuid}{others} is already claimed by worker {owner} on host {owner.split(':')[0]}; "
                "one worker per GPU: stop that one first, or choose other GPUs with --gpus"
            )
        time.sleep(0.2)


def _supervise_until_signal(sup: object) -> None:
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop["now"]:
        sup.poll()  # type: ignore[attr-defined]
        time.sleep(0.2)
    sup.stop()  # type: ignore[attr-defined]


@app.command()
def flower(
    port: int = typer.Option(5555, "--port", min=1, max=65535, help="TCP port to serve on."),
    address: str = typer.Option(
        "127.0.0.1",
        "--address",
        help="Address to listen on. Anything but loopback (127.0.0.1, ::1, localhost) needs a login.",
    ),
    read_only: bool = typer.Option(
        True,
        "--read-only/--controls",
        help="Without Flower's controls (worker shutdown, pool resize, task revoke): growing a GPU "
        "worker's pool would run two measurements on one GPU. --controls shows them.",
    ),
) -> None:
    r"""Run Flower: the workers (gpu-<index>-<uuid>@host, build@host, writer@host, ...) and their tasks, an
    HTTP API under /api and Prometheus metrics at /metrics. Needs `pip install 'croqq\[flower]'`.

    Logins: CROQQ_FLOWER_BASIC_AUTH=user:password[,user2:password2], or CROQQ_FLOWER_BASIC_AUTH_FILE naming a
    file that holds them (wins; for a Secret); handed to Flower inside this process, never on a command
    line; the API takes the same ones. Without a login Flower listens on loopback only. Workers send the
    events Flower shows unless CROQQ_TASK_EVENTS=false."""
    from croqq.processes.flower import run_flower
    from croqq.processes.webauth import require_logins

    settings = load_settings()
    logins = require_logins(settings, "flower", address)
    run_flower(settings, port, address, logins, read_only)


@app.command()
def health(
    role: str = typer.Option(
        ..., "--role", help="coordinator | build | ideate | writer | beat | gpu | worker | flower | exporter."
    ),
    name: str = typer.Option("", "--name", help="The process's name in its role (a GPU worker: its UUID)."),
    ready: bool = typer.Option(False, "--ready", help="Also require that its last beat reached Redis."),
    max_age: float = typer.Option(
        0.0,
        "--max-age",
        min=0,
        help="Oldest heartbeat accepted, seconds (default 3 beats: 0.75 x LEASE_TTL_S).",
    ),
) -> None:
    """Exit 0 when this host's ROLE process is alive (its heartbeat file, written every beat, is fresh)
    and, with --ready, ready (its last beat reached Redis; a GPU worker holds its GPU lease; `worker`, the
    supervisor: all its GPU workers are ready); else print one line saying what is wrong and exit 1.
    A container probe: run it where the process runs (same host, same CROQQ_HEALTH_DIR)."""
    from croqq.processes import health as hc

    verdict = hc.check(load_settings(), role, name, want_ready=ready, max_age_s=max_age or None)
    if not verdict.ok:
        fail(f"{role}: {verdict.line}")
    typer.echo(f"{role}: {verdict.line}")
