"""GitRepo: plumbing commits with a compare-and-swap ref move, a clean working tree, crash leftovers."""

from __future__ import annotations

import multiprocessing
import subprocess
from pathlib import Path
from typing import Any

import pygit2
import pytest

from croqq.errors import ConfigError, InvalidRecordError, RetryableError
from croqq.store.gitrepo import GitRepo


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


def commit_count(repo: Path) -> int:
    return int(git(repo, "rev-list", "--count", "main").strip())


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    return GitRepo(tmp_path / "results")


def test_new_repo_starts_with_one_commit_on_the_branch(repo: GitRepo) -> None:
    assert repo.head() is not None
    assert commit_count(repo.path) == 1
    assert git(repo.path, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert "croqq writer <croqq@localhost>" in git(repo.path, "log", "-1", "--format=%an <%ae>")


def test_commit_is_readable_at_the_tip(repo: GitRepo) -> None:
    commit = repo.commit({"a/b/c.txt": b"one\n", "a/d.txt": b"two\n"}, "add files")
    assert repo.head() == commit
    assert repo.read("a/b/c.txt") == b"one\n"
    assert repo.read("a/missing") is None
    assert repo.read("a") is None
    assert repo.exists("a/b") and repo.is_dir("a/b") and not repo.is_dir("a/d.txt")
    assert repo.list_dir("a") == ["b", "d.txt"]
    assert repo.list_dir("nowhere") == []
    assert git(repo.path, "show", "main:a/b/c.txt") == "one\n"


def test_deleting_a_folder_removes_the_whole_subtree(repo: GitRepo) -> None:
    repo.commit({"a/b/c.txt": b"1", "a/b/d/e.txt": b"2", "a/keep.txt": b"3"}, "add")
    repo.commit({"a/b": None}, "delete a/b")
    assert repo.list_dir("a") == ["keep.txt"]
    assert not (repo.path / "a" / "b").exists()
    repo.commit({"a/keep.txt": None}, "delete the last file")
    assert repo.list_dir("") == []


def test_commit_that_changes_nothing_returns_the_tip(repo: GitRepo) -> None:
    first = repo.commit({"x.txt": b"same"}, "add")
    assert repo.commit({"x.txt": b"same"}, "again") == first
    assert commit_count(repo.path) == 2


def test_paths_that_leave_the_repo_are_refused(repo: GitRepo) -> None:
    for bad in ("../outside.txt", "/abs.txt", "a/../../b", ".git/config", "a//b"):
        with pytest.raises(InvalidRecordError):
            repo.commit({bad: b"x"}, "bad")
    assert commit_count(repo.path) == 1


def test_commit_fails_when_branch_moved_by_another_writer(repo: GitRepo) -> None:
    repo.commit({"mine.txt": b"1"}, "mine")
    other = GitRepo(repo.path, sync_worktree=False)
    other.commit({"theirs.txt": b"2"}, "theirs")
    with pytest.raises(RetryableError, match="moved"):
        repo.commit({"mine.txt": b"lost?"}, "stale")
    assert repo.read("theirs.txt") == b"2"  # the failed attempt refreshed the tip
    repo.commit({"mine.txt": b"3"}, "retry")
    assert repo.read("mine.txt") == b"3" and repo.read("theirs.txt") == b"2"


def test_killed_commit_before_ref_move_leaves_branch_untouched(
    repo: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = repo.commit({"state.json": b"old\n"}, "old")

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("killed before the ref moved")

    monkeypatch.setattr(repo, "_move_ref", killed)
    with pytest.raises(KeyboardInterrupt):
        repo.commit({"state.json": b"new\n", "extra.txt": b"x"}, "new")
    monkeypatch.undo()
    reopened = GitRepo(repo.path)
    assert reopened.head() == before
    assert reopened.read("state.json") == b"old\n" and not reopened.exists("extra.txt")
    assert (repo.path / "state.json").read_bytes() == b"old\n"
    git(repo.path, "fsck", "--no-progress")
    assert git(repo.path, "status", "--porcelain") == ""


def test_git_status_is_clean_after_commits(repo: GitRepo) -> None:
    for i in range(30):
        repo.commit({f"d{i % 3}/f{i}.txt": b"%d\n" % i, "state.json": b"%d\n" % i}, f"commit {i}")
    repo.commit({"d1": None}, "drop d1")
    repo.close()
    assert git(repo.path, "status", "--porcelain") == ""
    git(repo.path, "fsck", "--no-progress")
    assert commit_count(repo.path) == 32
    assert "drop d1" in git(repo.path, "log", "-1", "--format=%s")


def test_many_commits_leave_few_valid_packs(repo: GitRepo) -> None:
    for i in range(150):
        repo.commit(
            {f"k{i % 7}/rounds.jsonl": b"line\n" * (i + 1), f"k{i % 7}/it{i}.txt": b"%d" % i}, f"c{i}"
        )
    assert repo.read("k3/rounds.jsonl") == b"line\n" * 144
    repo.close()  # the last repack
    packs = sorted((repo.path / ".git" / "objects" / "pack").glob("pack-*.idx"))
    assert len(packs) <= 2 * 8
    for idx in packs:
        git(repo.path, "verify-pack", str(idx))
    git(repo.path, "fsck", "--full", "--strict", "--no-progress")
    assert git(repo.path, "show", "main:k6/it146.txt") == "146"


def _read_until_stopped(path: str, ready: Any, stop: Any, errors: Any) -> None:
    reader = GitRepo.open_existing(Path(path))
    ready.set()
    while not stop.is_set():
        try:
            for name in reader.list_dir("d")[-3:]:
                if reader.read(f"d/{name}") is None:
                    errors.put(f"{name}: missing")
        except Exception as exc:  # any failure is the finding
            errors.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow
def test_a_reader_in_another_process_never_misses_a_commit(repo: GitRepo) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, stop, errors = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_read_until_stopped, args=(str(repo.path), ready, stop, errors))
    reader.start()
    assert ready.wait(300)
    try:
        for i in range(1000):  # new packs land within the same second as the reader's last pack scan,
            repo.commit({f"d/f{i}.txt": b"%d" % i}, f"c{i}")  # and merges delete packs it has listed
        repo.close()
    finally:
        stop.set()
        reader.join(120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []


def test_commits_continue_after_an_outside_git_gc(repo: GitRepo) -> None:
    for i in range(12):
        repo.commit({f"a/{i}.txt": b"%d" % i}, f"before gc {i}")
    git(repo.path, "gc", "--quiet", "--prune=now")
    for i in range(12, 40):
        repo.commit({f"a/{i}.txt": b"%d" % i, "b.txt": b"%d" % i}, f"after gc {i}")
    repo.close()
    git(repo.path, "fsck", "--full", "--no-progress")
    assert GitRepo.open_existing(repo.path).read("a/3.txt") == b"3"
    assert git(repo.path, "status", "--porcelain") == ""


def test_git_status_is_clean_after_each_commit_when_commits_are_sparse(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "results", index_flush_s=0.0)
    for i in range(3):
        repo.commit({f"f{i}.txt": b"x", "a/b.txt": b"%d" % i}, f"commit {i}")
        assert git(repo.path, "status", "--porcelain") == ""


def test_interrupted_worktree_update_is_repaired_on_open(
    repo: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.commit({"a.txt": b"1", "gone.txt": b"x"}, "first")
    repo.sync_index()
    monkeypatch.setattr(repo, "_sync_files", lambda *args: None)  # killed right after the ref moved
    repo.commit({"a.txt": b"2", "b/c.txt": b"3", "gone.txt": None}, "second")
    monkeypatch.undo()
    assert git(repo.path, "status", "--porcelain") != ""
    GitRepo(repo.path).close()
    assert (repo.path / "a.txt").read_bytes() == b"2"
    assert (repo.path / "b" / "c.txt").read_bytes() == b"3"
    assert not (repo.path / "gone.txt").exists()
    assert git(repo.path, "status", "--porcelain") == ""


def test_without_worktree_sync_only_the_branch_changes(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "results", sync_worktree=False)
    repo.commit({"a.txt": b"1"}, "first")
    assert not (repo.path / "a.txt").exists()
    assert git(repo.path, "show", "main:a.txt") == "1"


def test_push_sends_the_branch_to_the_remote(repo: GitRepo, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    pygit2.init_repository(str(remote), bare=True)
    head = repo.commit({"a.txt": b"1"}, "first")
    repo.push(str(remote))
    assert git(remote, "rev-parse", "refs/heads/main").strip() == head


def test_push_failure_raises_retryable_error_with_gits_reason(repo: GitRepo, tmp_path: Path) -> None:
    with pytest.raises(RetryableError, match=r"git push .* failed: .+"):
        repo.push(str(tmp_path / "no-such-remote"))


def test_open_existing_refuses_a_missing_repo_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a git repository"):
        GitRepo.open_existing(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_results_repo_inside_another_repo_is_its_own(tmp_path: Path) -> None:
    pygit2.init_repository(str(tmp_path / "project"))
    repo = GitRepo(tmp_path / "project" / ".croqq" / "results")
    repo.commit({"a.txt": b"1"}, "first")
    assert (tmp_path / "project" / ".croqq" / "results" / ".git").is_dir()
    assert git(repo.path, "rev-parse", "--show-toplevel").strip() == str(repo.path.resolve())
