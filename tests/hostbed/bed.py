"""A multi-host test bed on one Linux machine: hosts made of namespaces, joined by a private network.

The multi-host tests and the benchmark need several "machines" that share nothing but a network: each
with its own hostname, network stack, private disk, process table and (optionally) a skewed wall clock,
and faults to inject between them (a partition, the loss of every process of a host, a restart under
another hostname). This module builds them out of Linux namespaces, as root, without Docker:

- a :class:`Bed` owns one **switch**: a network namespace holding a Linux bridge ``br0``. Nothing is
  created in the machine's root network namespace: every veth pair is created directly with its ends in
  the switch and in a host namespace, so the machine's own interfaces, routes and ports stay as they were,
  and two beds (each its own switch) cannot see each other even on the same subnet. Each bed still gets
  its own ``10.<a>.<b>.0/24`` (derived from its name) so that addresses in logs say which bed they are;
- a :class:`Host` is a network namespace (``eth0``, address ``10.<a>.<b>.<n>/24``, a fixed MAC, loopback
  up) plus a long-lived **init** process started as
  ``ip netns exec <ns> unshare --uts --mount --pid --fork --propagation private --mount-proc``: PID 1 of
  its own PID namespace, in its own UTS namespace (the hostname) and mount namespace, in which
  ``<root>/hosts`` is hidden under a tmpfs and only the host's own folder ``<root>/hosts/<name>`` is
  mounted back at the same path (bound to a staging point first, then ``mount --move``\\d into the
  tmpfs). Everything else of the machine's file tree stays visible, the repository checkout and its
  virtual environment included, like software baked into an image. ``/dev/shm`` is a private tmpfs, and
  ``/etc`` is an overlay whose upper layer is the host's own (``<root>/sys/<name>/etc``): it carries the
  host's ``/etc/hostname``, an ``/etc/hosts`` naming every host of the bed, and, for a skewed host,
  ``/etc/ld.so.preload`` + ``/etc/faketimerc`` (libfaketime), so that *every* dynamically linked process
  of that host runs with the skewed clock, also one started with a cleaned environment;
- processes run inside a host through ``nsenter --target <init> --net --uts --mount --pid``
  (:meth:`Host.spawn`, :meth:`Host.run`) with exactly the environment given plus PATH/HOME/LANG/TMPDIR
  (HOME is the host folder, TMPDIR its ``tmp/``), their output appended to a log file under the host
  folder's ``logs/``;
- the test process itself can open TCP connections *from* a host's network (:meth:`Host.in_net`,
  :meth:`Host.redis_client`): a helper thread enters the host's network namespace (``setns``) just to
  create the socket, which stays in that namespace. The root namespace has no route into a bed, so this
  is how a test inspects the bed's Redis; a partition of that host cuts such a client off too.

Faults: :meth:`Host.link_down` sets the host's switch port down (the host sees NO-CARRIER and keeps its
address; its packets are dropped, peers hear nothing: connections hang until their own timeouts, new
ones fail), :meth:`Host.link_up` heals it; :meth:`Host.kill_all` SIGKILLs the host's init, and the
kernel kills every other process of its PID namespace with it, at once (``power_off=True`` cuts the host's
network first, so no FIN or RST leaves it: a power cut rather than a crash of every process);
:meth:`Host.restart` boots a fresh init (new namespaces, a new network stack with the same address and
MAC, the same private folder, optionally a new hostname or clock).

Leftovers: namespace names are ``cqbed-<bed>-<owner pid>-switch`` and ``cqbed-<bed>-<owner pid>-h-<host>``.
:func:`cleanup_stale` removes those whose owner process is gone (a test run that was SIGKILLed),
killing what still runs in them; every new :class:`Bed` calls it first. A bed also closes itself at
interpreter exit if nobody did.

Not private per host: ``/tmp`` (processes get ``TMPDIR`` inside their host folder instead; hiding ``/tmp``
would hide a checkout or a bed root that lives there), the machine's other files, and the kernel (one
boot id, one monotonic clock). On a skewed host libfaketime shifts the wall clock only: with its monotonic
clock shifted too, every timed wait of a Python thread (``Event.wait``, ``Lock.acquire``: glibc's
``sem_clockwait``, which libfaketime 0.9.10 does not intercept) would last the offset longer, and a
heartbeat every 0.75 s would beat every 90 s. With the monotonic clock real, libfaketime refuses
``clock_nanosleep(TIMER_ABSTIME)`` (EINVAL), i.e. Python's ``time.sleep``: the host's Python processes
import ``skewed_site/sitecustomize.py``, whose ``time.sleep`` waits in ``select``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import enum
import functools
import glob
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar
from urllib.parse import quote

import redis

from croqq.patience import Deadline
from croqq.processes.redis_server import find_redis_server

PREFIX = "cqbed-"
NETNS_DIR = Path("/run/netns")
SKEWED_SITE = Path(__file__).resolve().parent / "skewed_site"  # PYTHONPATH of a skewed host's processes
BRIDGE = "br0"
HOST_IFACE = "eth0"
REDIS_PORT = 6379
# Budgets in unloaded seconds (croqq.patience: they stretch with the machine's load)
BOOT_TIMEOUT_S = 60.0  # a host's init says "ready"
KILL_TIMEOUT_S = 60.0  # a SIGKILLed process is reaped
REDIS_START_TIMEOUT_S = 60.0  # the bed's redis-server answers a PING
COMMAND_TIMEOUT_S = 60.0  # a short command (`ip`, Host.run) finishes
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_BED_NAME = re.compile(r"^[a-z0-9]{1,12}$")
_HOST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_CLONE_NEWNET = 0x40000000
_MAX_HOSTS = 250

T = TypeVar("T")


class BedError(RuntimeError):
    """The bed could not be built or a host could not be driven (the message says which command failed)."""


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP
"""For :meth:`Host.restart`: keep the host's current clock setting."""


# --- the init of a host ------------------------------------------------------------------------------

# Runs as PID 1 of the host's new PID namespace, in its new UTS and mount namespaces (proc already
# mounted by unshare --mount-proc). Arguments: hostname, host name, host folder, the bed's hosts folder,
# the host's bed-private folder; then the reaper's argv.
_INIT_SH = r"""
set -eu
hn=$1 name=$2 dir=$3 hosts=$4 sys=$5
shift 5
echo "$hn" > /proc/sys/kernel/hostname
mount --bind "$dir" "$sys/stage"
mount -t tmpfs -o mode=0755,size=1m,nosuid,nodev cqbed-hosts "$hosts"
mkdir "$hosts/$name"
mount --move "$sys/stage" "$hosts/$name"
if [ -d /dev/shm ]; then mount -t tmpfs -o mode=1777,nosuid,nodev cqbed-shm /dev/shm; fi
if ! mount -t overlay cqbed-etc -o "lowerdir=/etc,upperdir=$sys/etc,workdir=$sys/etc-work" /etc; then
  echo "hostbed: no private /etc (overlayfs refused): only processes keeping LD_PRELOAD get faketime" >&2
fi
exec "$@"
"""

# The reaper: says "ready" once on stdout, then reaps every child (orphans are reparented to it).
_INIT_PY = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
os.write(1, b"ready\\n")
os.dup2(os.open("/dev/null", os.O_WRONLY), 1)
while True:
    try:
        os.wait()
    except ChildProcessError:
        signal.sigwait({signal.SIGCHLD})
    except InterruptedError:
        pass
"""


# --- small helpers -----------------------------------------------------------------------------------


def _wait(proc: subprocess.Popen[bytes], budget_s: float) -> bool:
    """Wait for ``proc`` to exit within ``budget_s`` unloaded seconds; False if it did not."""
    deadline = Deadline(budget_s)
    while True:
        try:
            proc.wait(0.2)
            return True
        except subprocess.TimeoutExpired:
            if deadline.expired():
                return False


def _communicate(
    proc: subprocess.Popen[bytes], argv: Sequence[str], budget_s: float, input: bytes | None = None
) -> tuple[bytes, bytes]:
    """``proc.communicate(input)`` within ``budget_s`` unloaded seconds, else kill it and raise
    :class:`subprocess.TimeoutExpired` (with the wall seconds waited)."""
    deadline = Deadline(budget_s)
    while True:
        try:
            out, err = proc.communicate(input, timeout=0.5)  # retrying loses no output
            return out or b"", err or b""
        except subprocess.TimeoutExpired:
            if deadline.expired():
                proc.kill()
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(list(argv), deadline.waited_s, out, err) from None


def _run(
    argv: Sequence[str], check: bool = True, timeout: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run a command of the bed's own on the machine (``timeout``: unloaded seconds)."""
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = _communicate(proc, argv, timeout)
    result = subprocess.CompletedProcess(
        list(argv), proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )
    if check and result.returncode != 0:
        raise BedError(f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/<pid>/task/*/children``, else a scan of ``/proc``)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(x) for x in handle.read().split())
        return found
    except FileNotFoundError:
        if not Path(f"/proc/{pid}").exists():
            return []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found


def _ns_pids(pid: int) -> list[int]:
    """The ``NSpid`` line of a process: its PID in each PID namespace, outermost first."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def _find_ns_init(pid: int, depth: int = 3) -> int | None:
    """The first descendant of ``pid`` (itself included) that is PID 1 of a nested PID namespace."""
    level = [pid]
    for _ in range(depth + 1):
        for candidate in level:
            ns = _ns_pids(candidate)
            if len(ns) > 1 and ns[-1] == 1:
                return candidate
        level = [kid for candidate in level for kid in _children(candidate)]
        if not level:
            return None
    return None


def _ns_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` on a helper thread that has entered the named network namespace: sockets it creates
    belong to that namespace and keep working from any thread afterwards."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            fd = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc().setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into network namespace {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=body, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class _NetnsConnection(redis.Connection):
    """A redis-py TCP connection whose socket is created inside a given network namespace."""

    def __init__(self, *args: Any, netns: str, **kwargs: Any) -> None:
        self._netns = netns
        super().__init__(*args, **kwargs)

    def _connect(self) -> socket.socket:
        return in_netns(self._netns, super()._connect)


def find_libfaketime() -> str | None:
    """Path of Debian's ``libfaketime.so.1`` (package ``libfaketime``), or None."""
    candidates = [
        *sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")),
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ]
    return next((path for path in candidates if os.path.exists(path)), None)


def faketime_available() -> str | None:
    """None when hosts can run with a skewed clock, else why not."""
    if find_libfaketime() is None:
        return "libfaketime is not installed (Debian: apt-get install faketime libfaketime)"
    return None


# --- availability and leftovers ------------------------------------------------------------------


@functools.cache
def bed_available() -> str | None:
    """None when a bed can be built on this machine, else the reason (for a visible pytest skip)."""
    if not sys.platform.startswith("linux"):
        return "the host bed needs Linux namespaces"
    if os.geteuid() != 0:
        return "the host bed needs root (network, mount and PID namespaces)"
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"the host bed needs `{tool}` on PATH (iproute2 / util-linux)"
    probe = f"{PREFIX}probe-{os.getpid()}-switch"
    try:
        steps = [
            ["ip", "netns", "add", probe],
            ["ip", "-n", probe, "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb"],
            ["ip", "netns", "exec", probe, "unshare", "--uts", "--mount", "--pid", "--fork",
             "--propagation", "private", "--mount-proc", "true"],
        ]  # fmt: skip
        for argv in steps:
            try:
                result = _run(argv, check=False, timeout=20)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"the host bed cannot run here: `{' '.join(argv)}`: {exc}"
            if result.returncode != 0:
                return f"the host bed cannot run here: `{' '.join(argv)}`: {result.stderr.strip()}"
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _run(["ip", "netns", "del", probe], check=False)
    return None


def _owner_pid(netns: str) -> int | None:
    parts = netns[len(PREFIX) :].split("-")
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    return int(parts[1])


def cleanup_stale(prefix: str = PREFIX, include_live: bool = False) -> list[str]:
    """Remove leftover bed namespaces whose names start with ``prefix`` (``cqbed-`` for all beds,
    ``cqbed-<bed>-`` for one bed) and whose owner process is gone (``include_live``: also those of
    living owners), after SIGKILLing every process still inside them. Returns the names removed."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"bed namespaces start with {PREFIX!r}, not {prefix!r}")
    try:
        names = sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []
    stale = []
    for name in names:
        if not name.startswith(prefix):
            continue
        owner = _owner_pid(name)
        if include_live or owner is None or not _alive(owner):
            stale.append(name)
    if not stale:
        return []
    ids = {ns: _ns_id(str(NETNS_DIR / ns)) for ns in stale}
    wanted = {value for value in ids.values() if value is not None}
    for pid in _all_pids():
        if pid != os.getpid() and _ns_id(f"/proc/{pid}/ns/net") in wanted:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for ns in stale:
        _ip("netns", "del", ns, check=False)
    return stale


def _subnet_for(name: str) -> str:
    digest = zlib.crc32(name.encode())
    return f"10.{100 + digest % 100}.{(digest >> 8) % 256}"


# --- processes inside a host -------------------------------------------------------------------------


class HostProcess(subprocess.Popen[bytes]):
    """A process started inside a host. ``pid`` is the ``nsenter`` in the machine's PID namespace, which
    waits for the command and exits with its status (or dies of the same signal); :attr:`inner_pid` is
    the command itself, and signals sent through this object go to the command, not to ``nsenter``."""

    host: Host
    log_path: Path | None = None
    """Where its stdout and stderr go (None: captured, :meth:`Host.run`)."""
    _inner: int | None = None

    @property
    def inner_pid(self) -> int | None:
        """The command's PID in the machine's PID namespace (None once it has gone)."""
        if self._inner is None:
            deadline = Deadline(KILL_TIMEOUT_S)  # nsenter forks the command right after it starts
            while self._inner is None and self.poll() is None and not deadline.expired():
                kids = _children(self.pid)
                if kids:
                    self._inner = kids[0]
                else:
                    time.sleep(0.002)
        if self._inner is not None and self.returncode is not None:
            return None
        return self._inner

    @property
    def host_pid(self) -> int | None:
        """The command's PID as the host sees it (in the host's PID namespace)."""
        inner = self.inner_pid
        ns = _ns_pids(inner) if inner is not None else []
        return ns[-1] if ns else None

    def send_signal(self, sig: int) -> None:
        inner = self.inner_pid
        if inner is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(inner, sig)
                return
        super().send_signal(sig)


class Host:
    """One machine of a bed (made by :meth:`Bed.add_host`)."""

    def __init__(self, bed: Bed, name: str, index: int, hostname: str, faketime: str | None) -> None:
        self.bed = bed
        self.name = name
        self.index = index
        self.hostname = hostname
        self.faketime = faketime
        self.ip = f"{bed.subnet}.{index}"
        self.netns = f"{bed.tag}-h-{name}"
        self.port = f"p{index}-{name}"[:15]
        self.mac = "02:00:{:02x}:{:02x}:00:{:02x}".format(*map(int, bed.subnet.split(".")[1:]), index)
        self.dir = bed.root / "hosts" / name
        self.sys_dir = bed.root / "sys" / name
        self.log_dir = self.dir / "logs"
        self.tmp_dir = self.dir / "tmp"
        self._init: subprocess.Popen[bytes] | None = None
        self._init_pid: int | None = None
        self._procs: list[HostProcess] = []
        self._spawned = 0
        self._net_up = False
        for path in (self.log_dir, self.tmp_dir, self.sys_dir / "stage", self.sys_dir / "etc",
                     self.sys_dir / "etc-work"):  # fmt: skip
            path.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"Host({self.name!r}, hostname={self.hostname!r}, ip={self.ip}, running={self.running})"

    # --- state ---

    @property
    def running(self) -> bool:
        """True while the host's init lives."""
        return self._init is not None and self._init.poll() is None

    @property
    def init_pid(self) -> int:
        """PID (in the machine's PID namespace) of the host's init, PID 1 inside the host."""
        if self._init_pid is None or not self.running:
            raise BedError(f"host {self.name} is not running")
        return self._init_pid

    def pids(self, include_init: bool = False) -> list[int]:
        """PIDs (machine numbering) of every process living in the host's PID namespace."""
        if not self.running:
            return []
        init = self.init_pid
        mine = _ns_id(f"/proc/{init}/ns/pid")
        if mine is None:
            return []
        found = [pid for pid in _all_pids() if _ns_id(f"/proc/{pid}/ns/pid") == mine]
        return sorted(pid for pid in found if include_init or pid != init)

    def ps(self) -> dict[int, str]:
        """``{pid: command line}`` of the host's processes (init excluded)."""
        return {pid: _cmdline(pid) for pid in self.pids()}

    # --- network ---

    def _setup_net(self) -> None:
        sw = self.bed.switch
        _ip("netns", "add", self.netns)
        _ip("link", "add", HOST_IFACE, "netns", self.netns, "address", self.mac, "type", "veth",
            "peer", "name", self.port, "netns", sw)  # fmt: skip
        _ip("-n", sw, "link", "set", self.port, "master", BRIDGE, "up")
        _ip("-n", self.netns, "addr", "add", f"{self.ip}/24", "dev", HOST_IFACE)
        _ip("-n", self.netns, "link", "set", HOST_IFACE, "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        self._net_up = True

    def _teardown_net(self) -> None:
        _ip("-n", self.bed.switch, "link", "del", self.port, check=False)
        _ip("netns", "del", self.netns, check=False)
        self._net_up = False

    def link_down(self) -> None:
        """Partition the host: its switch port goes down (the host sees NO-CARRIER, its packets are
        dropped, peers see nothing at all until their own timeouts)."""
        _ip("-n", self.bed.switch, "link", "set", self.port, "down")

    def link_up(self) -> None:
        """Heal a :meth:`link_down`."""
        _ip("-n", self.bed.switch, "link", "set", self.port, "up")

    @property
    def linked(self) -> bool:
        """True when the host's switch port is up."""
        out = _ip("-n", self.bed.switch, "-o", "link", "show", self.port, check=False).stdout
        flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
        return "UP" in flags

    def in_net(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` with the calling thread's new sockets in this host's network (see :func:`in_netns`)."""
        return in_netns(self.netns, fn)

    def connect(self, ip: str, port: int, timeout: float = 2.0) -> socket.socket:
        """A TCP connection from this host's network to ``ip:port``."""
        return self.in_net(lambda: socket.create_connection((ip, port), timeout=timeout))

    def redis_client(self, url: str, **kwargs: Any) -> redis.Redis:
        """A Redis client in the test process whose connections start from this host's network."""
        kwargs.setdefault("socket_connect_timeout", 2.0)
        kwargs.setdefault("socket_timeout", 5.0)
        pool = redis.ConnectionPool.from_url(
            url, connection_class=_NetnsConnection, netns=self.netns, **kwargs
        )
        return redis.Redis(connection_pool=pool)

    # --- boot, kill, restart ---

    def _write_etc(self) -> None:
        etc = self.sys_dir / "etc"
        (etc / "hostname").write_text(self.hostname + "\n")
        self.refresh_hosts_file()
        preload, rc = etc / "ld.so.preload", etc / "faketimerc"
        if self.faketime is None:
            for path in (preload, rc):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return
        lib = find_libfaketime()
        if lib is None:
            raise BedError(f"host {self.name}: {faketime_available()}")
        lower = ""
        with contextlib.suppress(OSError):
            lower = Path("/etc/ld.so.preload").read_text()
        preload.write_text(lower + ("" if not lower or lower.endswith("\n") else "\n") + lib + "\n")
        rc.write_text(self.faketime + "\n")

    def refresh_hosts_file(self) -> None:
        """Write the host's ``/etc/hosts``: localhost plus every host of the bed by name and hostname
        (rewritten in place, so a running host sees hosts added after it)."""
        lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{self.hostname}"]
        for other in self.bed.hosts.values():
            names = {other.name, other.hostname} - ({self.hostname} if other is self else set())
            if names:
                lines.append(f"{other.ip}\t" + " ".join(sorted(names)))
        path = self.sys_dir / "etc" / "hosts"
        with open(path, "r+" if path.exists() else "w") as handle:
            handle.write("\n".join(lines) + "\n")
            handle.truncate()

    def _boot(self) -> None:
        if not self._net_up:
            self._setup_net()
        self._write_etc()
        argv = [
            "ip", "netns", "exec", self.netns,
            "unshare", "--uts", "--mount", "--pid", "--fork", "--propagation", "private", "--mount-proc",
            "/bin/sh", "-c", _INIT_SH, "init",
            self.hostname, self.name, str(self.dir), str(self.bed.root / "hosts"), str(self.sys_dir),
            sys.executable, "-I", "-S", "-c", _INIT_PY,
        ]  # fmt: skip
        log = open(self.log_dir / "init.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env={"PATH": BASE_PATH, "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        finally:
            log.close()
        assert proc.stdout is not None
        started = time.monotonic()
        line = self._read_ready(proc, proc.stdout)
        proc.stdout.close()
        if line != b"ready\n":
            waited = time.monotonic() - started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            tail = (self.log_dir / "init.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise BedError(
                f"host {self.name} did not boot (waited {waited:.0f} s): {' | '.join(tail) or 'no output'}"
            )
        init = _find_ns_init(proc.pid)
        if init is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise BedError(f"host {self.name}: its init vanished right after booting")
        self._init, self._init_pid = proc, init

    @staticmethod
    def _read_ready(proc: subprocess.Popen[bytes], stream: IO[bytes]) -> bytes:
        """The init's first line, or what came of it within BOOT_TIMEOUT_S unloaded seconds."""
        deadline = Deadline(BOOT_TIMEOUT_S)
        data = b""
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([stream], [], [], 0.5)
            if not ready:
                if deadline.expired():
                    break
                continue
            chunk = os.read(stream.fileno(), 64)
            if not chunk:
                break
            data += chunk
        return data

    def kill_all(self, power_off: bool = False) -> None:
        """SIGKILL every process of the host at once (its init; the kernel kills the rest of its PID
        namespace). The host's network stays, so the kernel closes the dead processes' connections as
        after a crash of every process. ``power_off``: cut the network first (the veth pair is deleted,
        no FIN or RST leaves the host: peers find out only by their own timeouts); it stays cut until
        :meth:`restart`."""
        if power_off:
            self._teardown_net()
        proc = self._init
        if proc is not None and proc.poll() is None and self._init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGKILL)
            started = time.monotonic()
            if not _wait(proc, KILL_TIMEOUT_S):
                raise BedError(
                    f"host {self.name}: init {self._init_pid} survived SIGKILL "
                    f"(not reaped after {time.monotonic() - started:.0f} s)"
                )
        for child in self._procs:
            if not _wait(child, KILL_TIMEOUT_S):
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
        self._procs.clear()
        self._init_pid = None

    def restart(self, hostname: str | None = None, faketime: str | _Keep | None = KEEP) -> None:
        """Boot the host again: a fresh init with new UTS/mount/PID namespaces and a new network stack
        (same address, same MAC, link up), the same private folder; kills what still runs first.
        ``hostname``: come back under a new hostname; ``faketime``: a new clock skew (None: none)."""
        self.kill_all()
        if hostname is not None:
            self.hostname = _valid_hostname(hostname)
        if faketime is not KEEP:
            self.faketime = faketime if isinstance(faketime, str) else None
        self._teardown_net()
        self._boot()
        for other in self.bed.hosts.values():
            if other is not self:
                other.refresh_hosts_file()

    def close(self) -> None:
        """Kill the host and delete its network namespace (its veth pair goes with it)."""
        self.kill_all()
        self._teardown_net()
        self._init = None

    # --- running things ---

    def environment(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The exact environment of a process started in this host: the basics, the clock, then ``env``."""
        full = {
            "PATH": BASE_PATH,
            "HOME": str(self.dir),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.tmp_dir),
        }
        if self.faketime is not None:
            lib = find_libfaketime()
            if lib is not None:
                full["LD_PRELOAD"] = lib
            full["FAKETIME"] = self.faketime
            full["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"  # a real monotonic clock (see the module doc)
            full["PYTHONPATH"] = str(SKEWED_SITE)  # a time.sleep that works there
        full.update(env or {})
        return full

    def _nsenter(self, argv: Sequence[str], cwd: Path | str | None) -> list[str]:
        if not argv:
            raise ValueError("empty argv")
        return [
            "nsenter", f"--target={self.init_pid}", "--net", "--uts", "--mount", "--pid",
            f"--wd={cwd or self.dir}", "--", *argv,
        ]  # fmt: skip

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log_path: Path | str | None = None,
        cwd: Path | str | None = None,
    ) -> HostProcess:
        """Start ``argv`` inside the host (all its namespaces), stdout and stderr appended to
        ``log_path`` (default ``logs/<program>.<n>.log`` in the host folder; a relative path is taken
        in the host folder), with exactly :meth:`environment` ``(env)``."""
        self._spawned += 1
        if log_path is None:
            log_path = self.log_dir / f"{Path(argv[0]).name}.{self._spawned}.log"
        path = Path(log_path)
        if not path.is_absolute():
            path = self.dir / path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            proc = HostProcess(
                self._nsenter(argv, cwd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(env),
                start_new_session=True,
            )
        proc.host, proc.log_path = self, path
        self._procs = [p for p in self._procs if p.poll() is None]
        self._procs.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
        input: str | None = None,
        check: bool = False,
        cwd: Path | str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command inside the host; its output captured as text (``timeout``: unloaded
        seconds, :mod:`croqq.patience`; past it the command is killed, TimeoutExpired)."""
        cmd = self._nsenter(argv, cwd)
        proc = HostProcess(
            cmd,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.environment(env),
            start_new_session=True,
        )
        proc.host = self
        out, err = _communicate(proc, argv, timeout, input.encode() if input is not None else None)
        result = subprocess.CompletedProcess(list(argv), proc.returncode, out.decode(errors="replace"),
                                             err.decode(errors="replace"))  # fmt: skip
        if check:
            result.check_returncode()
        return result

    def python(self, code: str, env: Mapping[str, str] | None = None, timeout: float = COMMAND_TIMEOUT_S,
               check: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run ``python -c code`` inside the host with this interpreter (the repository's venv)."""
        return self.run([sys.executable, "-c", code], env=env, timeout=timeout, check=check)


def _valid_hostname(hostname: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}", hostname):
        raise ValueError(f"not a usable hostname: {hostname!r}")
    return hostname


class Bed:
    """A set of hosts on one private switch. Use as a context manager, or call :meth:`close`."""

    def __init__(self, root: Path | str, name: str, subnet: str | None = None) -> None:
        if not _BED_NAME.match(name):
            raise ValueError(f"bed name {name!r}: 1 to 12 characters of [a-z0-9]")
        reason = bed_available()
        if reason is not None:
            raise BedError(reason)
        self.root = Path(root).resolve()
        self.name = name
        self.tag = f"{PREFIX}{name}-{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.subnet = subnet or _subnet_for(name)
        if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", self.subnet):
            raise ValueError(f"subnet {self.subnet!r}: give the first three octets, 10.<a>.<b>")
        self.hosts: dict[str, Host] = {}
        self.redis: dict[str, HostProcess] = {}
        self._closed = False
        cleanup_stale(PREFIX)
        (self.root / "hosts").mkdir(parents=True, exist_ok=True)
        (self.root / "sys").mkdir(parents=True, exist_ok=True)
        _ip("netns", "add", self.switch)
        atexit.register(self.close)
        try:
            _ip(
                "-n",
                self.switch,
                "link",
                "add",
                BRIDGE,
                "type",
                "bridge",
                "forward_delay",
                "0",
                "stp_state",
                "0",
            )
            _ip("-n", self.switch, "link", "set", BRIDGE, "up")
            _ip("-n", self.switch, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"Bed({self.name!r}, {self.subnet}.0/24, hosts={list(self.hosts)})"

    def add_host(self, name: str, hostname: str | None = None, faketime: str | None = None) -> Host:
        """Boot a new host ``name`` (its folder ``<root>/hosts/<name>``), hostname ``hostname`` (default
        ``name``), its wall clock shifted by ``faketime`` (libfaketime syntax, e.g. ``"+90s"``)."""
        if self._closed:
            raise BedError(f"bed {self.name} is closed")
        if not _HOST_NAME.match(name):
            raise ValueError(f"host name {name!r}: a lowercase letter, then up to 30 of [a-z0-9-]")
        if name in self.hosts:
            raise ValueError(f"bed {self.name} already has a host {name!r}")
        if len(self.hosts) >= _MAX_HOSTS:
            raise BedError(f"bed {self.name} is full ({_MAX_HOSTS} hosts)")
        if faketime is not None and faketime_available() is not None:
            raise BedError(f"host {name}: {faketime_available()}")
        host = Host(self, name, len(self.hosts) + 1, _valid_hostname(hostname or name), faketime)
        self.hosts[name] = host
        try:
            host._boot()
        except BaseException:
            del self.hosts[name]
            host.close()
            raise
        for other in self.hosts.values():
            if other is not host:
                other.refresh_hosts_file()
        return host

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def start_redis(
        self, host: Host, password: str, port: int = REDIS_PORT, timeout: float = REDIS_START_TIMEOUT_S
    ) -> str:
        """Start a real ``redis-server`` on ``host``, bound to its address (TCP only, ``requirepass``,
        AOF fsynced on every write, ``noeviction``, data in ``<host folder>/redis``; after a kill or a
        restart of the host, calling this again replays its AOF). Returns ``redis://:<pw>@<ip>:<port>/0``."""
        data = host.dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        conf = data / "redis.conf"
        lines = [
            f"bind {host.ip}",
            f"port {port}",
            "protected-mode yes",
            f'dir "{data}"',
            'logfile ""',
            "daemonize no",
            "appendonly yes",
            "appendfsync always",
            "maxmemory-policy noeviction",
            'save ""',
            "requirepass " + '"' + password.replace("\\", "\\\\").replace('"', '\\"') + '"',
        ]
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        old = self.redis.get(host.name)
        if old is not None and old.poll() is None:
            raise BedError(f"redis-server already runs on host {host.name}")
        proc = host.spawn([find_redis_server(), str(conf)], log_path=host.log_dir / "redis-server.log")
        self.redis[host.name] = proc
        url = f"redis://:{quote(password, safe='')}@{host.ip}:{port}/0"
        client = host.redis_client(url, socket_connect_timeout=0.5, socket_timeout=2.0)
        deadline = Deadline(timeout)
        try:
            while True:
                try:
                    if client.ping():
                        return url
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError, OSError):
                    pass
                if proc.poll() is not None:
                    tail = (host.log_dir / "redis-server.log").read_text(errors="replace").splitlines()[-5:]
                    raise BedError(
                        f"redis-server on {host.name} exited ({proc.returncode}): {' | '.join(tail)}"
                    )
                if deadline.expired():
                    raise BedError(
                        f"redis-server on {host.name} not answering after {deadline.waited_s:.0f}s"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def close(self) -> None:
        """Kill every host and delete the namespaces, veths and bridge. Idempotent. The folders under
        ``root`` stay (the hosts' logs and data, for a post-mortem); deleting them is the caller's."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        errors = []
        for host in list(self.hosts.values()):
            try:
                host.close()
            except Exception as exc:  # keep tearing down the others
                errors.append(f"{host.name}: {exc}")
        _ip("netns", "del", self.switch, check=False)
        if errors:
            raise BedError("closing bed " + self.name + ": " + "; ".join(errors))

    def leftovers(self) -> list[str]:
        """Network namespaces of this bed that still exist (empty after :meth:`close`)."""
        try:
            return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(self.tag + "-"))
        except FileNotFoundError:
            return []

    def __enter__(self) -> Bed:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
