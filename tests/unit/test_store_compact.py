"""A compact results repo: git's repack, run by the writer, leaves few packs with deltas that git and
libgit2 read, also merges the packs killed writers left, never holds a commit, and a kill during it
loses nothing; unchanged aggregates are not rewritten."""

from __future__ import annotations

import fcntl
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pygit2
import pytest

from croqq.patience import wait_until
from croqq.store import paths
from croqq.store._repack import COMMAND, LOCK_NAME, Repacker, repack
from croqq.store.gitrepo import GitRepo
from croqq.store.validate import validate_repo
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests, schedule_keys

GPU, DSL = "sm90_NVIDIA_H200", "cuda"
RUN = paths.RunPaths(GPU, DSL)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


def requests(keys: int, depth: int, seed: int = 3) -> list:
    return list(sample_requests(GPU, DSL, schedule_keys()[:keys], depth, seed))


def store(path: Path, reqs: list) -> list[str]:
    writer = ResultsWriter(GitRepo(path, sync_worktree=True))
    commits = [writer.apply(req).commit for req in reqs]
    writer.close()
    return commits


def delta_count(repo: Path) -> tuple[int, int]:
    """(objects stored as deltas, longest chain) over every pack of the repo."""
    deltas, longest = 0, 0
    for idx in sorted((repo / ".git" / "objects" / "pack").glob("*.idx")):
        for line in git(repo, "verify-pack", "-v", str(idx)).splitlines():
            fields = line.split()
            if len(fields) == 7 and len(fields[0]) == 40:
                deltas += 1
                longest = max(longest, int(fields[5]))
    return deltas, longest


def test_repacked_packs_hold_deltas_that_git_and_libgit2_read(tmp_path: Path) -> None:
    repo = tmp_path / "results"
    reqs = requests(3, 40)
    commits = store(repo, reqs)
    deltas, _ = delta_count(repo)
    assert deltas > len(reqs)  # every STORE's appended logs, checkpoint, state.json and trees
    git(repo, "fsck", "--strict", "--full", "--no-dangling")
    assert git(repo, "rev-list", "--count", "main").strip() == str(len(commits) + 1)  # + the initial one
    assert git(repo, "log", "-1", "--format=%H").strip() == commits[-1]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    git(clone, "fsck", "--strict", "--no-dangling")
    assert git(clone, "rev-parse", "HEAD").strip() == commits[-1]
    lib = pygit2.Repository(str(repo))  # libgit2 reads every object of every commit, ids checked
    for commit in lib.walk(lib.head.target):
        stack = [commit.tree]
        while stack:
            for entry in stack.pop():
                obj = lib[entry.id]
                if isinstance(obj, pygit2.Tree):
                    stack.append(obj)
                else:
                    assert pygit2.hash(obj.read_raw()) == entry.id
    assert validate_repo(repo, DSL) == []


def test_the_tip_reads_the_same_after_the_last_repack(tmp_path: Path) -> None:
    repo = tmp_path / "results"
    reqs = requests(2, 20)
    writer = ResultsWriter(GitRepo(repo, sync_worktree=False))
    for req in reqs:
        writer.apply(req)
    before = {p: writer.repo.read(p) for p in (RUN.state_json, RUN.results_tsv(reqs[0].key))}
    writer.close()
    reopened = GitRepo.open_existing(repo)
    assert {p: reopened.read(p) for p in before} == before
    reopened.close()


def changed_paths(repo: Path, commit: str) -> set[str]:
    return set(git(repo, "diff-tree", "-r", "--name-only", "--no-commit-id", commit).split())


def test_a_store_that_changes_no_aggregate_does_not_rewrite_it(tmp_path: Path) -> None:
    repo = tmp_path / "results"
    reqs = requests(1, 30, seed=11)
    attempt = next(i for i, r in enumerate(reqs) if r.kind == "attempt")
    commits = store(repo, reqs[: attempt + 1])
    touched = changed_paths(repo, commits[-1])
    assert RUN.attempts(reqs[attempt].key) in touched
    assert RUN.state_json not in touched  # an attempt changes no state.json entry
    assert RUN.checkpoint(reqs[attempt].key) in touched
    iteration = changed_paths(repo, commits[attempt - 1])
    assert RUN.state_json in iteration


def test_rewriting_a_file_with_its_own_bytes_writes_no_commit(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "results", sync_worktree=False)
    first = repo.commit({"a/b.txt": b"one\n", "a/c.txt": b"two\n"}, "first")
    assert repo.commit({"a/b.txt": b"one\n"}, "same bytes") == first
    repo.close()


def packs(repo: Path) -> list[Path]:
    return sorted((repo / ".git" / "objects" / "pack").glob("*.pack"))


def geometric_bound(repo: Path) -> int:
    """The most packs a geometric (factor 2) repack leaves: each holds at least twice the objects of the
    next smaller one."""
    count = sum(
        int(line.split()[1])
        for line in git(repo, "count-objects", "-v").splitlines()
        if line.split()[0] in ("count:", "in-pack:")
    )
    return int(math.log2(count)) + 1


def test_commits_never_wait_for_a_repack_and_few_packs_are_left(tmp_path: Path) -> None:
    path = tmp_path / "results"
    repo = GitRepo(path, sync_worktree=False, repack_every=4)
    repo.commit({"a.txt": b"0\n"}, "first")
    lock = os.open(path / ".git" / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as if another process were repacking: every repack now is skipped
    for i in range(1, 41):
        repo.commit({"a.txt": b"%d\n" % i * i, f"d/{i}.txt": b"%d" % i}, f"c{i}")
    assert len(packs(path)) >= 40  # nothing waited for the lock, nothing was repacked
    os.close(lock)
    repo.close()  # the last repack
    assert len(packs(path)) <= geometric_bound(path)
    git(path, "fsck", "--strict", "--no-dangling")
    assert git(path, "show", "main:d/40.txt") == "40"


def test_close_repacks_only_what_no_finished_repack_covers(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "results", sync_worktree=False)
    repo.commit({"a.txt": b"0"}, "first")
    gitdir = repo.path / ".git"
    repacker = Repacker(gitdir, every=2)
    for i in (1, 2):
        repo.commit({"a.txt": b"%d" % i}, f"c{i}")
        repacker.poke()
    wait_until(lambda: repacker.done == 1, 30.0, "the repack due after two commits")
    repacker.close()
    assert repacker.done == 1  # nothing committed since: close runs no git
    lock = os.open(gitdir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the next due repack is skipped: its commits stay pending
    repacker = Repacker(gitdir, every=2)
    for i in (3, 4):
        repo.commit({"a.txt": b"%d" % i}, f"c{i}")
        repacker.poke()
    os.close(lock)
    repacker.close()
    assert repacker.done >= 1
    assert len(packs(repo.path)) == 1
    repo.close()


def test_two_repacks_never_run_at_once(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "results", sync_worktree=False)
    repo.commit({"a.txt": b"1"}, "one")
    gitdir = repo.path / ".git"
    lock = os.open(gitdir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    assert repack(gitdir) is False
    os.close(lock)
    assert repack(gitdir) is True
    repo.close()


KILLED = """
import pathlib, sys
from croqq.store.gitrepo import GitRepo
repo = GitRepo(pathlib.Path(sys.argv[1]), sync_worktree=False, repack_every=0)
for i in range(10**6):
    changes = {"log.txt": b"%d\\n" % i * 50, f"r{sys.argv[2]}/{i}.txt": b"%d" % i}
    print(repo.commit(changes, f"c{i}"), flush=True)
"""


def kill_after(path: Path, run: int, commits: int) -> list[str]:
    """Start a writer process, let it acknowledge ``commits`` commits, SIGKILL it; its commit ids."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path), str(run)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    done = [proc.stdout.readline().strip() for _ in range(commits)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(120)
    return done


def test_packs_left_by_killed_writers_are_merged_by_the_next_writer(tmp_path: Path) -> None:
    path = tmp_path / "results"
    GitRepo(path, sync_worktree=False).close()
    lock = os.open(path / ".git" / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the killed writers get no repack done: all their packs are left
    acknowledged = [c for run in range(6) for c in kill_after(path, run, 8)]
    os.close(lock)
    left = len(packs(path))
    assert left >= 6 * 8
    repo = GitRepo(path, sync_worktree=False)
    repo.commit({"next.txt": b"1"}, "the next writer")
    repo.close()
    assert len(packs(path)) <= geometric_bound(path) < left
    git(path, "fsck", "--strict", "--no-dangling")
    assert set(acknowledged) <= set(git(path, "rev-list", "main").split())


@pytest.mark.parametrize("after_s", [0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
def test_a_repack_killed_midway_leaves_a_valid_repo(tmp_path: Path, after_s: float) -> None:
    path = tmp_path / "results"
    repo = GitRepo(path, sync_worktree=False, repack_every=0)
    lock = os.open(path / ".git" / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # no repack of the writer's own meanwhile
    commits = [repo.commit({"log.txt": b"row\n" * i, f"d/{i}.txt": b"%d" % i}, f"c{i}") for i in range(60)]
    proc = subprocess.Popen(["git", "-C", str(path), *COMMAND], start_new_session=True)
    time.sleep(after_s)
    os.killpg(proc.pid, signal.SIGKILL)  # git and its pack-objects, wherever they are
    proc.wait(120)
    git(path, "fsck", "--strict", "--no-dangling")
    assert set(commits) <= set(git(path, "rev-list", "main").split())
    os.close(lock)
    repo.commit({"after.txt": b"1"}, "after the killed repack")
    repo.close()
    git(path, "fsck", "--strict", "--no-dangling")
    assert len(packs(path)) <= geometric_bound(path)


class LooseRepo(GitRepo):
    """The writer over loose objects (its path for object stores the per-commit pack cannot serve)."""

    def _packable(self) -> bool:
        return False


def test_loose_object_commits_survive_repacks_running_beside_them(tmp_path: Path) -> None:
    path = tmp_path / "results"
    repo = LooseRepo(path, sync_worktree=False, repack_every=2)  # prune-packed removes folders meanwhile
    commits = [
        repo.commit({f"d{i % 5}/{i}.txt": b"%d" % i, "log.txt": b"row\n" * i}, f"c{i}") for i in range(150)
    ]
    repo.close()
    git(path, "fsck", "--strict", "--no-dangling")
    assert git(path, "rev-parse", "main").strip() == commits[-1]
