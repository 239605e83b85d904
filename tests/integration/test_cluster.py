"""The real cluster (Redis server, Celery worker processes, git) tunes shapes end to end."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from croqq.chaos.invariants import iteration_commits, repo_problems
from croqq.delivery import keys
from croqq.delivery.ledger import Ledger
from croqq.delivery.queues import TASK_BUILD, build_queue
from croqq.delivery.redis_client import strs, text
from croqq.patience import wait_until
from croqq.processes.app import make_app
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths
from croqq.store.render import parse_tsv
from tests.output import error_line

pytestmark = pytest.mark.slow
RUN = "tuning/sm90_Simulated_H100_SXM/cutlass"  # the default (from_current_best) family
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
ITER_LINE = re.compile(r"^(\S+ iter\d{3}): ")
GROUP_SUBJECT = re.compile(r"^store: (\d+) record\(s\)$")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def assert_every_record_agrees(repo: Path, shapes: int, max_iter: int) -> None:
    """Each iteration committed once; results.tsv, rounds, checkpoint, state.json, best kernel agree."""
    iterations = iteration_commits(repo)  # a group commit counts each iteration it stores
    assert len(iterations) == shapes * (max_iter + 1) and set(iterations.values()) == {1}
    state = json.loads((repo / RUN / "state.json").read_text())["shapes"]
    assert len(state) == shapes
    for key, entry in state.items():
        rows = parse_tsv((repo / PATHS.results_tsv(key)).read_text())
        assert [r.iter for r in rows] == list(range(max_iter + 1))
        ckpt = json.loads((repo / PATHS.checkpoint(key)).read_text())
        assert (ckpt["current_iter"], ckpt["status"], entry["status"]) == (max_iter, "done", "done")
        best = rows[ckpt["best_iter"]]
        assert (
            best.decision in ("KEEP", "BASELINE")
            and ckpt["best_tflops"] == entry["best_tflops"] == best.tflops
        )
        assert all(r.decision != "KEEP" for r in rows[best.iter + 1 :])
        rounds = (repo / PATHS.rounds_raw(key)).read_text().splitlines()
        assert [json.loads(line)["iteration"] for line in rounds] == list(range(max_iter + 1))
        measures = [json.loads(line)["measure"] for line in rounds]  # each GPU step's interval (croqq report)
        assert all(m["gpu_started_at"] > 0 and m["gpu_busy_s"] > 0 for m in measures)
        assert (repo / "kernels" / "gemm_f16" / f"{key}_best.cu").exists()
    assert repo_problems(repo) == []  # croqq validate's checks, one commit per iteration, git fsck
    assert git(repo, "status", "--porcelain") == ""


def test_every_iteration_is_committed_exactly_once_and_all_records_agree(cluster_env: dict[str, str]) -> None:
    cluster_env = cluster_env | {"CROQQ_STORE_GROUP": "1"}
    with LocalCluster(cluster_env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=4, limit=3)
        snap = cluster.wait_done(sub, timeout_s=300)
        client = cluster.client
        assert snap.total.done == 3 and snap.total.iters_done == 15
        assert client.zcard(keys.RUNNING) == 0 and client.zcard(keys.OUTBOX) == 0
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    subjects = git(repo, "log", "--format=%s").splitlines()
    assert len([s for s in subjects if ITER_LINE.match(s)]) == 15  # store_group 1: one commit per iteration
    assert_every_record_agrees(repo, shapes=3, max_iter=4)


@contextlib.contextmanager
def _grouped(cluster_env: dict[str, str]) -> Iterator[LocalCluster]:
    """A cluster committing up to 8 STOREs per commit, its GPUs up (fixed depth: the tests hold STOREs)."""
    env = cluster_env | {"CROQQ_STORE_GROUP": "8", "CROQQ_PIPELINE_DEPTH_MODE": "fixed"}
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        yield cluster


def test_group_commit_stores_the_queued_iterations_together_each_exactly_once(
    cluster_env: dict[str, str],
) -> None:
    with _grouped(cluster_env) as cluster:
        client = cluster.client
        client.set(keys.barrier("store"), "1")  # the writer holds its first STORE until 2 more are queued
        sub = cluster.submit("f16", max_iter=3, limit=4)
        wait_until(lambda: client.zcard(keys.QUEUED_STORES) >= 2, 180, "2 STOREs queued", every_s=0.05)
        client.delete(keys.barrier("store"))
        snap = cluster.wait_done(sub, timeout_s=300)
        assert snap.total.done == 4 and snap.total.iters_done == 16
        assert (
            client.zcard(keys.RUNNING) == client.zcard(keys.OUTBOX) == client.zcard(keys.QUEUED_STORES) == 0
        )
        wakeups = int(client.hget(keys.STATS, "store_wakeups") or 0)
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    groups = [
        int(m.group(1)) for m in map(GROUP_SUBJECT.match, git(repo, "log", "--format=%s").splitlines()) if m
    ]
    assert groups and max(groups) >= 2  # those queued behind the held STORE went into one commit
    assert_every_record_agrees(repo, shapes=4, max_iter=3)
    assert 1 <= wakeups < 16  # most STOREs sent the writer no message: one wake-up drained several


def _arm(client: Any, barrier: str) -> None:
    client.delete(keys.barrier(f"{barrier}:reached"))
    client.set(keys.barrier(barrier), "1")


def _running_stores(client: Any) -> list[str]:
    running = strs(client.zrange(keys.RUNNING, 0, -1))
    return [s for s in running if text(client.hget(keys.step(s), "kind")) == "store"]


def _held_batch(client: Any, submit: Callable[[], str]) -> tuple[str, list[str]]:
    """Submit, holding the writer after its first commit, before its completion; if that batch holds 2+
    STOREs, it is the one. Else hold it there until 2+ STOREs queue behind it and catch the batch they
    make at its next commit (the branch not yet moved). Returns the submission and the held batch's
    STOREs (claimed, running); the caller lifts both barriers. Armed before the submission: on a loaded
    machine every STORE may be committed before ``submit`` returns (it waits for the record)."""
    _arm(client, "store:complete")
    sub = submit()
    wait_until(lambda: client.exists(keys.barrier("store:complete:reached")), 180, "a STORE committed")
    held = _running_stores(client)
    if len(held) >= 2:
        return sub, held
    wait_until(lambda: client.zcard(keys.QUEUED_STORES) >= 2, 180, "2 STOREs queued", every_s=0.05)
    _arm(client, "store:commit")
    client.delete(keys.barrier("store:complete"))
    wait_until(lambda: client.exists(keys.barrier("store:commit:reached")), 180, "the writer at a commit")
    return sub, _running_stores(client)


def test_a_stale_epoch_inside_a_drained_batch_is_stored_once_and_holds_up_no_other(
    cluster_env: dict[str, str],
) -> None:
    with _grouped(cluster_env) as cluster:
        client = cluster.client
        sub, held = _held_batch(client, lambda: cluster.submit("f16", max_iter=3, limit=4))
        assert len(held) >= 2
        ledger = Ledger(client, cluster.settings.lease_ttl_s, advance=None)  # type: ignore[arg-type]
        assert ledger.requeue(held[0], "a stale epoch inside the batch")  # epoch + 1; no message sent
        client.delete(keys.barrier("store:commit"), keys.barrier("store:complete"))
        snap = cluster.wait_done(sub, timeout_s=300)
        assert snap.total.done == 4 and snap.total.iters_done == 16
        assert int(client.hget(keys.STATS, "redispatch") or 0) >= 1
        assert client.zcard(keys.RUNNING) == client.zcard(keys.QUEUED_STORES) == 0
    assert_every_record_agrees(Path(cluster_env["CROQQ_RESULTS_REPO"]), shapes=4, max_iter=3)


def test_a_payload_that_fails_validation_is_logged_and_dropped(cluster_env: dict[str, str]) -> None:
    roles = {"build": ["build-worker"]}
    log = Path(cluster_env["CROQQ_RUN_DIR"]) / "logs" / "build.log"
    line = "rejected message: StepMessage: step_id: Input should be a valid string"

    def logged() -> bool:  # the counter is incremented before the line is logged
        return log.exists() and line in log.read_text()

    with LocalCluster(cluster_env, roles=roles) as cluster:
        celery = make_app(cluster.settings)
        celery.send_task(TASK_BUILD, args=[{"step_id": 5, "epoch": -1}], queue=build_queue("cuda"))
        wait_until(lambda: cluster.client.hget(keys.STATS, "rejected"), 180, "the build worker to reject it")
        wait_until(logged, 60, f"{line!r} in {log}")
        assert cluster.client.hget(keys.STATS, "rejected") == "1"
        assert cluster.client.llen(build_queue("cuda")) == 0


def test_a_second_writer_refuses_to_start(cluster_env: dict[str, str]) -> None:
    # a long lease: the first writer keeps it however slowly its heartbeat runs on a loaded machine (the
    # second then waits 1.5 TTLs for it before refusing)
    env = cluster_env | {"CROQQ_LEASE_TTL_S": "20"}
    with LocalCluster(env, roles={"writer": ["writer"]}) as cluster:
        client = cluster.client
        wait_until(lambda: client.exists(keys.lease("writer")), 180, "the first writer's lease", every_s=0.1)
        holder = client.get(keys.lease("writer"))
        second = subprocess.run(
            [sys.executable, "-m", "croqq", "writer"],
            check=False,
            env={**cluster.env, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert client.get(keys.lease("writer")) == holder  # the first kept it throughout
    assert second.returncode != 0
    assert "the writer lock is already held by" in error_line(second.stderr)
