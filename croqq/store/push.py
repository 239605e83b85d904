"""Pushing the results branch from a background thread, so a slow or hanging remote never delays a STORE.

The writer's commits call :meth:`Pusher.poke` (it only sets a flag). The thread pushes when poked, at
most every ``every_s`` seconds (0: as soon as the previous push is done), and never more than one push
at a time. A failed push is logged and retried, first after ``retry_s`` and then twice as long each
time up to ``RETRY_MAX_S``, whether or not new commits arrive; it never reaches a commit. The remote
therefore lags the branch by up to ``every_s`` plus the push's own duration (more while it fails).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

RETRY_MAX_S = 300.0


class Pusher:
    def __init__(self, push: Callable[[], None], every_s: float, name: str, retry_s: float = 5.0) -> None:
        self._push = push
        self.every_s = every_s
        self.name = name
        self.retry_s = retry_s
        self._due = False
        self._stopping = False
        self._last = float("-inf")  # monotonic start of the last push attempt
        self._failures = 0
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="croqq-push", daemon=True)

    def start(self) -> Pusher:
        self._thread.start()
        return self

    def poke(self) -> None:
        """New commits: push them when due. Never blocks on a push in flight."""
        with self._wake:
            self._due = True
            self._wake.notify()

    def close(self, wait_s: float = 10.0) -> None:
        """Stop, after one last push of pending commits if it finishes within ``wait_s``."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(wait_s)

    def _next_at(self) -> float:
        """When the next push may start (call with the lock held)."""
        if self._failures:
            return self._last + min(RETRY_MAX_S, self.retry_s * 2 ** (self._failures - 1))
        return self._last + self.every_s

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and (not self._due or time.monotonic() < self._next_at()):
                    timeout = self._next_at() - time.monotonic() if self._due else None
                    self._wake.wait(timeout)
                if not self._due:
                    return
                self._due = False
                self._last = time.monotonic()
                last_one = self._stopping
            ok = self._attempt()
            with self._wake:
                self._failures = 0 if ok else self._failures + 1
                self._due = self._due or not ok
            if last_one:
                return

    def _attempt(self) -> bool:
        try:
            self._push()
        except Exception as exc:  # a push failure is never fatal: logged, retried later
            log.warning("push to %s failed (retrying later): %s", self.name, exc)
            return False
        log.debug("pushed to %s", self.name)
        return True
