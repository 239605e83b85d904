"""A small process supervisor for `croqq up` and `croqq worker`: start children in their own sessions
(so Ctrl-C reaches only the supervisor), restart those that die, and stop them cleanly (SIGTERM = Celery's
warm shutdown, then SIGKILL of the whole process group after a grace period).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
EXIT_CONFIG = 2  # `croqq` refused its configuration (one line in the child's log): restarting cannot help


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    logfile: Path
    restart: bool = True
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    died_at: float = 0.0
    history: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Supervisor:
    def __init__(self, children: list[Child]) -> None:
        self.children = {c.name: c for c in children}
        self.stopping = False

    def start(self, child: Child) -> None:
        child.logfile.parent.mkdir(parents=True, exist_ok=True)
        out = child.logfile.open("ab")
        env = {**os.environ, **child.env}
        child.popen = subprocess.Popen(
            child.argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        log.info("started %s (pid %d)", child.name, child.popen.pid)

    def start_all(self) -> None:
        for child in self.children.values():
            self.start(child)

    def poll(self) -> list[str]:
        """Restart children that exited (with backoff); return the names restarted."""
        restarted = []
        now = time.monotonic()
        for child in self.children.values():
            if self.stopping or child.popen is None or child.popen.poll() is None or not child.restart:
                continue
            if not child.died_at:
                child.died_at = now
                child.history.append(child.popen.returncode)
                log.warning("%s exited with %s", child.name, child.popen.returncode)
                if child.popen.returncode == EXIT_CONFIG:
                    child.restart = False
                    log.error(
                        "%s refused its configuration (see %s); not restarting it", child.name, child.logfile
                    )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.popen.pid, signal.SIGKILL)  # its orphans (a pool child mid-task) go too
            delay = RESTART_BACKOFF_S[min(child.restarts, len(RESTART_BACKOFF_S) - 1)]
            if now - child.died_at >= delay:
                child.restarts += 1
                child.died_at = 0.0
                self.start(child)
                restarted.append(child.name)
        return restarted

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

    def stop(self, grace_s: float = 30.0) -> None:
        self.stopping = True
        for name in self.children:
            self.signal(name, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children.values():
            if child.popen is None:
                continue
            try:
                child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", child.name, grace_s)
            if child.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            child.popen.wait()
