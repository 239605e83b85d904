"""The supervisor's record, ``<run dir>/supervisor.json``: which `croqq up` runs the cluster of a run folder
and which processes it started, so that a new one can tell a live cluster from the leftovers of a dead one.

A process is named by (boot id, pid, start time): the start time is field 22 of ``/proc/<pid>/stat``
(clock ticks since boot), so a pid that the kernel has recycled for another program is never mistaken
for the recorded one, and a record from an earlier boot names nothing alive. Each child is the leader of
its own session (``start_new_session``), so its process group id is its pid and the group holds whatever
it started (a Celery pool child, an agent, nvcc).

Stopping leftovers: SIGTERM to each group whose leader is still the recorded process (or, if the leader is
gone, to members started after it), services (the embedded Redis) last, then SIGKILL what is left after a
grace period. Linux only (``/proc``); elsewhere nothing is ever found alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from croqq.patience import Deadline

log = logging.getLogger(__name__)
RECORD_NAME = "supervisor.json"
STOP_GRACE_S = 10.0


class Proc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    pid: int
    pgid: int
    start: int  # clock ticks since boot (field 22 of /proc/<pid>/stat)
    service: bool = False  # stopped after the others (the embedded Redis)


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    boot_id: str
    supervisor: Proc
    children: list[Proc]


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):  # a zombie has finished: it is not running
        return None
    return int(fields[19])


def proc(name: str, pid: int, service: bool = False) -> Proc | None:
    """``pid`` as a recordable process (None if it is already gone)."""
    fields = _stat(pid)
    if fields is None:
        return None
    return Proc(name=name, pid=pid, pgid=int(fields[2]), start=int(fields[19]), service=service)


def is_alive(p: Proc) -> bool:
    return start_time(p.pid) == p.start


def write(path: Path, supervisor: Proc, children: Iterable[Proc]) -> None:
    record = Record(boot_id=boot_id(), supervisor=supervisor, children=list(children))
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(record.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)


def read(path: Path) -> Record | None:
    """The record, or None when there is none, it is unreadable, or it is from an earlier boot."""
    try:
        record = Record.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        log.warning("ignoring the unreadable supervisor record %s: %s", path, exc)
        return None
    return record if record.boot_id == boot_id() else None


def group_members(p: Proc) -> list[int]:
    """Live processes of ``p``'s process group that ``p`` (or its descendants) started: none if the group's
    id now belongs to a different, later process (the pid was recycled)."""
    leader = start_time(p.pgid)
    if leader is not None and (p.pgid != p.pid or leader != p.start):
        return []
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == p.pgid and int(fields[19]) >= p.start:
            members.append(int(entry.name))
    return members


def stop_leftovers(record: Record, grace_s: float = STOP_GRACE_S) -> list[Proc]:
    """Stop what is left of a dead supervisor's cluster (SIGTERM, then SIGKILL after ``grace_s``), the
    services last; return the recorded processes that were still running."""
    left = [p for p in record.children if group_members(p)]
    for wave in ([p for p in left if not p.service], [p for p in left if p.service]):
        _signal_groups(wave, signal.SIGTERM)
        # wall seconds, not stretched by load: a stop grace is a promise to the operator (systemd, docker)
        deadline = Deadline(grace_s, wall=True)
        while any(group_members(p) for p in wave) and not deadline.expired():
            time.sleep(0.1)
        stubborn = [p for p in wave if group_members(p)]
        if stubborn:
            log.warning("%s ignored SIGTERM for %.0fs; killing", ", ".join(p.name for p in stubborn), grace_s)
            _signal_groups(stubborn, signal.SIGKILL)
    return left


def _signal_groups(procs: Iterable[Proc], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pgid, sig)


class Claim:
    """This process's hold on a run folder (an exclusive ``flock`` of ``supervisor.lock``, released by the
    kernel however the process ends), and what it found there: the record of a dead supervisor and the
    processes of it that were still running (stopped before this one starts its own)."""

    def __init__(self, run_dir: Path, fd: int, previous: Proc | None, stopped: list[Proc]) -> None:
        self.run_dir = run_dir
        self.record_path = run_dir / RECORD_NAME
        self.previous = previous
        self.stopped = stopped
        self._fd: int | None = fd

    def note(self) -> str | None:
        """One line on what a dead supervisor left behind, or None if there was no record of one."""
        if self.previous is None:
            return None
        who = f"a croqq up (pid {self.previous.pid}) that died in {self.run_dir}"
        if not self.stopped:
            return f"{who} left no process running"
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in self.stopped)
        return f"stopped what {who} left running: {names}"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def claim(run_dir: Path, grace_s: float = STOP_GRACE_S) -> Claim:
    """Take the run folder for a new supervisor; ConfigError (saying how to stop it) if a live one holds
    it. Leftovers of a dead one are stopped first."""
    import fcntl

    from croqq.errors import ConfigError

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RECORD_NAME
    fd = os.open(run_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    found = read(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(_running(run_dir, found)) from None
    found = read(path)  # written by whoever held the lock before
    if found is not None and is_alive(found.supervisor) and found.supervisor.pid != os.getpid():
        os.close(fd)
        raise ConfigError(_running(run_dir, found))
    stopped = stop_leftovers(found, grace_s) if found is not None else []
    return Claim(run_dir, fd, found.supervisor if found is not None else None, stopped)


def _running(run_dir: Path, found: Record | None) -> str:
    if found is None:
        return f"a croqq cluster already runs in {run_dir}; stop it first"
    pid = found.supervisor.pid
    return (
        f"a croqq cluster already runs in {run_dir} (croqq up pid {pid}); stop it with Ctrl-C in its "
        f"terminal or `kill {pid}`"
    )
