"""Running an agent jailed: one launcher for every preset.

- its own process group (``start_new_session``), killed whole at the wall-clock timeout
  (``agent_timeout_s``), and after the agent exits (helpers it left behind die with it);
- stdin at end-of-file (several agent CLIs hang forever on an open stdin);
- stdout and stderr read by threads that keep at most ``agent_max_output_bytes`` each and drain the rest;
- cwd = the workspace; the environment scrubbed: ``PATH``, ``LANG``/``LC_*``, ``TERM``, ``TZ``, a ``HOME``
  in the workspace's scratch folder, and only the variable names the preset lists (its API keys). No
  Redis URL or password, no ``CROQQ_*`` setting reaches the agent;
- where bubblewrap works, a mount namespace in which everything is read-only except the workspace (and
  in it, the provided files and ``include/`` are read-only too; ``TMPDIR`` is its scratch folder), its own PID
  namespace, and ``--die-with-parent``. Where it does not, :func:`jail_mode` says so once at start-up and
  the workspace snapshot is the only line of defence (it still catches every write inside the workspace
  and escaping symlinks, not writes elsewhere).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from croqq.proposers.agent import contract as c
from croqq.proposers.agent.presets import AgentRun, Preset
from croqq.settings import Settings

log = logging.getLogger(__name__)

KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")
KILL_GRACE_S = 2.0


@functools.lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """True when bubblewrap is installed and can build a namespace here (it needs user or mount
    namespaces, which some containers refuse)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--die-with-parent", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def jail_mode(settings: Settings) -> str:
    """``bwrap`` or ``none``; ``bwrap`` requested but not working is a ConfigError."""
    from croqq.errors import ConfigError

    if settings.agent_jail == "none":
        return "none"
    if bwrap_works():
        return "bwrap"
    if settings.agent_jail == "bwrap":
        raise ConfigError("CROQQ_AGENT_JAIL=bwrap but bubblewrap is missing or cannot create namespaces here")
    return "none"


def announce(settings: Settings) -> str:
    """Say once (worker start-up) how agents are confined on this host."""
    mode = jail_mode(settings)
    if mode == "none":
        log.warning(
            "agents run WITHOUT a mount-namespace jail on this host (bubblewrap %s): only writes inside "
            "the workspace are checked; install bubblewrap (apt-get install bubblewrap) to make the rest "
            "of the filesystem read-only for them",
            "disabled by CROQQ_AGENT_JAIL=none" if settings.agent_jail == "none" else "not usable",
        )
    else:
        log.info("agents run jailed with bubblewrap: only their workspace is writable")
    return mode


def agent_env(preset: Preset, workspace: Path) -> dict[str, str]:
    env = {name: os.environ[name] for name in KEPT_ENV if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({name: os.environ[name] for name in preset.env if name in os.environ})
    env["HOME"] = str(workspace / c.SCRATCH)
    env["TMPDIR"] = str(workspace / c.SCRATCH)
    return env


def bwrap_prefix(workspace: Path) -> list[str]:
    ws = str(workspace)
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    args += ["--bind", ws, ws]
    for name in (*c.PROVIDED, c.INCLUDE):
        path = workspace / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    return [*args, "--chdir", ws, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]


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
    command = [*bwrap_prefix(workspace), *argv] if mode == "bwrap" else list(argv)
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
        return AgentRun(exit_code=127, stdout="", stderr=f"cannot start {argv[0]}: {exc}", wall_s=0.0)
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
    for reader in readers:
        reader.join(timeout=KILL_GRACE_S)
    wall = time.monotonic() - started
    return AgentRun(
        exit_code=None if timed_out else proc.returncode,
        stdout=b"".join(outs[0]).decode("utf-8", errors="replace"),
        stderr=b"".join(outs[1]).decode("utf-8", errors="replace"),
        wall_s=round(wall, 3),
        timed_out=timed_out,
        truncated=over[0],
    )
