"""croqq's agent launcher: join the run's cgroups, set its rlimits, optionally build the read-only view,
then start the agent (see :mod:`croqq.proposers.agent.jail`, which builds its command line).

Run as ``python -I confine.py [options] -- argv...``; standard library only, like ``scripted.py``.

- ``--join FILE`` (repeatable): write this process's pid into a cgroup's ``cgroup.procs`` first, so the
  agent and everything it starts is counted there (process count, memory).
- ``--cpu S --as BYTES --fsize BYTES --nproc N``: rlimits (0: not set). The CPU limit's soft value sends
  SIGXCPU; the hard one, a few seconds later, SIGKILL.
- ``--view WORKSPACE`` (``unshare`` jail; run as pid 1 of fresh mount and PID namespaces made by
  ``unshare --mount --pid --fork --mount-proc``): every mount read-only except the workspace, whose
  provided files (``--ro NAME``) stay read-only; a minimal ``/dev``; ``/proc/sys`` and its siblings
  read-only; no capabilities and no new privileges for the agent. This launcher then stays pid 1: it
  forks the agent, reaps orphans and exits with the agent's status (128 + signal when killed, as bwrap
  does); the kernel kills whatever is left in the namespace when it exits.

Every import is a cost paid at each agent call: nothing beyond ``os``, ``sys``, ``resource`` and ``types``
at start-up (no argparse or pathlib: about 14 ms of a 2-core machine's CPU per call), and ``ctypes`` only
where the view is built.
"""

from __future__ import annotations

import os
import resource
import sys
from types import SimpleNamespace

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
KEEP_FLAGS = {  # a remount keeps these (in a user namespace, dropping one is refused)
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
}
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
PROC_RO = ("sys", "sysrq-trigger", "irq", "bus")  # what bwrap also makes read-only in its /proc
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
CPU_KILL_AFTER_S = 5  # SIGXCPU at the limit, SIGKILL this much later

OPTIONS = {"join": list, "cpu": int, "as": int, "fsize": int, "nproc": int, "view": str, "ro": list}


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    import ctypes  # here: only a --view launcher needs it

    libc = ctypes.CDLL(None, use_errno=True)
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mounts() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount, from /proc/self/mountinfo."""
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")  # \040 for a space
        found.append((point, set(fields[5].split(","))))
    return found


def _read_only(target: str, options: set[str]) -> None:
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for name, flag in KEEP_FLAGS.items():
        flags |= flag if name in options else 0
    _mount("", target, None, flags)


def _bind_read_only(path: str) -> None:
    _mount(path, path, None, MS_BIND | MS_REC)
    _read_only(path, set())


def build_view(workspace: str, read_only: list[str]) -> None:
    """The bwrap-equivalent view, in this (fresh) mount namespace."""
    _mount("", "/", None, MS_REC | MS_PRIVATE)
    _mount(workspace, workspace, None, MS_BIND | MS_REC)
    host_dev = os.open("/dev", os.O_PATH)  # the host's /dev, still reachable once covered
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=65536k")
    for name in DEVICES:  # bound from the host's nodes: mknod is refused in a user namespace
        os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(f"/proc/self/fd/{host_dev}/{name}", f"/dev/{name}", None, MS_BIND)
    os.close(host_dev)
    os.mkdir("/dev/shm", 0o1777)
    os.chmod("/dev/shm", 0o1777)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"/dev/{name}")
    os.symlink("/proc/self/fd", "/dev/fd")
    ws = workspace.rstrip("/")
    for point, options in _mounts():
        if (
            point == ws
            or point.startswith((ws + "/", "/proc"))
            or point == "/dev"
            or point.startswith("/dev/")
        ):
            continue
        try:
            _read_only(point, options)
        except OSError:
            if os.path.exists(point):  # a mount hidden under another one cannot be reached, nor remounted
                raise
    for name in PROC_RO:
        if os.path.exists(f"/proc/{name}"):
            _bind_read_only(f"/proc/{name}")
    for name in read_only:
        path = os.path.join(workspace, name)
        if os.path.lexists(path):
            _bind_read_only(path)


def drop_privileges() -> None:
    """No capabilities after exec (root included) and none to regain: bwrap's default for the agent."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    last = int(_read("/proc/sys/kernel/cap_last_cap"))
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def set_limits(args: SimpleNamespace) -> None:
    if args.cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (args.cpu, args.cpu + CPU_KILL_AFTER_S))
    for limit, value in ((resource.RLIMIT_AS, args.as_), (resource.RLIMIT_FSIZE, args.fsize)):
        if value:
            resource.setrlimit(limit, (value, value))
    if args.nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))


def _status(wait_status: int) -> int:
    return (
        128 + os.WTERMSIG(wait_status)
        if os.WIFSIGNALED(wait_status)
        else os.waitstatus_to_exitcode(wait_status)
    )


def run_as_init(argv: list[str]) -> int:
    """pid 1 of the agent's namespace: fork the agent, reap every orphan, return the agent's status."""
    child = os.fork()
    if child == 0:
        try:
            drop_privileges()
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"croqq jail: cannot start {argv[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            return 127
        if pid == child:
            return _status(wait_status)


def _usage_error(message: str) -> SystemExit:
    print(
        f"usage: confine.py [--join FILE] [--cpu S] [--as BYTES] [--fsize BYTES] [--nproc N] "
        f"[--view WORKSPACE] [--ro NAME] -- argv...\nconfine.py: error: {message}",
        file=sys.stderr,
    )
    return SystemExit(2)


def parse(argv: list[str]) -> SimpleNamespace:
    """The options (``--name=value`` or ``--name value``; ``--join`` and ``--ro`` repeat) up to ``--``, then
    the agent's argv; a bad one exits 2 with a usage line, as argparse would."""
    args = SimpleNamespace(join=[], cpu=0, as_=0, fsize=0, nproc=0, view="", ro=[], command=[])
    rest = list(argv)
    while rest and rest[0] != "--":
        word = rest.pop(0)
        name, eq, value = word[2:].partition("=")
        kind = OPTIONS.get(name) if word.startswith("--") else None
        if kind is None:
            raise _usage_error(f"unrecognized argument: {word}")
        if not eq:
            if not rest or rest[0] == "--":
                raise _usage_error(f"argument --{name}: expected one argument")
            value = rest.pop(0)
        attr = "as_" if name == "as" else name
        if kind is list:
            getattr(args, attr).append(value)
        elif kind is int:
            try:
                setattr(args, attr, int(value))
            except ValueError:
                raise _usage_error(f"argument --{name}: invalid int value: {value!r}") from None
        else:
            setattr(args, attr, value)
    args.command = rest[1:]
    if not args.command:
        raise _usage_error("no command after --")
    return args


def main() -> int:
    args = parse(sys.argv[1:])
    for procs in args.join:
        with open(procs, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    if args.view:
        build_view(args.view, args.ro)
        os.chdir(os.getcwd())  # the cwd still pointed into the mount below the workspace's own bind
    set_limits(args)
    if args.view:
        return run_as_init(args.command)
    try:
        os.execvp(args.command[0], args.command)
    except OSError as exc:
        print(f"croqq jail: cannot start {args.command[0]}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
