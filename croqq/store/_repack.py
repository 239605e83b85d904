"""git's own repack, run by the writer in the background: ``git repack -d --geometric=2``.

Each commit leaves one small pack; a geometric repack rolls the small packs (and any loose objects) into
bigger ones with git's delta compression, so the pack count stays about logarithmic in the repo's size.
It also merges packs that earlier, killed writer processes left, since it works on whatever is on disk.
A repack is due every ``every`` commits, at close when anything was committed since the last one, and
at the writer's first commit when the folder already holds more than ``every`` packs (left by a killed
writer). git runs at a lower CPU priority (``nice``), so on a small machine the writer's commits come
first.

The thread only runs ``git``; a commit never waits for it. At most one repack runs on a repo at a time,
also across processes: an exclusive ``flock`` on ``<gitdir>/croqq-repack.lock`` is taken before git
starts and passed to it, so a repack that outlives a killed writer still holds it (the kernel drops it
when git exits). git's repack writes the new pack before it deletes the ones it replaces, so a kill at
any moment leaves every object in some pack. A repack that fails (a full disk) leaves its temporary
files behind; they are deleted, so a failed repack takes no space.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

log = logging.getLogger(__name__)

REPACK_EVERY = 32  # commits between two background repacks
REPACK_TIMEOUT_S = 3600.0
LOCK_NAME = "croqq-repack.lock"
COMMAND = ["-c", "pack.threads=1", "repack", "-d", "-q", "-n", "--geometric=2"]


def repack(gitdir: Path, wait: bool = False) -> bool:
    """Run one geometric repack of ``gitdir``; False when another is running (``wait``: wait for it
    first) or git failed (logged: a repack only saves space and lookups)."""
    fd = os.open(gitdir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            log.debug("%s: a repack is running already", gitdir)
            return False
        before = set(_git_temp_files(gitdir))
        nice = ["nice", "-n", "10"] if shutil.which("nice") else []
        cmd = [*nice, "git", f"--git-dir={gitdir}", *COMMAND]
        try:
            proc = subprocess.run(
                cmd, pass_fds=(fd,), capture_output=True, text=True, timeout=REPACK_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s: git repack did not finish: %s", gitdir, exc)
            return False
        if proc.returncode != 0:
            log.warning("%s: git repack failed: %s", gitdir, proc.stderr.strip() or proc.returncode)
            for left in set(_git_temp_files(gitdir)) - before:
                with contextlib.suppress(OSError):
                    left.unlink()
            return False
        return True
    finally:
        os.close(fd)


def _git_temp_files(gitdir: Path) -> list[Path]:
    """git's own temporary files in the pack folder (the writer's are ``tmp_pack_croqq_*``)."""
    folder = gitdir / "objects" / "pack"
    found = [*folder.glob("tmp_*"), *folder.glob(".tmp-*")]
    return [p for p in found if not p.name.startswith("tmp_pack_croqq_")]


class Repacker:
    """Background repacks of one repo: :meth:`poke` after each commit, :meth:`close` at the end."""

    def __init__(self, gitdir: Path, every: int = REPACK_EVERY) -> None:
        self.gitdir = gitdir
        self.every = every
        self.done = 0  # repacks finished (the owner reopens its handle when this changes)
        self._commits = 0  # since the last repack fell due
        self._due = every > 0 and len(list((gitdir / "objects" / "pack").glob("*.pack"))) > every
        self._pending = int(self._due)  # commits (or leftover packs) that no finished repack covers yet
        self._closing = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="croqq-repack", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """One more commit; every ``every`` commits a repack is due (never blocks on one running)."""
        with self._wake:
            self._commits += 1
            self._pending += 1
            if self.every and self._commits >= self.every:
                self._commits, self._due = 0, True
                self._wake.notify()

    def close(self) -> None:
        """Wait for the repack in flight, then run a last one unless a finished one covers every commit
        (a writer that stops right after a repack does not run git again)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        if self._pending:
            self._repack(wait=True)

    def _repack(self, wait: bool = False) -> None:
        with self._wake:
            covered = self._pending  # what is on disk as git starts
        if repack(self.gitdir, wait):
            with self._wake:
                self._pending -= covered
            self.done += 1

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                self._due = False
            try:
                self._repack()
            except Exception as exc:  # never end the thread: the next repack that is due retries
                log.warning("%s: repack skipped: %s", self.gitdir, exc)
