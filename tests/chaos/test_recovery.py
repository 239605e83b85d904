"""Cold start (Redis emptied mid-sweep) and damaged results trees: the repo is the durable truth."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from croqq.chaos.invariants import repo_problems
from croqq.delivery import keys
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths

pytestmark = pytest.mark.chaos
RUN = "tuning/sm90_Simulated_H100_SXM/cutlass"  # the default (from_current_best) family
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture


@pytest.fixture
def env(cluster_env: dict[str, str]) -> dict[str, str]:
    """The shared small cluster, with three GPUs and short (scaled) step times."""
    return cluster_env | {"CROQQ_SIM_GPUS": "3", "CROQQ_TIME_SCALE": "0.002"}


def stored(client: redis.Redis) -> int:
    return int(client.hget(keys.STATS, "stored") or 0)


def checkpoint(repo: Path, key: str) -> dict[str, object]:
    return json.loads((repo / PATHS.checkpoint(key)).read_text())


@pytest.mark.timeout(1800)
def test_cold_start_rebuilds_from_the_repo_and_finishes_with_every_invariant(
    env: dict[str, str], redis_client: redis.Redis
) -> None:
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        cluster.submit("f16", max_iter=8, limit=6)
        wait_until(lambda: stored(redis_client) >= 20, 300, "20 iterations stored", every_s=0.05)
        redis_client.flushall()  # mid-sweep: every live record, queue and lease is gone

        def rebuilt() -> bool:
            cluster.poll()
            return redis_client.scard(keys.SHAPES) > 0

        wait_until(rebuilt, 300, "the coordinator to rebuild live state from the repo", every_s=0.2)
    with LocalCluster(env) as cluster:  # restart the cluster, as `croqq up --dtype f16` would
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=8, limit=6)
        snap = cluster.wait_done(sub, timeout_s=600)
    assert snap.total.done == 6 and snap.total.error == 0
    repo = Path(env["CROQQ_RESULTS_REPO"])
    assert repo_problems(repo) == []
    state = json.loads((repo / RUN / "state.json").read_text())["shapes"]
    assert len(state) == 6 and all(e["status"] == "done" for e in state.values())
    assert all(checkpoint(repo, key)["current_iter"] == 8 for key in state)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def damage(repo: Path, keys_: list[str]) -> None:
    """Commit four kinds of damage (as a careless hand edit would) to four shapes."""
    a, b, c, d = keys_
    tsv = repo / PATHS.results_tsv(a)
    tsv.write_text(tsv.read_text()[:-25])  # truncated mid-row
    ckpt_path = repo / PATHS.checkpoint(b)
    ckpt = json.loads(ckpt_path.read_text())
    ckpt["best_kernel"] = "../../outside/best.cu"
    ckpt_path.write_text(json.dumps(ckpt, indent=2))
    src = next((repo / PATHS.srcs_dir(c)).iterdir())
    src.write_text('#include "/usr/include/stdio.h"\n' + src.read_text())
    (repo / PATHS.checkpoint(d)).unlink()
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=careless", "-c", "user.email=c@x", "commit", "-qm", "hand edit")


@pytest.mark.timeout(1800)
def test_damaged_trees_are_named_cleaned_alone_and_the_cluster_resumes_the_rest(
    env: dict[str, str], redis_client: redis.Redis, croqq: Cli
) -> None:
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=3, limit=6)
        cluster.wait_done(sub, timeout_s=300)
    repo = Path(env["CROQQ_RESULTS_REPO"])
    all_keys = sorted(json.loads((repo / RUN / "state.json").read_text())["shapes"])
    damaged, healthy = all_keys[:4], all_keys[4:]
    damage(repo, damaged)

    report = croqq(env, "validate", "--dsl", "all")
    assert report.returncode == 1
    named = {key for key in damaged if key in report.stdout}
    assert named == set(damaged), report.stdout
    assert "results.tsv" in report.stdout and "outside the repo" in report.stdout
    assert (
        '#include "/usr/include/stdio.h" is absolute' in report.stdout
        and "without checkpoint" in report.stdout
    )
    assert not any(key in report.stdout for key in healthy)

    cleaned = croqq(env, "clean", "--dsl", "cutlass", "--invalid-only")
    assert cleaned.returncode == 0, cleaned.stderr
    assert all(key in cleaned.stdout for key in damaged) and not any(key in cleaned.stdout for key in healthy)
    assert croqq(env, "validate", "--dsl", "all").returncode == 0

    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=3, limit=6)
        snap = cluster.wait_done(sub, timeout_s=300)
    assert snap.total.done == 6
    state = json.loads((repo / RUN / "state.json").read_text())["shapes"]
    assert sorted(state) == all_keys and all(checkpoint(repo, key)["current_iter"] == 3 for key in state)
    assert repo_problems(repo) == []
