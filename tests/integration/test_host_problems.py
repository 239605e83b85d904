"""Nothing parks forever: a host that cannot do its work refuses it, and another host does it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import redis

from croqq.delivery import clock, keys
from croqq.delivery.ledger import Ledger, StepRecord, StepStatus
from croqq.delivery.queues import build_queue
from croqq.delivery.redis_client import strs
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.processes.runtime import Runtime
from croqq.processes.supervise import EXIT_CONFIG, Child
from croqq.settings import Settings
from croqq.work import hosts, housekeeping
from croqq.work.advance import Advance

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def registered(client: redis.Redis, pid: int) -> bool:
    """A worker of process ``pid`` is in the worker registry (it consumes its queue next)."""
    nodes = strs(client.zrange(keys.WORKERS, 0, -1))
    return any(client.hget(keys.worker(node), "pid") in (str(pid), str(pid).encode()) for node in nodes)


@pytest.mark.timeout(1800)
def test_a_build_host_without_its_compiler_refuses_the_work_and_another_host_builds_it(
    cluster_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fakebin = tmp_path / "bin"  # the healthy hosts' compiler: accepts every candidate
    fakebin.mkdir()
    (fakebin / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (fakebin / "nvcc").chmod(0o755)
    env = cluster_env | {
        "CROQQ_SIM_COMPILE": "nvcc",
        "CROQQ_TEST_BARRIERS": "false",
        "CROQQ_TIME_SCALE": "0.002",
    }
    monkeypatch.setenv("PATH", f"{fakebin}:/usr/bin:/bin")  # what the cluster's processes inherit
    with LocalCluster(env) as cluster:
        assert cluster.supervisor is not None
        logs = Path(env["CROQQ_RUN_DIR"]) / "logs"
        broken = Child(  # a second build host, whose PATH has no nvcc
            "build-broken",
            [sys.executable, "-m", "croqq", "build-worker", "--log-level", "INFO"],
            {**cluster.env, "PATH": "/usr/bin:/bin"},
            logs / "build-broken.log",
        )
        cluster.supervisor.add(broken)
        cluster.supervisor.start(broken)
        cluster.wait_gpus()
        client = cluster.client
        assert broken.popen is not None
        pid = broken.popen.pid  # the work must find both build hosts consuming
        wait_until(lambda: registered(client, pid), 180, "the second build worker to register")
        sub = cluster.submit("f16", max_iter=6, limit=4)
        snap = cluster.wait_done(sub, timeout_s=300)
        problems = hosts.all_problems(client)
        status = subprocess.run(
            [sys.executable, "-m", "croqq", "status"],
            env={**cluster.env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
        popen = broken.popen
        wait_until(lambda: popen.poll() is not None, 180, "the broken build worker to stop")
        code = popen.wait()

        def decided() -> bool:  # the supervisor's own decision (its thread's): left stopped, or restarted
            return not broken.restart or broken.restarts > 0

        wait_until(decided, 60, "the supervisor's decision on the broken worker's exit")
        restarted = broken.restarts > 0 or broken.popen is not popen or popen.poll() is None
    assert snap.total.done == 4 and snap.total.error == 0  # no shape was parked for the host's fault
    assert [p.role for p in problems] == ["build"] and "nvcc not found on this build host" in problems[
        0
    ].reason
    assert "workers refusing work" in status.stdout and "nvcc not found" in status.stdout
    assert code == EXIT_CONFIG and not restarted  # it stopped taking work; supervisors leave it stopped
    log = (logs / "build-broken.log").read_text()
    assert "stops taking work" in log
    repo = Path(env["CROQQ_RESULTS_REPO"])
    blamed = [f for f in repo.glob("tuning/*/*/shapes/*/attempts.jsonl") if "not found" in f.read_text()]
    assert blamed == []  # the host's fault was never recorded as a candidate's compile failure


def test_a_worker_that_stops_has_the_steps_queued_for_it_published_again(
    cluster_env: dict[str, str], redis_client: redis.Redis
) -> None:
    """Redis may hand a stopping worker a message that Celery then drops (celery/celery#4354): the worker
    marks its queue reset when its consumer has stopped, and housekeeping publishes the step again."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "croqq", "build-worker"],
        env=os.environ | cluster_env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def consuming() -> bool:
            assert worker.poll() is None, "the build worker exited"
            return bool(
                redis_client.exists(keys.queue_reset(build_queue("cuda")))
                and redis_client.zcard(keys.WORKERS)
            )

        wait_until(consuming, 180, "the build worker to start consuming")
        step = StepRecord(
            step_id="s#1",
            sid="s",
            kind="implement",
            epoch=0,
            status=StepStatus.QUEUED,
            queue=build_queue("cuda"),
        )
        redis_client.hset(keys.step(step.step_id), mapping={k: str(v) for k, v in step.model_dump().items()})
        redis_client.zadd(keys.QUEUED, {step.step_id: clock.now(redis_client)})  # its message: dropped
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: worker.poll() is not None, 180, "the build worker to stop on SIGTERM")
        assert worker.returncode == 0
    finally:
        worker.kill()
    published: list[StepRecord] = []
    ledger = Ledger(
        redis_client, 3.0, Advance(refill=lambda uuid: 0), lambda records, _: published.extend(records)
    )
    rt = cast(Runtime, SimpleNamespace(client=redis_client, ledger=ledger, settings=Settings()))
    assert housekeeping.republish_after_resets(rt) == 1
    assert [s.step_id for s in published] == ["s#1"]
    assert redis_client.zcard(keys.WORKERS) == 0  # and it left the registry


def test_a_build_host_with_another_cutlass_takes_no_cutlass_work_and_still_builds_the_other_family(
    cluster_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    site = tmp_path / "site"  # an older nvidia-cutlass, found before the installed one
    info = site / "nvidia_cutlass-4.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cutlass\nVersion: 4.1.0\n")
    log = tmp_path / "build.log"
    env = os.environ | cluster_env | {"CROQQ_BACKEND": "cuda", "PYTHONPATH": str(site)}
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "croqq", "build-worker"], env=env, cwd=ROOT, stdout=out, stderr=out
        )
    try:
        wait_until(
            lambda: worker.poll() is not None or registered(redis_client, worker.pid), 180, "it starts"
        )
        assert worker.poll() is None, log.read_text()  # it runs: a host problem would stop it
        (node,) = strs(redis_client.zrange(keys.WORKERS, 0, -1))
        assert json.loads(redis_client.hget(keys.worker(node), "queues")) == [build_queue("cuda")]
        assert hosts.all_problems(redis_client) == []
    finally:
        worker.terminate()
        worker.wait(timeout=120)
    lines = [line for line in log.read_text().splitlines() if "takes no work" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "this build worker takes no work of dsl 'cutlass': dsl 'cutlass' needs nvidia-cutlass 4.2.0.0, "
        "this host has 4.1.0: pip install 'nvidia-cutlass==4.2.0.0'"
    ), log.read_text()
