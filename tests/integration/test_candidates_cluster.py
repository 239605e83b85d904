"""A real local cluster with ``--candidates 3``: every iteration gathers three candidates, is stored exactly
once with its two siblings (their TFLOPS and stored sources), and the results repo validates."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.chaos.invariants import iteration_commits, repo_problems
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths

pytestmark = pytest.mark.slow
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture


@pytest.mark.timeout(900)
def test_three_candidates_per_iteration_are_stored_once_with_every_sibling(
    cluster_env: dict[str, str], croqq: Cli
) -> None:
    env = {**cluster_env, "CROQQ_SIM_GPUS": "1"}
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        done = croqq(env, "submit", "--dtype", "f16", "--limit", "2", "--max-iter", "3", "--candidates", "3")
        assert done.returncode == 0, done.stderr
        submission = re.search(r"\bas (sub-\S+):", done.stdout)
        assert submission is not None, done.stdout
        snap = cluster.wait_done(submission.group(1), timeout_s=600)
        assert snap.total.done == 2 and snap.total.iters_done == 8
    repo = Path(env["CROQQ_RESULTS_REPO"])
    iterations = iteration_commits(repo)
    assert len(iterations) == 8 and set(iterations.values()) == {1}  # one iteration id, one commit each
    state = json.loads((repo / PATHS.root / "state.json").read_text())["shapes"]
    for key in state:
        rounds = [json.loads(line) for line in (repo / PATHS.rounds_raw(key)).read_text().splitlines()]
        assert [r["iteration"] for r in rounds] == [0, 1, 2, 3]
        for rnd in rounds[1:]:
            numbers = sorted([rnd["candidate"], *(s["candidate"] for s in rnd["siblings"])])
            assert numbers == [1, 2, 3], rnd["siblings"]
            for sib in rnd["siblings"]:
                if sib["measurement"] is not None:  # measured in the batch: its TFLOPS and its source kept
                    assert sib["measurement"]["tflops"] >= 0 and (repo / sib["kernel"]).is_file()
                else:
                    assert sib["repeat_of"] or sib["rejection"] or sib["built"] is False
            measured = [s["measurement"]["tflops"] for s in rnd["siblings"] if s["measurement"]]
            if rnd["measure"]["candidate"]["outcome"] == "ok":  # the best of the batch went to DECIDE
                assert all(rnd["measure"]["candidate"]["tflops"] >= t for t in measured)
    assert repo_problems(repo) == []
    check = croqq(env, "validate", "--dsl", "cutlass")
    assert check.returncode == 0 and "results repo is valid" in check.stdout, check.stdout + check.stderr
