"""A compact results repo: merged packs hold deltas that git and libgit2 read, unchanged aggregates are not
rewritten, a kill during the writer's repack loses nothing."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pygit2
import pytest

from croqq.store import paths
from croqq.store._delta import append_delta, apply_delta, make_delta
from croqq.store._packstack import MAX_DEPTH
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


@pytest.mark.parametrize(
    ("base", "target"),
    [
        (b"", b"first line\n"),
        (b"a\tb\n" * 50, b"a\tb\n" * 50 + b"one more row\n"),
        (b'{"x": 1,\n "y": 2}\n' * 30, b'{"x": 1,\n "y": 3}\n' * 30),
        (b"".join(b"row %03d of the summary\n" % i for i in range(60)), b"header\n" + b"row 042\n" * 3),
        (bytes(range(256)) * 300, bytes(range(255, -1, -1)) * 301),
    ],
)
def test_a_delta_rebuilds_its_target(base: bytes, target: bytes) -> None:
    assert apply_delta(base, make_delta(base, target)) == target


def test_random_edits_round_trip() -> None:
    rng = random.Random(5)
    base = b"".join(b"line %d %s\n" % (i, b"x" * rng.randint(0, 40)) for i in range(400))
    for _ in range(50):
        target = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(target))
            target[at : at + rng.randint(0, 90)] = bytes(
                rng.randrange(256) for _ in range(rng.randint(0, 90))
            )
        assert apply_delta(base, make_delta(base, bytes(target))) == bytes(target)
    assert apply_delta(base, append_delta(len(base), base + b"tail\n")) == base + b"tail\n"


def test_merged_packs_hold_deltas_that_git_and_libgit2_read(tmp_path: Path) -> None:
    repo = tmp_path / "results"
    reqs = requests(3, 40)
    commits = store(repo, reqs)
    deltas, longest = delta_count(repo)
    assert deltas > len(reqs)  # every STORE's appended logs, checkpoint, state.json and trees
    assert longest <= MAX_DEPTH
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


def test_the_tip_reads_the_same_after_compaction(tmp_path: Path) -> None:
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


KILLER = """
import os, signal, sys, threading, pathlib
from tests.samples import sample_requests, schedule_keys
from croqq.store import _objects
from croqq.store.gitrepo import GitRepo
from croqq.store.writer import ResultsWriter

where, path = sys.argv[1], pathlib.Path(sys.argv[2])
publish, unlink = _objects._publish, pathlib.Path.unlink

def in_merge():
    return threading.current_thread().name == "croqq-pack-merge"

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def killing_publish(folder, final, data, fsync):
    if in_merge() and where == "before-index" and final.suffix == ".idx":
        die()
    publish(folder, final, data, fsync)

def killing_unlink(self, missing_ok=False):
    if in_merge() and where == "before-delete":
        die()
    unlink(self, missing_ok=missing_ok)

_objects._publish = killing_publish
pathlib.Path.unlink = killing_unlink
writer = ResultsWriter(GitRepo(path, sync_worktree=True))
for req in sample_requests("sm90_NVIDIA_H200", "cuda", schedule_keys()[:2], 12, 3):
    print(writer.apply(req).commit, flush=True)
writer.close()
print("not killed", flush=True)
"""


@pytest.mark.parametrize("where", ["before-index", "before-delete"])
def test_a_kill_during_the_repack_loses_no_commit(tmp_path: Path, where: str) -> None:
    repo = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, where, str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    acknowledged = proc.stdout.split()
    assert len(acknowledged) >= 7  # the first merge starts at 8 packs: the initial commit and 7 STOREs
    git(repo, "fsck", "--strict", "--no-dangling")
    history = set(git(repo, "rev-list", "main").split())
    assert set(acknowledged) <= history
    reopened = ResultsWriter(GitRepo(repo, sync_worktree=True))
    reqs = requests(2, 12)
    for req in reqs:
        reopened.apply(req)  # what was stored is acknowledged, the rest stored now
    reopened.close()
    git(repo, "fsck", "--strict", "--no-dangling")
    assert validate_repo(repo, DSL) == []
