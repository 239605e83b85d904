"""Upgrading over a results repo of the layout before shapes/: the writer of a real `croqq up` moves it
(one commit) before its first STORE, and the shapes go on from where they stopped, each iteration stored
exactly once (the fixture is described in tests/unit/test_store_layout.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from croqq.chaos.invariants import repo_problems
from croqq.store.gitrepo import GitRepo
from croqq.store.load import load_checkpoint
from croqq.store.paths import RunPaths
from tests.conftest import CroqqCli

pytestmark = pytest.mark.slow
BUNDLE = Path(__file__).resolve().parents[1] / "fixtures" / "results-before-shapes.bundle"
RUN = RunPaths("sm90_Simulated_H100_SXM", "cuda")


@pytest.mark.timeout(2400)
def test_up_over_an_old_layout_repo_moves_it_and_goes_on(tmp_path: Path, croqq: CroqqCli) -> None:
    results = tmp_path / "results"
    subprocess.run(["git", "clone", "-q", "-b", "main", str(BUNDLE), str(results)], check=True)
    env = {
        "CROQQ_RUN_DIR": str(tmp_path / "run"),
        "CROQQ_RESULTS_REPO": str(results),
        "CROQQ_TIME_SCALE": "0.02",
    }
    argv = ["--dtype", "all", "--limit", "4", "--max-iter", "14", "--sim-gpus", "2", "--exit-when-done"]
    done = croqq(env, "up", *argv, timeout=1800)  # a whole run: its own waits stretch with the load
    assert done.returncode == 0, done.stdout + done.stderr

    log = subprocess.run(
        ["git", "-C", str(results), "log", "--format=%s"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert len([s for s in log if s.startswith("layout: ")]) == 1
    upgraded = sorted(s.split()[0] for s in log if " iter013: " in s or " iter014: " in s)
    assert len(upgraded) == 8 and len(set(upgraded)) == 4  # the old run's shapes, two more iterations each
    repo = GitRepo.open_existing(results)
    for key in set(upgraded):
        ckpt = load_checkpoint(repo, RUN.gpu, RUN.dsl, key)
        assert ckpt is not None and (ckpt.current_iter, ckpt.max_iter, ckpt.status) == (14, 14, "done")
    assert not any(repo.exists(folder) for folder in RUN.legacy_dirs())
    repo.close()
    assert repo_problems(results) == []  # valid, and every iteration committed exactly once
