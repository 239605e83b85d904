"""The real cluster (Redis server, Celery worker processes, git) tunes shapes end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from croqq.delivery import keys
from croqq.delivery.queues import BUILD, TASK_BUILD
from croqq.processes.app import make_app
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths
from croqq.store.render import parse_tsv
from croqq.store.validate import validate_repo

pytestmark = pytest.mark.slow
RUN = "tuning/sm90_Simulated_H100_SXM/cuda"
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cuda")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_every_iteration_is_committed_exactly_once_and_all_records_agree(cluster_env: dict[str, str]) -> None:
    with LocalCluster(cluster_env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=4, limit=3)
        snap = cluster.wait_done(sub, timeout_s=120)
        client = cluster.client
        assert snap.total.done == 3 and snap.total.iters_done == 15
        assert client.zcard(keys.RUNNING) == 0 and client.zcard(keys.OUTBOX) == 0
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    subjects = git(repo, "log", "--format=%s").splitlines()
    iterations = Counter(s.split(":")[0] for s in subjects if " iter" in s)
    assert len(iterations) == 15 and set(iterations.values()) == {1}
    state = json.loads((repo / RUN / "state.json").read_text())["shapes"]
    assert len(state) == 3
    for key, entry in state.items():
        rows = parse_tsv((repo / PATHS.results_tsv(key)).read_text())
        assert [r.iter for r in rows] == [0, 1, 2, 3, 4]
        ckpt = json.loads((repo / PATHS.checkpoint(key)).read_text())
        assert (ckpt["current_iter"], ckpt["status"], entry["status"]) == (4, "done", "done")
        best = rows[ckpt["best_iter"]]
        assert (
            best.decision in ("KEEP", "BASELINE")
            and ckpt["best_tflops"] == entry["best_tflops"] == best.tflops
        )
        assert all(r.decision != "KEEP" for r in rows[best.iter + 1 :])
        rounds = (repo / PATHS.rounds_raw(key)).read_text().splitlines()
        assert [json.loads(line)["iteration"] for line in rounds] == [0, 1, 2, 3, 4]
        measures = [json.loads(line)["measure"] for line in rounds]  # each GPU step's interval (croqq report)
        assert all(m["gpu_started_at"] > 0 and m["gpu_busy_s"] > 0 for m in measures)
        assert (repo / "kernels" / "gemm_f16" / f"{key}_best.cu").exists()
    assert validate_repo(repo, None) == []
    assert git(repo, "status", "--porcelain") == ""


def test_a_payload_that_fails_validation_is_logged_and_dropped(cluster_env: dict[str, str]) -> None:
    roles = {"build": ["build-worker"]}
    with LocalCluster(cluster_env, roles=roles) as cluster:
        celery = make_app(cluster.settings)
        celery.send_task(TASK_BUILD, args=[{"step_id": 5, "epoch": -1}], queue=BUILD)
        deadline = time.monotonic() + 30
        while not cluster.client.hget(keys.STATS, "rejected") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.client.hget(keys.STATS, "rejected") == "1"
        assert cluster.client.llen(BUILD) == 0
    log = (Path(cluster_env["CROQQ_RUN_DIR"]) / "logs" / "build.log").read_text()
    assert "rejected message: StepMessage: step_id: Input should be a valid string" in log


def test_a_second_writer_refuses_to_start(cluster_env: dict[str, str]) -> None:
    with LocalCluster(cluster_env, roles={"writer": ["writer"]}) as cluster:
        deadline = time.monotonic() + 30
        while not cluster.client.exists(keys.lease("writer")) and time.monotonic() < deadline:
            time.sleep(0.1)
        env = {**cluster.env, "PATH": "/usr/bin:/bin"}
        second = subprocess.run(
            [sys.executable, "-m", "croqq", "writer"],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert second.returncode != 0
    lines = [line for line in second.stderr.splitlines() if line.startswith("croqq: error:")]
    assert len(lines) == 1 and "the writer lock is already held by" in lines[0]
