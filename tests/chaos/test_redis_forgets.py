"""Redis is a cache that may lose its tail; git is the truth.

Each test runs a real cluster on its own Redis and makes that Redis forget, as a crash with
``appendfsync no``, a restore from an old snapshot or a FLUSHALL would; or makes git forget, as a power
loss before commits reached the disk would. The submission must then finish with no human action: every
shape complete, each iteration stored exactly once, Redis and the files agreeing, ``croqq validate``
clean and no shape's history reset.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from croqq.chaos.invariants import repo_problems
from croqq.delivery import keys
from croqq.delivery.state import ShapeSummary
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.processes.redis_server import RedisServer
from croqq.store.paths import RunPaths

# each test waits for several events, each with a budget that stretches with the machine's load
pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(3600)]
RUN = "tuning/sm90_Simulated_H100_SXM/cutlass"  # the default (from_current_best) family
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
SHAPES, ITERS = 6, 8


class ForgetfulRedis(RedisServer):
    """The product's Redis, but with ``appendfsync no`` (or loading an RDB snapshot at start)."""

    load_snapshot = False

    def config(self) -> str:
        text = super().config().replace("appendfsync always", "appendfsync no")
        return text.replace("appendonly yes", "appendonly no") if self.load_snapshot else text

    def lose_tail(self, keep_bytes: int) -> int:
        """After a kill: cut the append-only file back to ``keep_bytes`` (what reached the disk before a
        power loss); returns the bytes lost."""
        (aof,) = (self.dir / "appendonlydir").glob("*.incr.aof")
        size = aof.stat().st_size
        with aof.open("r+b") as handle:
            handle.truncate(keep_bytes)
        return size - keep_bytes

    def aof_size(self) -> int:
        (aof,) = (self.dir / "appendonlydir").glob("*.incr.aof")
        return aof.stat().st_size

    def restore(self, snapshot: Path) -> None:
        """Start again from an RDB snapshot (its AOF discarded), then turn the AOF back on."""
        shutil.rmtree(self.dir / "appendonlydir", ignore_errors=True)
        shutil.copy(snapshot, self.dir / "dump.rdb")
        self.load_snapshot = True
        self.start()
        self.load_snapshot = False
        self.client().config_set("appendonly", "yes")


@pytest.fixture
def forgetful(short_tmp: Path) -> Iterator[ForgetfulRedis]:
    server = ForgetfulRedis(short_tmp / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def env(cluster_env: dict[str, str], forgetful: ForgetfulRedis) -> dict[str, str]:
    return cluster_env | {
        "CROQQ_BROKER_URL": forgetful.url,
        "CROQQ_SIM_GPUS": "3",
        "CROQQ_TIME_SCALE": "0.002",
        "CROQQ_TEST_BARRIERS": "false",
        "CROQQ_GIT_RECONCILE_EVERY_S": "5",
    }


@contextlib.contextmanager
def tuning(env: dict[str, str]) -> Iterator[LocalCluster]:
    """A local cluster on ``env``, its GPUs up and the test's submission (SHAPES f16 shapes) sent."""
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        cluster.submit("f16", max_iter=ITERS, limit=SHAPES)
        yield cluster


def stored(client: redis.Redis) -> int:
    try:
        return int(client.hget(keys.STATS, "stored") or 0)
    except redis.ConnectionError:
        return 0


def wait_stored(cluster: LocalCluster, client: redis.Redis, more: int, budget_s: float = 300) -> None:
    """Until the cluster stored ``more`` iterations or attempts after now (by Redis's count)."""
    target = stored(client) + more

    def reached() -> bool:
        cluster.poll()
        return stored(client) >= target

    wait_until(reached, budget_s, f"{target} iterations stored (from {target - more})", every_s=0.05)


def wait_finished(
    cluster: LocalCluster, client: redis.Redis, budget_s: float = 600
) -> dict[str, ShapeSummary]:
    """Until every shape Redis knows is done or parked (and there are SHAPES of them); their summaries."""

    def finished() -> dict[str, ShapeSummary] | None:
        cluster.poll()
        raw = client.hgetall(keys.SUMMARY)
        shapes = {sid: ShapeSummary.model_validate_json(v) for sid, v in raw.items()}
        if len(shapes) >= SHAPES and all(s.status in ("done", "error") for s in shapes.values()):
            return shapes
        return None

    return wait_until(finished, budget_s, f"all {SHAPES} shapes done or parked", every_s=0.3)


def assert_nothing_lost(env: dict[str, str], shapes: dict[str, ShapeSummary]) -> None:
    repo = Path(env["CROQQ_RESULTS_REPO"])
    assert {s.status for s in shapes.values()} == {"done"}, {k: s.error for k, s in shapes.items()}
    assert repo_problems(repo) == []  # validate clean, one commit per iteration, fsck clean
    state = json.loads((repo / RUN / "state.json").read_text())["shapes"]
    assert len(state) == SHAPES
    assert all(e["status"] == "done" for e in state.values()), state
    ckpts = [json.loads((repo / PATHS.checkpoint(k)).read_text()) for k in state]
    assert all(c["current_iter"] == ITERS for c in ckpts), ckpts
    for sid, summary in shapes.items():  # Redis and the files agree
        key = sid.rsplit("/", 1)[1]
        ckpt = json.loads((repo / PATHS.checkpoint(key)).read_text())
        assert (summary.current_iter, summary.best_tflops) == (
            ckpt["current_iter"],
            round(ckpt["best_tflops"], 3),
        )
    resets = subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%s", "--grep=Croqq-Reset"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert resets.stdout == "", "a shape's history was deleted"


def test_redis_with_appendfsync_no_killed_under_load_loses_its_tail_and_nothing_is_lost(
    env: dict[str, str], forgetful: ForgetfulRedis
) -> None:
    client = forgetful.client(retries=10)
    lost = 0
    with tuning(env) as cluster:
        for _ in range(3):
            wait_stored(cluster, client, 6)
            on_disk = forgetful.aof_size()  # what a power loss now would keep ...
            wait_stored(cluster, client, 4)  # ... while the cluster goes on
            forgetful.kill()
            lost += forgetful.lose_tail(on_disk)
            forgetful.start()
        shapes = wait_finished(cluster, client)
    assert lost > 0
    assert_nothing_lost(env, shapes)


def test_redis_restored_from_an_old_snapshot_catches_up_with_git(
    env: dict[str, str], forgetful: ForgetfulRedis, tmp_path: Path
) -> None:
    client = forgetful.client(retries=10)
    with tuning(env) as cluster:
        wait_stored(cluster, client, 8)
        before = stored(client)  # the writer goes on storing: SAVE lands between these two reads
        client.save()
        after = stored(client)
        snapshot = tmp_path / "snapshot.rdb"
        shutil.copy(forgetful.dir / "dump.rdb", snapshot)
        wait_stored(cluster, client, 20)  # the snapshot is now many iterations behind git
        at_kill = stored(client)
        forgetful.kill()
        forgetful.restore(snapshot)
        restored = stored(client)  # the snapshot's count (plus any the cluster stored since the restart)
        assert before <= restored < at_kill, (before, after, restored, at_kill)
        shapes = wait_finished(cluster, client)
    assert_nothing_lost(env, shapes)


def test_redis_flushall_mid_run_rebuilds_every_submitted_shape_from_git(
    env: dict[str, str], forgetful: ForgetfulRedis
) -> None:
    client = forgetful.client(retries=10)
    one_each = {"CROQQ_PIPELINE_DEPTH_MODE": "fixed", "CROQQ_PIPELINE_DEPTH": "1"}  # 3 shapes at a time
    with tuning(env | one_each) as cluster:
        wait_stored(cluster, client, 3)  # some shapes have not even started: only the submission has them
        assert client.hlen(keys.SUMMARY) == SHAPES
        started = sum(1 for v in client.hvals(keys.SUMMARY) if json.loads(v)["current_iter"] >= 0)
        assert started < SHAPES
        client.flushall()
        shapes = wait_finished(cluster, client)
    assert_nothing_lost(env, shapes)


def test_git_losing_its_last_commits_rewinds_the_live_loops_instead_of_parking_them(
    env: dict[str, str], forgetful: ForgetfulRedis
) -> None:
    client = forgetful.client(retries=10)
    repo = Path(env["CROQQ_RESULTS_REPO"])
    with tuning(env) as cluster:
        wait_stored(cluster, client, 16)
    # a power loss took the writer's last commits with it (Redis, fsynced, kept what they did)
    subprocess.run(["git", "-C", str(repo), "update-ref", "refs/heads/main", "HEAD~5"], check=True)
    subprocess.run(["git", "-C", str(repo), "reset", "-q", "--hard"], check=True)
    with LocalCluster(env) as cluster:  # no new submission: the cluster resumes on its own
        shapes = wait_finished(cluster, client)
    assert_nothing_lost(env, shapes)
