"""A damaged results repo on a running cluster: the writer finds it at start-up, raises the alarm and
commits nothing on top of it (STOREs wait, no shape is parked); `croqq repo repair` re-fetches it from
the remote it pushes to, and the sweep completes with every iteration stored exactly once, the ones
committed after the last push included (run again)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from croqq.chaos.invariants import repo_problems
from croqq.delivery import keys
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.processes.runtime import REPO_ALARM
from croqq.store.paths import RunPaths
from croqq.work import alarms

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture
SHAPES, MAX_ITER = 3, 8


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def env(cluster_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    return cluster_env | {
        "CROQQ_TIME_SCALE": "0.002",
        "CROQQ_RESULTS_REMOTE": str(remote),
        "CROQQ_PUSH_EVERY_S": "0",
        "CROQQ_GIT_RECONCILE_EVERY_S": "2",
    }


def stored(client: redis.Redis) -> int:
    return int(client.hget(keys.STATS, "stored") or 0)


def damage(repo: Path, remote: Path, kind: str) -> str:
    """Damage the stopped cluster's repo; returns the branch ref file's bytes afterwards."""
    ref = repo / ".git/refs/heads/main"
    if kind == "ref":  # the last pushes never happened, and the ref file lost its bytes
        git(remote, "update-ref", "refs/heads/main", git(remote, "rev-parse", "main~5"))
        ref.write_text("")
    else:  # a flipped byte in the middle of the one pack everything is in
        git(repo, "repack", "-a", "-d", "-q")
        flip_biggest_pack(repo)
    return ref.read_text()


def store_waits(env: dict[str, str]) -> bool:
    log = Path(env["CROQQ_RUN_DIR"]) / "logs" / "writer.log"
    return log.exists() and "deferred: results repo corrupt" in log.read_text(errors="replace")


def flip_biggest_pack(repo: Path) -> None:
    pack = max((repo / ".git/objects/pack").glob("*.pack"), key=lambda p: p.stat().st_size)
    os.chmod(pack, 0o644)
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0x40
    pack.write_bytes(bytes(data))


def repo_alarms(client: redis.Redis) -> list[alarms.Alarm]:
    return [a for a in alarms.active(client) if a.name == REPO_ALARM]


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("kind", ["pack", "ref", "pack-while-running"])
def test_a_damaged_repo_stops_the_writer_until_repaired_and_the_sweep_completes_exactly_once(
    env: dict[str, str], redis_client: redis.Redis, croqq: Cli, kind: str
) -> None:
    """``pack``/``ref``: damaged while the cluster is down, found at the writer's start-up;
    ``pack-while-running``: found by the writer's periodic check."""
    repo, remote = Path(env["CROQQ_RESULTS_REPO"]), Path(env["CROQQ_RESULTS_REMOTE"])
    env = env | {"CROQQ_REPO_CHECK_EVERY_S": "1", "CROQQ_TEST_BARRIERS": "true"}
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        cluster.submit("f16", max_iter=MAX_ITER, limit=SHAPES)
        wait_until(lambda: stored(redis_client) >= 10, 300, "10 iterations stored", every_s=0.1)
        if kind == "pack-while-running":  # measurements held, so that STOREs still come after the damage
            redis_client.set(keys.barrier("measure"), 1)
            held = keys.barrier("measure:reached")
            wait_until(lambda: redis_client.exists(held), 300, "a measurement held")
            flip_biggest_pack(repo)
            wait_until(lambda: repo_alarms(redis_client), 120, "the periodic check's alarm", every_s=0.2)
            redis_client.delete(keys.barrier("measure"))
            wait_until(lambda: store_waits(env), 300, "the held STORE waiting for the repair", every_s=0.5)
    commits = int(git(repo, "rev-list", "--count", "main"))
    ref_bytes = damage(repo, remote, kind) if kind != "pack-while-running" else ""

    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        found = wait_until(lambda: repo_alarms(redis_client), 120, "the writer's repo_corrupt alarm")
        line = found[0].message
        named = "ref refs/heads/main unreadable" if kind == "ref" else "object "
        assert line.startswith(f"results repo corrupt: {named}") and "croqq repo repair" in line, line
        shown = croqq(env | {"COLUMNS": "300"}, "status")
        assert REPO_ALARM in shown.stdout and "results repo corrupt" in shown.stdout, shown.stdout
        wait_until(lambda: store_waits(env), 300, "a STORE waiting for the repair", every_s=0.5)
        assert cluster.snapshot().total.error == 0  # waiting STOREs never park a shape
        if ref_bytes:
            assert (repo / ".git/refs/heads/main").read_text() == ref_bytes  # nothing committed on top

    done = croqq(env, "repo", "repair")
    assert done.returncode == 0, done.stderr
    assert "results repo repaired" in done.stdout and not repo_alarms(redis_client)
    assert croqq(env, "repo", "check").returncode == 0
    lost = 5 if kind == "ref" else 0  # the commits after the last push: their iterations run again
    assert int(git(repo, "rev-list", "--count", "main")) == commits - lost

    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=MAX_ITER, limit=SHAPES)
        snap = cluster.wait_done(sub, timeout_s=900)
    assert snap.total.done == SHAPES and snap.total.error == 0
    assert repo_problems(repo) == []  # exactly once, contiguous ids, files agree, git fsck clean
    state = json.loads((repo / PATHS.state_json).read_text())["shapes"]
    assert len(state) == SHAPES and all(e["status"] == "done" for e in state.values())
    for key in state:
        assert json.loads((repo / PATHS.checkpoint(key)).read_text())["current_iter"] == MAX_ITER
