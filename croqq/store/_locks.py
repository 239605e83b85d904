"""Which git lock files the writer may delete: only the one a killed writer provably left.

A writer killed inside a libgit2 call leaves its lock file (``refs/heads/<branch>.lock``, ``index.lock``)
and every later commit is refused until it is gone; but the same files are what a human's git command
holds while it runs. So the writer records, in ``<gitdir>/croqq-writer.owner``, its lease owner and the
lock it is taking right now (one ``pwrite`` before and after each such call). At start-up the next writer
deletes a lock only if that record names exactly that file, the file was last modified within a minute
after the record, and the previous writer's lease is no longer held; any other lock is left in place,
with one log line naming it and how to fix it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from croqq.store._fsync import fsync_path

log = logging.getLogger(__name__)

MARKER = "croqq-writer.owner"
RECORD_BYTES = 1024  # fixed size: every update is one pwrite at offset 0, never a truncation
CLOCK_SLACK_S = 2.0  # file times come from the kernel's coarse clock, a few ms behind time.time()
HELD_MAX_S = 60.0  # a libgit2 call that takes a lock finishes (or dies) well within this


def _record(owner: str, lock: str | None) -> bytes:
    body = json.dumps({"owner": owner, "lock": lock, "since_ns": time.time_ns()}).encode()
    if len(body) >= RECORD_BYTES:
        raise ValueError(f"writer record too long ({len(body)} bytes): {body[:80]!r}...")
    return body.ljust(RECORD_BYTES - 1) + b"\n"


def _read(marker: Path) -> dict[str, object] | None:
    try:
        data = json.loads(marker.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s): no lock file is treated as a killed writer's", marker, exc)
        return None
    return data if isinstance(data, dict) else None


def lock_files(gitdir: Path) -> list[Path]:
    """Every ``*.lock`` under the git folder (objects/ holds none), sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(gitdir):
        if Path(dirpath) == gitdir and "objects" in dirnames:
            dirnames.remove("objects")
        found += [Path(dirpath) / name for name in filenames if name.endswith(".lock")]
    return sorted(found)


def _left_by(gitdir: Path, previous: dict[str, object] | None, gone: Callable[[str], bool]) -> Path | None:
    """The lock file the previous writer was taking when it died, if the rule above proves it."""
    if previous is None or not isinstance(previous.get("lock"), str):
        return None
    owner, since_ns = previous.get("owner"), previous.get("since_ns")
    if not isinstance(owner, str) or not isinstance(since_ns, int) or not gone(owner):
        return None
    lock = gitdir / str(previous["lock"])
    if not lock.name.endswith(".lock") or gitdir.resolve() not in lock.resolve().parents:
        return None
    try:
        mtime = lock.stat().st_mtime
    except FileNotFoundError:
        return None
    since = since_ns / 1e9
    return lock if since - CLOCK_SLACK_S <= mtime <= since + HELD_MAX_S else None


class LockJournal:
    """The writer's record (see the module docstring); created by :meth:`claim`."""

    def __init__(self, gitdir: Path, owner: str, fsync: bool) -> None:
        self.owner = owner
        marker = gitdir / MARKER
        tmp = marker.with_name(MARKER + ".tmp")
        tmp.write_bytes(_record(owner, None))
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, marker)
        if fsync:
            fsync_path(gitdir)
        self._fd = os.open(marker, os.O_WRONLY)

    @classmethod
    def claim(cls, gitdir: Path, owner: str, gone: Callable[[str], bool], fsync: bool) -> LockJournal:
        """Delete the lock a killed previous writer provably left, log every other lock file, then start
        this writer's record. ``gone(owner)``: that previous owner's writer lease is no longer held."""
        previous = _read(gitdir / MARKER)
        stale = _left_by(gitdir, previous, gone)
        if stale is not None:
            stale.unlink(missing_ok=True)
            log.warning(
                "%s: removed %s, left by writer %s (killed while taking it)",
                gitdir,
                stale.relative_to(gitdir),
                previous["owner"] if previous else "?",
            )
        for lock in lock_files(gitdir):
            log.warning(
                "%s: lock file %s was not left by a croqq writer (or that cannot be proven), so it stays; "
                "commits that need it fail until it is gone. If no git command is running on this repo, "
                "remove it: rm %s",
                gitdir,
                lock.relative_to(gitdir),
                lock,
            )
        return cls(gitdir, owner, fsync)

    @contextlib.contextmanager
    def taking(self, lock: str) -> Iterator[None]:
        """Around a libgit2 call that takes ``lock`` (relative to the git folder)."""
        os.pwrite(self._fd, _record(self.owner, lock), 0)
        try:
            yield
        finally:
            os.pwrite(self._fd, _record(self.owner, None), 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
