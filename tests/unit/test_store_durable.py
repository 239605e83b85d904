"""Durable commits: fsync order around the ref move, lock files only a killed writer left, async pushes."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pygit2
import pytest
import redis

from croqq.delivery import keys
from croqq.errors import RetryableError
from croqq.patience import wait_until
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.settings import Settings
from croqq.store._locks import MARKER
from croqq.store.gitrepo import GitRepo
from croqq.store.push import Pusher
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests, schedule_keys

FIRST = "host:101:aaaa:writer"
SECOND = "host:202:bbbb:writer"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


def remote_head(remote: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(remote), "rev-parse", "refs/heads/main"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


# -- fsync order --------------------------------------------------------------------------------


class FsyncSpy:
    """Records every os.fsync as (what, tip on disk at that moment); what: pack, idx (by magic, with the
    file's name then), or the path relative to the git folder."""

    def __init__(self, gitdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gitdir = gitdir
        self.calls: list[tuple[str, str, str]] = []  # (what, name at fsync time, ref on disk)
        real = os.fsync

        def spy(fd: int) -> None:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            what = (
                path.relative_to(gitdir).as_posix() if gitdir in path.parents or path == gitdir else str(path)
            )
            if path.is_file() and path.parent.name == "pack":
                magic = path.read_bytes()[:4]
                what = {b"PACK": "pack", b"\xfftOc": "idx"}.get(magic, what)
            self.calls.append((what, path.name, self.ref()))
            real(fd)

        monkeypatch.setattr(os, "fsync", spy)

    def ref(self) -> str:
        return (self.gitdir / "refs" / "heads" / "main").read_text().strip()

    def first(self, what: str) -> int:
        return next(i for i, call in enumerate(self.calls) if call[0] == what)


def test_pack_and_its_folder_are_fsynced_before_the_ref_moves_and_the_ref_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = GitRepo(tmp_path / "results")
    old = repo.head()
    spy = FsyncSpy(repo.path / ".git", monkeypatch)
    new = repo.commit({"a/b.txt": b"1", "c.txt": b"2"}, "one commit")
    calls = spy.calls
    whats = [c[0] for c in calls]
    pack, idx, folder = spy.first("pack"), spy.first("idx"), spy.first("objects/pack")
    ref, ref_dir = spy.first("refs/heads/main"), spy.first("refs/heads")
    assert pack < idx < folder < ref < ref_dir, whats
    for i in (pack, idx):  # the data, under its temporary name: fsynced before the rename
        assert calls[i][1].startswith("tmp_pack_croqq_") and calls[i][2] == old
    assert calls[folder][2] == old  # the new names are durable while the branch still points at old
    assert calls[ref][2] == new and calls[ref_dir][2] == new


def test_a_store_is_acknowledged_only_after_its_ref_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ResultsWriter(GitRepo(tmp_path / "results"))
    spy = FsyncSpy(writer.repo.path / ".git", monkeypatch)
    req = next(sample_requests("sm90_NVIDIA_H200", "cuda", schedule_keys(1), 1, 7))
    receipt = writer.apply(req)
    assert ("refs/heads/main", "main", receipt.commit) in spy.calls
    assert any(what == "pack" for what, _, _ in spy.calls)


def test_without_git_fsync_nothing_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    repo = GitRepo(tmp_path / "results", fsync=False, owner=FIRST)
    for i in range(20):  # enough commits for a background repack
        repo.commit({f"f{i}.txt": b"%d" % i}, f"c{i}")
    repo.close()
    assert calls == []
    assert git(repo.path, "status", "--porcelain") == ""


def test_the_git_fsync_setting_reaches_the_writers_repo(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    settings = Settings(broker_url=redis_server.url, results_repo=tmp_path / "results", git_fsync=False)
    rt = Runtime(settings)
    assert rt.writer.repo.fsync is False
    assert Runtime(settings.model_copy(update={"git_fsync": True})).writer.repo.fsync is True


# -- lock files ---------------------------------------------------------------------------------


def _die_holding_the_ref_lock(path: str) -> None:
    """A writer SIGKILLed inside libgit2's ref move: the lock file is created, the rename never happens."""
    lookup = pygit2.Repository.lookup_reference

    def lookup_then_die(self: pygit2.Repository, name: str) -> pygit2.Reference:
        if sys._getframe(1).f_code.co_name != "_move_ref":  # reading the tip looks the ref up too
            return lookup(self, name)
        fd = os.open(os.path.join(self.path, name + ".lock"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"0" * 40 + b"\n")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    repo = GitRepo(Path(path), owner=FIRST)
    pygit2.Repository.lookup_reference = lookup_then_die  # type: ignore[method-assign]
    repo.commit({"a.txt": b"never stored"}, "killed mid-move")


def _killed_writer(path: Path) -> Path:
    """Run a first writer that dies holding the branch's lock; returns the lock file."""
    child = multiprocessing.get_context("spawn").Process(target=_die_holding_the_ref_lock, args=(str(path),))
    child.start()
    child.join(300)
    assert child.exitcode == -signal.SIGKILL
    lock = path / ".git" / "refs" / "heads" / "main.lock"
    assert lock.exists()
    return lock


def test_a_lock_left_by_a_killed_writer_is_removed_and_the_next_writer_commits(tmp_path: Path) -> None:
    path = tmp_path / "results"
    lock = _killed_writer(path)
    with pytest.raises(RetryableError):  # what every STORE would get if nobody removed it
        GitRepo(path).commit({"a.txt": b"1"}, "blocked")
    repo = GitRepo(path, owner=SECOND, previous_gone=lambda owner: owner == FIRST)
    assert not lock.exists()
    repo.commit({"a.txt": b"1"}, "works again")
    repo.close()
    assert git(path, "show", "main:a.txt") == "1"
    assert SECOND in (path / ".git" / MARKER).read_text()


@pytest.mark.parametrize("case", ["lease still held", "lock older than the record"])
def test_a_killed_writers_lock_is_kept_when_that_cannot_be_proven(tmp_path: Path, case: str) -> None:
    path = tmp_path / "results"
    lock = _killed_writer(path)
    if case == "lock older than the record":  # someone else's, taken before the writer tried
        old = time.time() - 3600
        os.utime(lock, (old, old))
    GitRepo(path, owner=SECOND, previous_gone=lambda owner: case != "lease still held")
    assert lock.exists()


def test_a_foreign_lock_is_left_in_place_and_named_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "results"
    first = GitRepo(path, owner=FIRST)
    first.commit({"a.txt": b"1"}, "first writer")
    first.close()
    gitdir = path / ".git"
    foreign = [gitdir / "refs" / "heads" / "main.lock", gitdir / "index.lock"]  # a human's git command
    for lock in foreign:
        lock.write_text("")
    with caplog.at_level(logging.WARNING, logger="croqq.store._locks"):
        repo = GitRepo(path, owner=SECOND, previous_gone=lambda owner: True)
    assert all(lock.exists() for lock in foreign)
    for lock in foreign:
        assert any(f"rm {lock}" in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(RetryableError):
        repo.commit({"a.txt": b"2"}, "waits for the foreign command")


# -- pushes -------------------------------------------------------------------------------------


def _held_remote(tmp_path: Path, held: bool) -> tuple[Path, Path, Path]:
    """A bare remote whose pre-receive hook marks that a push started, then (``held``) waits until the
    test creates the release file. Returns (remote, started, release)."""
    remote, started, release = tmp_path / "remote.git", tmp_path / "push-started", tmp_path / "release"
    pygit2.init_repository(str(remote), bare=True)
    if not held:
        release.touch()
    hook = remote / "hooks" / "pre-receive"
    hook.write_text(
        f'#!/bin/sh\ncat > /dev/null\ntouch "{started}"\nwhile [ ! -e "{release}" ]; do sleep 0.05; done\n'
    )
    hook.chmod(0o755)
    return remote, started, release


def test_a_commit_returns_promptly_while_a_push_hangs_then_the_remote_gets_every_commit(
    tmp_path: Path,
) -> None:
    remote, started, release = _held_remote(tmp_path, held=True)
    repo = GitRepo(tmp_path / "results")
    pusher = Pusher(lambda: repo.push(str(remote)), every_s=0, name="slow").start()
    repo.after_commit = pusher.poke
    try:
        repo.commit({"a.txt": b"0"}, "first")
        wait_until(started.exists, 120, "the push to start")  # held inside the remote's hook
        for i in range(5):
            repo.commit({"a.txt": b"%d" % (i + 1)}, f"c{i}")
        # five commits done while the push is still held: none of them waited for it
        assert remote_head(remote) != repo.head()
    finally:
        release.touch()
    wait_until(lambda: remote_head(remote) == repo.head(), 120, "the remote to get every commit")
    pusher.close()


def test_a_failing_push_is_logged_and_retried_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[float] = []

    def flaky() -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise RetryableError("git push origin failed: connection refused")

    repo = GitRepo(tmp_path / "results")
    pusher = Pusher(flaky, every_s=0, name="origin", retry_s=0.05).start()
    repo.after_commit = pusher.poke
    with caplog.at_level(logging.WARNING, logger="croqq.store.push"):
        repo.commit({"a.txt": b"1"}, "one commit, no further pokes")
        wait_until(lambda: len(attempts) >= 3, 120, "three push attempts")
    time.sleep(0.2)
    assert len(attempts) == 3  # done once a push succeeded
    assert sum("retrying later" in r.getMessage() for r in caplog.records) == 2
    pusher.close()


def test_close_pushes_what_is_pending(tmp_path: Path) -> None:
    pushed = threading.Event()
    pusher = Pusher(pushed.set, every_s=3600, name="later").start()
    pusher.poke()
    wait_until(pushed.is_set, 120, "the first push")
    pushed.clear()
    pusher.poke()  # not due for an hour
    pusher.close(wait_s=120)
    assert pushed.is_set()


def test_the_writer_pushes_in_the_background_with_its_lease_token_on_record(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    remote, _, _ = _held_remote(tmp_path, held=False)
    redis_client.set(keys.lease("writer"), SECOND)
    settings = Settings(
        broker_url=redis_server.url,
        results_repo=tmp_path / "results",
        results_remote=str(remote),
        push_every_s=0,
    )
    rt = Runtime(settings)
    head = rt.writer.repo.commit({"a.txt": b"1"}, "stored")
    assert rt.pusher is not None
    wait_until(lambda: remote_head(remote) == head, 120, "the background push")
    assert SECOND in (tmp_path / "results" / ".git" / MARKER).read_text()
    rt.pusher.close()
    rt.writer.close()
