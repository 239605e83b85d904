"""Neighbour transfer in the real cluster (Redis server, Celery workers, git): a shape submitted after its
neighbour advanced starts from that neighbour's best kernel, measured on its own GPU and stored once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from croqq.chaos.invariants import iteration_commits, repo_problems
from croqq.delivery import keys
from croqq.delivery.state import ShapeSummary
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths

pytestmark = pytest.mark.slow
GPU = "sm90_Simulated_H100_SXM"
PATHS = RunPaths(GPU, "cuda")  # from scratch: 8 iterations from the naive kernel keep one
FIRST, SECOND = "f16_4096x8192x8192", "f16_4096x8192x4096"


def rounds(repo: Path, key: str) -> list[dict[str, object]]:
    text = (repo / PATHS.rounds_raw(key)).read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_a_shape_submitted_after_its_neighbour_advanced_starts_from_the_neighbours_best(
    cluster_env: dict[str, str],
) -> None:
    with LocalCluster(cluster_env) as cluster:
        cluster.wait_gpus()
        first = cluster.submit("f16", shape="4096x8192x8192", max_iter=8, mode="from_scratch")
        cluster.wait_done(first, timeout_s=300)
        there = ShapeSummary.model_validate_json(cluster.client.hget(keys.SUMMARY, f"{GPU}/cuda/{FIRST}"))
        assert there.best_iter > 0, "the first shape kept nothing in 8 iterations: nothing to transfer"
        second = cluster.submit("f16", shape="4096x8192x4096", max_iter=3, mode="from_scratch")
        snap = cluster.wait_done(second, timeout_s=300)
        assert snap.total.done == 1
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    baseline, offered, *_ = rounds(repo, SECOND)
    idea = offered["idea"]
    assert isinstance(idea, dict) and idea["proposer"] == "neighbour"
    assert idea["summary"] == f"best of {FIRST} ({there.best_tflops:.1f} TFLOPS there)"
    assert offered["gpu_uuid"] == baseline["gpu_uuid"]  # measured on the shape's own GPU, not copied
    measure = offered["measure"]
    assert isinstance(measure, dict) and measure["candidate"]["repeats"] > 0
    commits = iteration_commits(repo)
    assert set(commits.values()) == {1} and sorted(i for _, key, i in commits if key == SECOND) == [
        0,
        1,
        2,
        3,
    ]
    assert repo_problems(repo) == []  # croqq validate's checks, one commit per iteration, git fsck
