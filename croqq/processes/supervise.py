"""A small process supervisor for `croqq up` and `croqq worker`: start children in their own sessions
(so Ctrl-C reaches only the supervisor), restart those that die (with backoff), and stop them cleanly
(SIGTERM = Celery's warm shutdown, then SIGKILL of the whole process group after a grace period).

- A child with a ``ready`` check is a *service* (the embedded Redis): started first and restarted first;
  while a service is down the other children are not restarted, and a child that exits with
  :data:`EXIT_CONFIG` ("cannot reach Redis" is one) during or after a service outage is restarted like
  any crash instead of being left down. Services are stopped last.
- Every child gets a parent-death signal (Linux ``PR_SET_PDEATHSIG``, SIGKILL): a supervisor that is itself
  killed takes its children with it (Celery's prefork pool children already die with their worker). The
  signal follows the *thread* that started the child, so children are only started by threads that live
  until the children are stopped: the caller's, or the :meth:`Supervisor.watch` thread, which exits after
  :meth:`Supervisor.stop`.
- With ``record``, the supervisor keeps ``supervisor.json`` (see :mod:`croqq.processes.record`) up to date
  with every start, and removes it on a clean stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from croqq.patience import Deadline
from croqq.processes import record as records

log = logging.getLogger(__name__)
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
STABLE_S = 10.0  # a child that ran this long before it died restarts at the first backoff step again
EXIT_CONFIG = 2  # `croqq` refused its configuration (one line in the child's log): restarting cannot help
PR_SET_PDEATHSIG = 1
DEATH_SIGNAL = signal.SIGKILL


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    logfile: Path
    restart: bool = True
    prepare: Callable[[], object] | None = None  # before every start (write a config, drop a stale socket)
    ready: Callable[[subprocess.Popen[bytes]], None] | None = None  # blocks until it serves, or raises
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    streak: int = 0  # restarts since it last ran for STABLE_S: the backoff step
    started_at: float = 0.0
    died_at: float = 0.0
    history: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def service(self) -> bool:
        return self.ready is not None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@functools.cache
def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


def _death_signal_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that gives the child the parent-death signal (None where prctl is missing)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the signal was armed
            os.kill(os.getpid(), DEATH_SIGNAL)

    return hook


class Supervisor:
    def __init__(self, children: list[Child], record: Path | None = None) -> None:
        self.children = {c.name: c for c in children}
        self.record = record
        self.stopping = False
        self.outage_at = 0.0  # when a service was last seen down
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._watcher: threading.Thread | None = None
        self._restarted: list[str] = []

    # -- starting --------------------------------------------------------------------------------------

    def add(self, child: Child) -> None:
        self.children[child.name] = child

    def start(self, child: Child) -> None:
        """Start ``child`` (a service: and wait until it serves; raises if it cannot)."""
        with self._lock:
            if child.prepare is not None:
                child.prepare()
            child.logfile.parent.mkdir(parents=True, exist_ok=True)
            with child.logfile.open("ab") as out:
                child.popen = subprocess.Popen(
                    child.argv,
                    env={**os.environ, **child.env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_death_signal_hook(),  # noqa: PLW1509 (prctl only; no locks taken)
                )
            child.started_at = time.monotonic()
            log.info("started %s (pid %d)", child.name, child.popen.pid)
            self.write_record()
            if child.ready is not None:
                child.ready(child.popen)

    def start_all(self) -> None:
        """Services first (each ready before the next child starts), then the others."""
        for child in sorted(self.children.values(), key=lambda c: not c.service):
            self.start(child)

    # -- restarting ------------------------------------------------------------------------------------

    def poll(self) -> list[str]:
        """Restart children that exited (with backoff), services first; return the names restarted."""
        with self._lock:
            if self.stopping:
                return []
            now = time.monotonic()
            services = [c for c in self.children.values() if c.service]
            restarted = [c.name for c in services if self._revive(c, now)]
            if any(not c.alive() for c in services):
                self.outage_at = now
                return restarted  # the others would only fail to reach it
            restarted += [c.name for c in self.children.values() if not c.service and self._revive(c, now)]
            return restarted

    def _revive(self, child: Child, now: float) -> bool:
        """Note that ``child`` died, and start it again once its backoff has passed; True if restarted."""
        if child.popen is None or child.popen.poll() is None or not child.restart:
            return False
        if not child.died_at:
            self._note_death(child, now)
            if not child.restart:
                return False
        delay = RESTART_BACKOFF_S[min(child.streak, len(RESTART_BACKOFF_S) - 1)]
        if now - child.died_at < delay:
            return False
        child.restarts += 1
        child.streak += 1
        child.died_at = 0.0
        try:
            self.start(child)
        except Exception as exc:  # a service that could not come up: it counts as died again
            log.error("%s did not come up: %s", child.name, exc)
            if child.alive():
                self._kill_group(child)
                child.popen.wait()
        return True

    def _note_death(self, child: Child, now: float) -> None:
        assert child.popen is not None
        code = child.popen.returncode
        child.died_at = now
        child.history.append(code)
        if now - child.started_at >= STABLE_S:
            child.streak = 0
        log.warning("%s exited with %s", child.name, code)
        if code == EXIT_CONFIG and child.started_at > self.outage_at:
            child.restart = False
            log.error("%s refused its configuration (see %s); not restarting it", child.name, child.logfile)
        self._kill_group(child)  # its orphans (a pool child mid-task) go too

    def watch(self, every_s: float = 0.2) -> None:
        """Restart children from a background thread (until :meth:`stop`); :meth:`take_restarted` tells
        which. The thread starts nothing once stopping, and ends only after every child has stopped."""
        if self._watcher is not None:
            return

        def loop() -> None:
            while not self._halt.wait(every_s):
                names = self.poll()
                with self._lock:
                    self._restarted += names

        self._watcher = threading.Thread(target=loop, name="croqq-supervisor", daemon=True)
        self._watcher.start()

    def take_restarted(self) -> list[str]:
        """The children the watch thread restarted since the last call."""
        with self._lock:
            names, self._restarted = self._restarted, []
            return names

    # -- signals and stopping --------------------------------------------------------------------------

    def signal(self, name: str, sig: int, group: bool = False) -> int | None:
        """Send a signal to one child (its main process, or its whole process group); returns the pid."""
        child = self.children[name]
        if not child.alive() or child.pid is None:
            return None
        try:
            if group:
                os.killpg(child.pid, sig)
            else:
                os.kill(child.pid, sig)
        except ProcessLookupError:
            return None
        return child.pid

    @staticmethod
    def _kill_group(child: Child) -> None:
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the children, then the services (Redis outlives the workers' warm shutdown); SIGKILL
        the process group of any that is still running after ``grace_s``."""
        with self._lock:
            self.stopping = True
        for wave in (False, True):
            group = [c for c in self.children.values() if c.service == wave]
            for child in group:
                self.signal(child.name, signal.SIGTERM)
            # wall seconds, not stretched by load: the service manager's own stop timeout counts wall seconds
            deadline = Deadline(grace_s, wall=True)
            for child in group:
                if child.popen is None:
                    continue
                try:
                    child.popen.wait(timeout=max(0.1, deadline.left_s))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within %.0fs; killing it", child.name, grace_s)
                self._kill_group(child)
                child.popen.wait()
        self._halt.set()
        if self._watcher is not None:
            self._watcher.join()
        if self.record is not None:
            with contextlib.suppress(FileNotFoundError):
                self.record.unlink()

    # -- the record ------------------------------------------------------------------------------------

    def write_record(self) -> None:
        if self.record is None:
            return
        me = records.proc("croqq up", os.getpid())
        assert me is not None
        procs = [
            records.proc(c.name, c.pid, c.service)
            for c in self.children.values()
            if c.pid is not None and c.alive()
        ]
        records.write(self.record, me, [p for p in procs if p is not None])
