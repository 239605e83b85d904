"""What one agent run may use, how it is enforced on this host, and which limit stopped it.

Per run (settings ``agent_cpu_s``, ``agent_memory_mb``, ``agent_max_procs``, ``agent_max_file_mb``; 0 turns
one off):

- CPU seconds per process: RLIMIT_CPU (SIGXCPU at the limit, SIGKILL a few seconds later);
- file size: RLIMIT_FSIZE (a write past it fails with EFBIG, or SIGXFSZ kills the writer);
- processes and memory: a cgroup of the run's own (``pids.max``; ``memory.max`` or v1's
  ``memory.limit_in_bytes``: the kernel's OOM killer picks inside the run only) where this process may
  create one under its own cgroup (cgroup v2 with the controller delegated, or v1; root on most hosts);
  where it may not, RLIMIT_NPROC (counted per user: it does not bind for root, and counts every process of
  a non-root user) and RLIMIT_AS (address space: a JavaScript CLI reserves far more than it uses).

:func:`enforcement` says which applies here (the worker logs it at start-up). :func:`limit_hit` reads
what stopped a run from the cgroup's event counters, the exit signal and the standard error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

from croqq.patience import wait_until
from croqq.settings import Settings

log = logging.getLogger(__name__)
MIB = 1 << 20
CONTROLLERS = ("pids", "memory")


@dataclass(frozen=True)
class Limits:
    cpu_s: int
    memory_mb: int
    max_procs: int
    max_file_mb: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            settings.agent_cpu_s,
            settings.agent_memory_mb,
            settings.agent_max_procs,
            settings.agent_max_file_mb,
        )


def _own_cgroup(controller: str) -> tuple[Path, int] | None:
    """(the folder of this process's cgroup for ``controller``, cgroup version), where it has one."""
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        paths.update(dict.fromkeys(names.split(","), path))
    for _, point, fstype, options, *_ in mounts:
        if fstype == "cgroup" and controller in options.split(",") and controller in paths:
            return Path(point + paths[controller]), 1
    for _, point, fstype, *_ in mounts:
        if fstype == "cgroup2" and "" in paths:
            base = Path(point + paths[""])
            with contextlib.suppress(OSError):
                if controller in (base / "cgroup.subtree_control").read_text().split():
                    return base, 2
    return None


class Cgroup:
    """One run's cgroups (one per controller in v1, one folder in v2): limits, counters, kill, removal."""

    def __init__(self, folders: dict[str, tuple[Path, int]]) -> None:
        self.folders = folders

    @classmethod
    def create(cls, limits: Limits) -> Cgroup:
        """Under this process's own cgroups; a controller that cannot be had here is simply absent."""
        name = f"croqq-agent-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        wanted = {"pids": limits.max_procs, "memory": limits.memory_mb}
        folders: dict[str, tuple[Path, int]] = {}
        for controller in CONTROLLERS:
            own = _own_cgroup(controller) if wanted[controller] else None
            if own is None:
                continue
            folder = own[0] / name
            try:
                folder.mkdir(exist_ok=True)
                cls._limit(folder, own[1], controller, wanted[controller])
            except OSError:
                with contextlib.suppress(OSError):
                    folder.rmdir()
                continue
            folders[controller] = (folder, own[1])
        return cls(folders)

    @staticmethod
    def _limit(folder: Path, version: int, controller: str, value: int) -> None:
        if controller == "pids":
            (folder / "pids.max").write_text(str(value))
        elif version == 2:
            (folder / "memory.max").write_text(str(value * MIB))
            with contextlib.suppress(OSError):
                (folder / "memory.swap.max").write_text("0")
        else:
            (folder / "memory.limit_in_bytes").write_text(str(value * MIB))

    def has(self, controller: str) -> bool:
        return controller in self.folders

    def procs_files(self) -> list[Path]:
        return sorted({folder / "cgroup.procs" for folder, _ in self.folders.values()})

    def _counter(self, controller: str, file_v1: str, file_v2: str, field: str) -> int:
        if controller not in self.folders:
            return 0
        folder, version = self.folders[controller]
        with contextlib.suppress(OSError, ValueError):
            for line in (folder / (file_v2 if version == 2 else file_v1)).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == field:
                    return int(value)
        return 0

    def hit(self) -> set[str]:
        """The controllers whose limit the run reached: "pids" (a fork refused), "memory" (an OOM kill)."""
        found = set()
        if self._counter("pids", "pids.events", "pids.events", "max"):
            found.add("pids")
        if self._counter("memory", "memory.oom_control", "memory.events", "oom_kill"):
            found.add("memory")
        return found

    def _pids(self) -> set[int]:
        pids = set()
        for procs in self.procs_files():
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in procs.read_text().split()}
        return pids

    def kill(self) -> None:
        """Kill whatever of the run is left (a process that left the agent's process group included)."""
        for folder, version in self.folders.values():
            if version == 2 and (folder / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (folder / "cgroup.kill").write_text("1")

        def gone() -> bool:
            for pid in self._pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            return not self._pids()

        if self.folders:
            try:
                wait_until(gone, 30, "the agent's processes to die", every_s=0.05)
            except TimeoutError as exc:  # a process stuck in the kernel: its cgroup stays behind
                log.warning("%s: %s left", exc, ", ".join(map(str, self.procs_files())))

    def remove(self) -> None:
        """Kill what is left, then remove the folders (a folder with a process in it cannot go)."""
        self.kill()
        for folder, _ in self.folders.values():
            with contextlib.suppress(TimeoutError):
                wait_until(functools.partial(_rmdir, folder), 10, f"removing {folder}", every_s=0.05)


def _rmdir(folder: Path) -> bool:
    try:
        folder.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def enforcement(limits: Limits) -> dict[str, str]:
    """How each limit is enforced on this host (a probe cgroup is made and removed)."""
    group = Cgroup.create(limits)
    try:
        root = os.geteuid() == 0

        def cg(controller: str) -> str:
            return f"cgroup v{group.folders[controller][1]} {controller}"

        if not limits.max_procs:
            procs = "off"
        elif group.has("pids"):
            procs = cg("pids")
        else:
            procs = "NOT enforced (root; no cgroup)" if root else "RLIMIT_NPROC (per user)"
        return {
            "cpu": "RLIMIT_CPU" if limits.cpu_s else "off",
            "memory": "off" if not limits.memory_mb else cg("memory") if group.has("memory") else "RLIMIT_AS",
            "processes": procs,
            "file size": "RLIMIT_FSIZE" if limits.max_file_mb else "off",
        }
    finally:
        group.remove()


def launcher_args(limits: Limits, group: Cgroup) -> list[str]:
    """The rlimit and cgroup options of ``confine.py`` for one run."""
    args = [f"--join={procs}" for procs in group.procs_files()]
    if limits.cpu_s:
        args.append(f"--cpu={limits.cpu_s}")
    if limits.max_file_mb:
        args.append(f"--fsize={limits.max_file_mb * MIB}")
    if limits.memory_mb and not group.has("memory"):
        args.append(f"--as={limits.memory_mb * MIB}")
    if limits.max_procs and not group.has("pids"):
        args.append(f"--nproc={limits.max_procs}")
    return args


_MEMORY_WORDS = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc")
_FORK_WORDS = ("fork: retry", "fork: Resource temporarily unavailable", "BlockingIOError: [Errno 11]")


def limit_hit(limits: Limits, group: Cgroup, exit_code: int | None, stderr: str) -> str:
    """Which limit stopped a failed run, in words ("" when none is evident): the cgroup's counters where
    it holds the limit, else the error the refused call printed; signals as -N (unjailed) or 128+N (a
    shell's way)."""
    signals = {-exit_code, exit_code - 128} if exit_code is not None else set()
    hit = group.hit()

    def reached(controller: str, words: tuple[str, ...]) -> bool:
        if group.has(controller):
            return controller in hit
        return any(word in stderr for word in words)

    if limits.max_procs and reached("pids", _FORK_WORDS):
        return f"process limit ({limits.max_procs} processes)"
    if limits.memory_mb and reached("memory", _MEMORY_WORDS):
        return f"memory limit ({limits.memory_mb} MiB)"
    if limits.cpu_s and signal.SIGXCPU in signals:
        return f"CPU time limit ({limits.cpu_s} s)"
    if limits.max_file_mb and (signal.SIGXFSZ in signals or "File too large" in stderr):
        return f"file size limit ({limits.max_file_mb} MiB)"
    return ""
