"""Running an agent jailed: one launcher for every preset.

- its own process group (``start_new_session``), killed whole at the wall-clock timeout
  (``agent_timeout_s``), and after the agent exits (helpers it left behind die with it);
- stdin at end-of-file (several agent CLIs hang forever on an open stdin);
- stdout and stderr read by threads that keep at most ``agent_max_output_bytes`` each and drain the rest;
- cwd = the workspace; the environment scrubbed: ``PATH``, ``LANG``/``LC_*``, ``TERM``, ``TZ``, a ``HOME``
  in the workspace's scratch folder, and only the variable names the preset lists (its API keys). No
  Redis URL or password, no ``CROQQ_*`` setting reaches the agent;
- resource limits in every mode (:mod:`.limits`: CPU, memory, processes, file size), set by the launcher
  ``confine.py`` before the agent starts; a run stopped by one says which;
- a jail (:func:`jail_mode`): ``bwrap`` where bubblewrap works, else ``unshare`` where this process may
  create namespaces (``confine.py`` builds the same view itself): everything read-only except the
  workspace (and in it, the provided files and ``include/`` are read-only too; ``TMPDIR`` is its scratch
  folder), its own PID namespace, no capabilities, and no network when the preset's policy is ``none``.
  Where neither works (``none``), :func:`announce` says so at start-up and the workspace snapshot is the
  only line of defence (it still catches every write inside the workspace and escaping symlinks, not
  writes elsewhere), and the network policy cannot be applied.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from croqq.proposers.agent import contract as c
from croqq.proposers.agent.confine import PROC_RO as PROC_READ_ONLY
from croqq.proposers.agent.limits import Cgroup, Limits, enforcement, launcher_args, limit_hit
from croqq.proposers.agent.presets import STDLIB_PYTHON, AgentRun, Network, Preset
from croqq.settings import Settings

log = logging.getLogger(__name__)

KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")
KILL_GRACE_S = 2.0
SIGNALLED = 128
CONFINE = Path(__file__).resolve().parent / "confine.py"
UNSHARE = ("unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts")
READ_ONLY = (*c.PROVIDED, c.INCLUDE, c.NEIGHBOURS)
ALARM = "agents_unjailed"  # raised by the ideate worker (croqq.work.alarms) while agents run unjailed


def _probe(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """True when bubblewrap is installed and can build a namespace here (it needs user or mount
    namespaces, which some containers refuse)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    return _probe([exe, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--die-with-parent", "true"])


@functools.lru_cache(maxsize=1)
def unshare_works() -> bool:
    """True when ``unshare`` (util-linux) can make mount and PID namespaces here and ``confine.py`` can
    build its read-only view in them (root, or unprivileged user namespaces with ``--map-root-user``)."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="croqq-jail-probe-") as ws:
        view = [*STDLIB_PYTHON, str(CONFINE), f"--view={ws}"]
        return _probe([*_unshare(), "--", *view, "--", *STDLIB_PYTHON, "-c", ""])


def _unshare(net: bool = False) -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [*UNSHARE, *user, *(["--net"] if net else [])]


def jail_mode(settings: Settings) -> str:
    """``bwrap``, ``unshare`` or ``none``; a jail requested by name but not working is a ConfigError."""
    from croqq.errors import ConfigError

    want = settings.agent_jail
    if want == "none":
        return "none"
    if want in ("auto", "bwrap") and bwrap_works():
        return "bwrap"
    if want in ("auto", "unshare") and unshare_works():
        return "unshare"
    if want == "bwrap":
        raise ConfigError("CROQQ_AGENT_JAIL=bwrap but bubblewrap is missing or cannot create namespaces here")
    if want == "unshare":
        raise ConfigError(
            "CROQQ_AGENT_JAIL=unshare but this process cannot create mount and PID namespaces here "
            "(run as root, or allow unprivileged user namespaces)"
        )
    return "none"


def unjailed_reason(settings: Settings) -> str:
    """The one line an operator sees (log, alarm) when agents run without a jail."""
    why = (
        "disabled by CROQQ_AGENT_JAIL=none"
        if settings.agent_jail == "none"
        else "neither bubblewrap nor unshare can create namespaces here"
    )
    return (
        f"agents run WITHOUT a jail on this host ({why}): only writes inside the workspace are checked and "
        "no network policy applies; install bubblewrap or run the worker as root to jail them"
    )


def network(preset: Preset, settings: Settings) -> Network:
    """``none`` (no network at all) or ``host``: CROQQ_AGENT_NETWORK, else the preset's policy."""
    return preset.network if settings.agent_network == "preset" else settings.agent_network


def announce(settings: Settings) -> str:
    """Say once (worker start-up) how agents are confined on this host."""
    mode = jail_mode(settings)
    if mode == "none":
        log.warning("%s", unjailed_reason(settings))
    else:
        tool = "bubblewrap" if mode == "bwrap" else "unshare"
        log.info("agents run jailed with %s: only their workspace is writable", tool)
    how = enforcement(Limits.of(settings))
    log.info("agent limits: %s", ", ".join(f"{what} by {by}" for what, by in how.items()))
    return mode


def agent_env(preset: Preset, workspace: Path) -> dict[str, str]:
    env = {name: os.environ[name] for name in KEPT_ENV if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({name: os.environ[name] for name in preset.env if name in os.environ})
    env["HOME"] = str(workspace / c.SCRATCH)
    env["TMPDIR"] = str(workspace / c.SCRATCH)
    return env


def bwrap_prefix(workspace: Path, net: bool = False) -> list[str]:
    ws = str(workspace)
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for name in PROC_READ_ONLY:  # root may write them (sysctls): read-only, as confine.py does
        args += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    args += ["--bind", ws, ws]
    for name in READ_ONLY:
        path = workspace / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    isolate = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", *(["--unshare-net"] if net else [])]
    return [*args, "--chdir", ws, *isolate, "--cap-drop", "ALL", "--die-with-parent"]


def command(argv: Sequence[str], workspace: Path, mode: str, net: bool, confine: list[str]) -> list[str]:
    """The whole command line: the launcher with its limits (``confine``), the jail, the agent."""
    launcher = [*STDLIB_PYTHON, str(CONFINE), *confine]
    if mode == "bwrap":
        return [*launcher, "--", *bwrap_prefix(workspace, net), *argv]
    if mode == "unshare":
        view = [f"--view={workspace}", *(f"--ro={name}" for name in READ_ONLY)]
        return [*_unshare(net), "--", *launcher, *view, "--", *argv]
    return [*launcher, "--", *argv]


def _drain(stream: IO[bytes], keep: int, out: list[bytes], over: list[bool]) -> None:
    size = 0
    for chunk in iter(lambda: stream.read(65536), b""):
        if size < keep:
            out.append(chunk[: keep - size])
        if size + len(chunk) > keep:
            over[0] = True
        size += len(chunk)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run(argv: Sequence[str], preset: Preset, workspace: Path, settings: Settings, mode: str) -> AgentRun:
    """Run the agent to completion or to its timeout; never raises for the agent's own failures."""
    limits = Limits.of(settings)
    group = Cgroup.create(limits)
    try:
        net = network(preset, settings) == "none" and mode != "none"
        full = command(argv, workspace, mode, net, launcher_args(limits, group))
        return _run(full, argv[0], preset, workspace, settings, limits, group, jailed=mode != "none")
    finally:
        group.remove()


def _run(
    command: list[str],
    name: str,
    preset: Preset,
    workspace: Path,
    settings: Settings,
    limits: Limits,
    group: Cgroup,
    jailed: bool,
) -> AgentRun:
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workspace,
            env=agent_env(preset, workspace),
            start_new_session=True,
        )
    except OSError as exc:
        return AgentRun(exit_code=127, stdout="", stderr=f"cannot start {name}: {exc}", wall_s=0.0)
    keep = settings.agent_max_output_bytes
    outs: tuple[list[bytes], list[bytes]] = ([], [])
    over = [False]
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=_drain, args=(s, keep, o, over), daemon=True)
        for s, o in ((proc.stdout, outs[0]), (proc.stderr, outs[1]))
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=settings.agent_timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _killpg(proc.pid)  # at the timeout, and helpers the agent left running after it exited
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    group.kill()  # what left the process group (setsid) but not the cgroup; closes the pipes it held
    for reader in readers:
        reader.join(timeout=KILL_GRACE_S)
    wall = time.monotonic() - started
    exit_code = None if timed_out else proc.returncode
    if jailed and exit_code is not None and SIGNALLED < exit_code <= SIGNALLED + 64:
        exit_code = SIGNALLED - exit_code  # a jail reports its agent killed by signal N as 128 + N
    stderr = b"".join(outs[1]).decode("utf-8", errors="replace")
    failed = timed_out or exit_code != 0
    return AgentRun(
        exit_code=exit_code,
        stdout=b"".join(outs[0]).decode("utf-8", errors="replace"),
        stderr=stderr,
        wall_s=round(wall, 3),
        timed_out=timed_out,
        truncated=over[0],
        limit=limit_hit(limits, group, exit_code, stderr) if failed else "",
    )
