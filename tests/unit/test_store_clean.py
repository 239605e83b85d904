"""clean: reset exactly the shapes asked for, in one commit, and nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from croqq.store import paths
from croqq.store.clean import clean
from croqq.store.gitrepo import GitRepo
from croqq.store.load import load_state
from croqq.store.validate import validate_repo
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests

GPU, DSL = "sm90_NVIDIA_H200", "cuda"
DONE = ["f16_4096x8192x8192"]
ACTIVE = ["e4m3_2048x2048x2048", "f16_512x512x512", "f16_256x256x256"]
RUN = paths.RunPaths(GPU, DSL)


def subjects(repo: GitRepo) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo.path), "log", "--format=%s", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    repo = GitRepo(tmp_path / "results")
    writer = ResultsWriter(repo)
    for req in sample_requests(GPU, DSL, DONE, 4, 5, max_iter=3):
        writer.apply(req)
    for req in sample_requests(GPU, DSL, ACTIVE, 3, 6, max_iter=30):
        writer.apply(req)
    writer.apply(next(sample_requests("sm90_NVIDIA_H100_80GB_HBM3", "triton", ACTIVE[:1], 1, 7)))
    return repo


def shape_paths(key: str, run: paths.RunPaths = RUN) -> list[str]:
    return run.shape_files(key)


def test_clean_invalid_only_resets_only_invalid_shapes(repo: GitRepo) -> None:
    bad = ACTIVE[1]
    repo.commit({RUN.results_tsv(bad): b"iter\tkernel\n"}, "corrupt")
    before = {p: repo.read(p) for key in DONE + ACTIVE for p in shape_paths(key) if repo.read(p) is not None}
    report = clean(repo, DSL, invalid_only=True)
    assert report.keys == [bad] and report.reset == [(GPU, DSL, bad)] and report.unresolved == []
    assert not any(repo.exists(p) for p in shape_paths(bad))
    state = load_state(repo, GPU, DSL)
    assert state is not None and bad not in state.shapes and set(state.shapes) == set(DONE + ACTIVE) - {bad}
    assert all(repo.read(p) == data for p, data in before.items() if bad not in p)
    assert subjects(repo)[0] == f"clean: reset 1 invalid shape(s): {bad}"
    assert validate_repo(repo.path, None) == []


def test_clean_invalid_only_on_a_sound_repo_commits_nothing(repo: GitRepo) -> None:
    head = repo.head()
    report = clean(repo, None, invalid_only=True)
    assert report.commit is None and report.reset == [] and repo.head() == head


def test_clean_resets_all_active_state_and_keeps_complete_shapes(repo: GitRepo) -> None:
    report = clean(repo, DSL, invalid_only=False)
    assert sorted(report.keys) == sorted(ACTIVE)
    assert subjects(repo)[0].startswith(f"clean: reset {len(ACTIVE)} active shape(s): ")
    assert report.commit == repo.head()
    state = load_state(repo, GPU, DSL)
    assert state is not None and list(state.shapes) == DONE
    assert all(repo.exists(p) for p in shape_paths(DONE[0]))
    assert not any(repo.exists(p) for key in ACTIVE for p in shape_paths(key))
    assert repo.exists(paths.best_kernel("gemm", "f16", DONE[0], "cu"))
    assert validate_repo(repo.path, None) == []


def test_clean_makes_exactly_one_commit(repo: GitRepo) -> None:
    count = len(subjects(repo))
    clean(repo, None, invalid_only=False)
    assert len(subjects(repo)) == count + 1


def test_clean_touches_only_the_requested_dsl(repo: GitRepo) -> None:
    triton = paths.RunPaths("sm90_NVIDIA_H100_80GB_HBM3", "triton")
    report = clean(repo, DSL, invalid_only=False)
    assert all(dsl == DSL for _, dsl, _ in report.reset)
    assert repo.exists(triton.checkpoint(ACTIVE[0]))
    report = clean(repo, "all", invalid_only=False)
    assert report.reset == [("sm90_NVIDIA_H100_80GB_HBM3", "triton", ACTIVE[0])]
    assert not repo.exists(triton.checkpoint(ACTIVE[0]))


def test_clean_invalid_only_leaves_problems_of_no_shape_unresolved(repo: GitRepo) -> None:
    registry = paths.best_kernel("gemm", "f16", DONE[0], "cu")
    repo.commit({registry: b'#include "/etc/passwd"\n'}, "corrupt the registry")
    report = clean(repo, None, invalid_only=True)
    assert report.commit is None and [p.path for p in report.unresolved] == [registry]


def test_git_status_is_clean_after_clean(repo: GitRepo) -> None:
    clean(repo, None, invalid_only=False)
    repo.close()
    out = subprocess.run(
        ["git", "-C", str(repo.path), "status", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout
    assert out == ""
    assert not (repo.path / RUN.srcs_dir(ACTIVE[0])).exists()
