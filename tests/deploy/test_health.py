"""`croqq health`: a probe that says alive only while the heartbeat thread beats, ready only while that
beat reaches Redis (and, for a GPU worker, its GPU lease is its own), and names what is wrong in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from croqq.delivery import keys
from croqq.patience import Deadline
from croqq.processes import health as hc
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import GpuIdentity
from croqq.settings import Settings
from tests.output import error_line

ROOT = Path(__file__).resolve().parents[2]
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1: a PING is refused at once
FRESH_S = 60.0  # a beat interval that keeps a record fresh (3 beats) however slowly a test runs
WAIT_S = 240.0  # unloaded seconds (croqq.patience) for a real process to become healthy


def settings_for(tmp_path: Path, url: str = DEAD_REDIS, **more: object) -> Settings:
    """A beat every FRESH_S (a quarter of the lease TTL): the records of in-process beats stay fresh."""
    return Settings(broker_url=url, health_dir=tmp_path / "health", lease_ttl_s=4 * FRESH_S, **more)  # type: ignore[arg-type]


def put(settings: Settings, role: str = "beat", name: str = "", age_s: float = 0.0, **fields: object) -> Path:
    """A health file as the process would have written it ``age_s`` ago (this process as its pid; a beat
    every FRESH_S unless ``interval_s`` is given; ``at`` overrides ``age_s``)."""
    record = hc.HealthRecord(
        **{
            "role": role,
            "node": f"{role}@test",
            "host": os.uname().nodename,
            "pid": os.getpid(),
            "at": time.time() - age_s,
            "interval_s": FRESH_S,
            "ready": True,
            **fields,
        }  # type: ignore[arg-type]
    )
    path = hc.health_path(settings, role, name)
    hc.write_record(path, record)
    return path


def redis_up() -> None:
    return None


def redis_down() -> str:
    return "Connection refused"


# -- the verdict ---------------------------------------------------------------------------------------


def test_a_fresh_file_whose_beat_reached_redis_is_alive_and_ready(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    put(s, age_s=0.2)
    assert hc.check(s, "beat").ok
    verdict = hc.check(s, "beat", want_ready=True)
    assert verdict.ok and "ready" in verdict.line


def test_a_missing_file_fails_and_says_so(tmp_path: Path) -> None:
    verdict = hc.check(settings_for(tmp_path), "writer")
    assert not verdict.ok
    assert verdict.line.startswith("no health file") and "writer.json" in verdict.line


def test_a_missing_gpu_file_names_the_gpu_files_that_exist(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    put(s, "gpu", "GPU-1234")
    verdict = hc.check(s, "gpu")
    assert not verdict.ok and "gpu-GPU-1234.json" in verdict.line and "--name" in verdict.line
    assert hc.check(s, "gpu", "GPU-1234").ok


def test_a_stale_file_of_a_live_process_fails_while_redis_answers(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    now = time.time()
    put(s, at=now - 9.8, interval_s=0.5)  # 3 beats of 0.5 s is the max age
    for ready in (False, True):
        verdict = hc.check(s, "beat", want_ready=ready, now=now, redis_probe=redis_up)
        assert not verdict.ok
        assert "stale by 8 s" in verdict.line and "heartbeat is stuck" in verdict.line


def test_a_stale_file_of_a_dead_process_says_it_no_longer_runs(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    put(s, age_s=10.0, interval_s=0.5, pid=int(gone.stdout))
    verdict = hc.check(s, "beat", redis_probe=redis_down)
    assert not verdict.ok and "no longer runs" in verdict.line


def test_a_heartbeat_that_waits_for_an_unreachable_redis_is_alive_but_not_ready(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    put(s, age_s=10.0, interval_s=0.5)
    alive = hc.check(s, "beat", redis_probe=redis_down)
    assert alive.ok and "waits for Redis" in alive.line
    ready = hc.check(s, "beat", want_ready=True, redis_probe=redis_down)
    assert not ready.ok and "Connection refused" in ready.line


def test_a_beat_that_did_not_reach_redis_is_alive_but_not_ready(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    since = time.time() - 42
    put(s, at=since + 42, ready=False, redis_error="Error 111 connecting", unreachable_since=since)
    assert hc.check(s, "beat").ok
    verdict = hc.check(s, "beat", want_ready=True)
    assert not verdict.ok
    assert (
        "Redis unreachable since" in verdict.line and "(42 s)" in verdict.line and "Error 111" in verdict.line
    )


def test_a_gpu_worker_without_its_gpu_lease_is_not_ready(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    put(s, "gpu", "GPU-1", gpu_uuid="GPU-1", gpu_lease=False)
    verdict = hc.check(s, "gpu", "GPU-1", want_ready=True)
    assert not verdict.ok and "GPU-1's lease is held by another process" in verdict.line


def test_max_age_overrides_the_three_beats(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    put(s, age_s=10.0)
    assert hc.check(s, "beat", max_age_s=60.0).ok
    assert not hc.check(s, "beat", max_age_s=5.0, redis_probe=redis_up).ok


def test_an_unknown_role_is_refused(tmp_path: Path) -> None:
    from croqq.errors import ConfigError

    with pytest.raises(ConfigError, match="--role"):
        hc.check(settings_for(tmp_path), "nobody")


# -- the beat ------------------------------------------------------------------------------------------


def test_the_beat_writes_a_ready_record_atomically(tmp_path: Path, redis_server: RedisServer) -> None:
    s = settings_for(tmp_path, redis_server.url)
    beat = hc.Reporter(s, "writer", "writer@test")
    before = time.time()
    beat()
    beat()
    after = time.time()
    record = json.loads((tmp_path / "health" / "writer.json").read_text())
    assert record["ready"] is True and record["pid"] == os.getpid() and record["role"] == "writer"
    assert record["interval_s"] == hc.beat_interval(s) and before <= record["at"] <= after
    assert [p.name for p in (tmp_path / "health").iterdir()] == ["writer.json"]  # no temp file left


def test_the_beat_remembers_since_when_redis_is_unreachable(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    beat = hc.Reporter(s, "coordinator", "coordinator@test")
    started = time.time()
    beat()
    beat()
    record = hc.read_record(tmp_path / "health" / "coordinator.json")
    assert record is not None and not record.ready and record.redis_error
    assert record.unreachable_since is not None and started <= record.unreachable_since < record.at


def test_a_gpu_workers_beat_says_whether_its_gpu_lease_is_held(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    s = settings_for(tmp_path, redis_server.url)
    gpu = GpuIdentity(uuid="GPU-abc", index=0, gpu_type="sm90_x", owner="host:1:space:token:gpu")
    beat = hc.Reporter(s, "gpu", "gpu0@test", gpu=gpu)
    redis_client.set(keys.lease("gpu:GPU-abc"), gpu.owner)
    beat()
    assert hc.check(s, "gpu", "GPU-abc", want_ready=True).ok
    redis_client.set(keys.lease("gpu:GPU-abc"), "someone-else")
    beat()
    assert not hc.check(s, "gpu", "GPU-abc", want_ready=True).ok


def test_the_supervisor_is_ready_only_when_its_gpu_workers_are(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    s = settings_for(tmp_path, redis_server.url)
    uuids = ["GPU-a", "GPU-b"]
    beat = hc.Reporter(s, "worker", "worker@test", problems=lambda: hc.gpu_problems(s, uuids))
    put(s, "gpu", "GPU-a", gpu_uuid="GPU-a", gpu_lease=True)
    beat()
    verdict = hc.check(s, "worker", want_ready=True)
    assert not verdict.ok and "GPU GPU-b: no health file" in verdict.line
    assert hc.check(s, "worker").ok  # alive all the same
    put(s, "gpu", "GPU-b", gpu_uuid="GPU-b", gpu_lease=True)
    beat()
    assert hc.check(s, "worker", want_ready=True).ok


def test_flower_gets_its_basic_auth_inside_the_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from croqq.cli import _register, app
    from croqq.processes import app as celery_module
    from croqq.settings import get_settings

    _register()
    started: list[list[str]] = []
    monkeypatch.setattr(celery_module.app, "start", started.append)
    monkeypatch.setattr(hc, "start_heartbeat", lambda settings, beat: None)
    monkeypatch.setenv("CROQQ_FLOWER_BASIC_AUTH", "ops:s3cret,viewer:other")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["flower", "--address", "0.0.0.0", "--port", "5555"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    (argv,) = started
    assert argv[:3] == ["flower", "--port=5555", "--address=0.0.0.0"]
    assert "--basic_auth=ops:s3cret,viewer:other" in argv


# -- the command ---------------------------------------------------------------------------------------


def test_the_command_exits_1_with_one_line_naming_the_problem(tmp_path: Path, croqq) -> None:  # type: ignore[no-untyped-def]
    env = {"CROQQ_HEALTH_DIR": str(tmp_path / "health"), "CROQQ_BROKER_URL": DEAD_REDIS}
    missing = croqq(env, "health", "--role", "writer", "--ready")
    assert missing.returncode == 1
    assert "writer: no health file" in error_line(missing.stderr)
    s = settings_for(tmp_path)
    # a beat every 60 s: the record stays fresh however long each `croqq health` takes to start
    put(s, "writer", interval_s=60.0, ready=False, redis_error="refused", unreachable_since=time.time() - 5)
    assert croqq(env, "health", "--role", "writer").returncode == 0
    not_ready = croqq(env, "health", "--role", "writer", "--ready")
    assert not_ready.returncode == 1 and "Redis unreachable since" in error_line(not_ready.stderr)
    assert croqq(env, "health", "--role", "nobody").returncode == 2


# -- real processes ------------------------------------------------------------------------------------


def start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "croqq", *args],
            env={"PATH": "/usr/bin:/bin", **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )


def wait_for(croqq, env: dict[str, str], args: list[str], log: Path, budget_s: float = WAIT_S) -> str:  # type: ignore[no-untyped-def]
    """Poll `croqq health ARGS` until it exits 0 (its stdout); fail only once ``budget_s`` unloaded
    seconds (croqq.patience) have passed without it."""
    deadline = Deadline(budget_s)
    while True:
        done = croqq(env, "health", *args)
        if done.returncode == 0:
            return str(done.stdout)
        if deadline.expired():
            pytest.fail(
                f"croqq health {' '.join(args)}: not within {deadline.waited_s:.0f} s: "
                f"{done.stderr.strip()}\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a wait for readiness that stretches with the machine's load
def test_a_real_beat_is_ready_while_it_runs_and_stale_once_killed(
    cluster_env: dict[str, str],
    tmp_path: Path,
    croqq,  # type: ignore[no-untyped-def]
) -> None:
    log = tmp_path / "beat.log"
    beat = start(cluster_env, log, "beat")
    try:
        assert "ready" in wait_for(croqq, cluster_env, ["--role", "beat", "--ready"], log)
        record = json.loads((Path(cluster_env["CROQQ_RUN_DIR"]) / "health" / "beat.json").read_text())
        assert record["pid"] == beat.pid and record["interval_s"] == 0.75  # CROQQ_LEASE_TTL_S=3
    finally:
        os.killpg(beat.pid, 9)
        beat.wait(30)
    time.sleep(3 * 0.75 + 0.5)
    gone = croqq(cluster_env, "health", "--role", "beat")
    assert gone.returncode == 1
    assert "stale by" in gone.stderr and f"pid {beat.pid} no longer runs" in gone.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two waits for readiness, each stretching with the machine's load
def test_a_real_gpu_worker_supervisor_is_ready_once_its_gpu_workers_hold_their_gpus(
    cluster_env: dict[str, str],
    tmp_path: Path,
    croqq,  # type: ignore[no-untyped-def]
) -> None:
    env = cluster_env | {"CROQQ_SIM_GPUS": "1", "CROQQ_PROBE": "sim"}
    log = tmp_path / "worker.log"
    worker = start(env, log, "worker", "--gpus", "all")
    try:
        wait_for(croqq, env, ["--role", "worker", "--ready"], log)
        health = Path(env["CROQQ_RUN_DIR"]) / "health"
        (gpu_file,) = health.glob("gpu-*.json")
        uuid = json.loads(gpu_file.read_text())["gpu_uuid"]
        # ready: its beat reached Redis and its GPU lease is its own
        wait_for(croqq, env, ["--role", "gpu", "--name", uuid, "--ready"], log)
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait(30)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a wait for readiness that stretches with the machine's load
def test_a_real_flower_asks_for_its_basic_auth_and_is_ready_once_it_serves(
    cluster_env: dict[str, str],
    tmp_path: Path,
    croqq,  # type: ignore[no-untyped-def]
) -> None:
    import base64
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = cluster_env | {"CROQQ_FLOWER_BASIC_AUTH": "ops:s3cret"}
    log = tmp_path / "flower.log"
    flower = start(env, log, "flower", "--address", "127.0.0.1", "--port", str(port))
    try:
        wait_for(croqq, env, ["--role", "flower", "--ready"], log)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60)
        assert refused.value.code == 401
        login = base64.b64encode(b"ops:s3cret").decode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/", headers={"Authorization": f"Basic {login}"}
        )
        with urllib.request.urlopen(request, timeout=60) as page:
            assert page.status == 200
    finally:
        flower.terminate()
        try:
            flower.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(flower.pid, 9)
            flower.wait(30)
