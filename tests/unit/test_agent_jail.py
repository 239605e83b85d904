"""The agent jail in each mode: outside its workspace nothing is writable (bubblewrap, or croqq's own view
built with unshare where bubblewrap is missing), a preset whose network policy is ``none`` reaches nothing,
and an ideate worker whose agents would run unjailed raises the alarm ``agents_unjailed``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from croqq.delivery.leases import Heartbeat
from croqq.domain.records import Idea, Rejection
from croqq.processes.redis_server import RedisServer
from croqq.proposers.agent import jail
from croqq.proposers.agent.presets import PRESETS
from croqq.proposers.agent.proposer import AgentProposer
from croqq.work import alarms
from tests.agents import JAILS, MANIFEST, MODES, ROOT, context, fixture_agent, settings


@pytest.fixture
def outside() -> Iterator[Path]:
    path = Path("/tmp") / f"croqq-escape-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", MODES)
def test_jailed_an_agent_writes_its_workspace_but_nothing_outside_it(mode: str, outside: Path) -> None:
    answer = AgentProposer(MANIFEST, fixture_agent("escape.py", outside, agent_jail=mode)).propose(context())
    assert isinstance(answer, Idea), answer  # its answer inside the workspace was written and read back
    if mode == "none":  # what the jail is for: unjailed, the write lands
        assert outside.exists() and "outside write written" in answer.summary
    else:
        assert not outside.exists(), f"{mode}: the agent wrote {outside}"
        assert "outside write refused (Read-only file system)" in answer.summary


@pytest.mark.parametrize("mode", JAILS)
def test_jailed_an_agent_has_no_capabilities_and_cannot_set_a_sysctl(mode: str) -> None:
    """Even as root: no capability to remount its view writable, and /proc/sys read-only."""
    printk = Path("/proc/sys/kernel/printk")
    before = printk.read_text()
    answer = AgentProposer(MANIFEST, fixture_agent("escape.py", printk, agent_jail=mode)).propose(context())
    assert isinstance(answer, Idea), answer
    assert "outside write refused (Read-only file system); CapEff 0000000000000000" in answer.summary
    assert printk.read_text() == before


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.mark.parametrize("mode", JAILS)
def test_an_agent_without_network_cannot_connect_to_the_host(mode: str, listener: int) -> None:
    reached = AgentProposer(
        MANIFEST, fixture_agent("connect.py", listener, agent_jail=mode, agent_network="host")
    ).propose(context())
    assert isinstance(reached, Rejection) and "exited 8" in reached.reason, reached  # it can, with host
    cut = AgentProposer(
        MANIFEST, fixture_agent("connect.py", listener, agent_jail=mode, agent_network="none")
    ).propose(context())
    assert isinstance(cut, Rejection) and "exited 7" in cut.reason and "cannot connect" in cut.reason, cut


def test_the_scripted_agent_has_no_network_and_api_agents_have_the_hosts() -> None:
    assert jail.network(PRESETS["scripted"], settings()) == "none"
    assert {jail.network(PRESETS[name], settings()) for name in ("claude", "codex", "aider")} == {"host"}
    assert jail.network(PRESETS["claude"], settings(agent_network="none")) == "none"


def _jail_alarm_after_one_beat(
    server: RedisServer, client: redis.Redis, agent_jail: str
) -> list[alarms.Alarm]:
    from croqq.cli.processes import _jail_alarm

    beats, on_exit = _jail_alarm(settings(agent_jail=agent_jail, broker_url=server.url))
    hb = Heartbeat(60.0)
    beats(hb)
    hb.beat_now()
    found = [a for a in alarms.active(client) if a.name == jail.ALARM]
    if agent_jail == "none":  # the worker's exit clears it
        on_exit()
        assert [a for a in alarms.active(client) if a.name == jail.ALARM] == []
    return found


@pytest.mark.parametrize("mode", JAILS)
def test_agents_run_unjailed_raise_an_alarm_that_a_working_jail_clears(
    redis_server: RedisServer, redis_client: redis.Redis, mode: str
) -> None:
    raised = _jail_alarm_after_one_beat(redis_server, redis_client, "none")
    assert len(raised) == 1 and raised[0].message.startswith("agents run WITHOUT a jail on this host")
    _jail_alarm_after_one_beat(redis_server, redis_client, "none")
    alarms.raise_alarm(redis_client, jail.ALARM, "left by an earlier start of this worker")
    assert _jail_alarm_after_one_beat(redis_server, redis_client, mode) == []


def _mode_with_path(tmp_path: Path, tools: list[str]) -> str:
    """jail_mode(auto) in a fresh process whose PATH holds only ``tools`` (a machine without the others)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    code = "from croqq.proposers.agent import jail; from croqq.settings import Settings; "
    code += "print(jail.jail_mode(Settings()))"
    env = {"PATH": str(bin_dir), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_bubblewrap_auto_builds_the_jail_with_unshare_and_without_either_runs_unjailed(
    tmp_path: Path,
) -> None:
    if not jail.unshare_works():
        pytest.skip("this process cannot create mount and PID namespaces")
    assert _mode_with_path(tmp_path, ["unshare"]) == "unshare"
    assert _mode_with_path(tmp_path / "bare", []) == "none"


def test_for_an_unprivileged_user_the_view_is_built_in_a_user_namespace(outside: Path) -> None:
    """What ``auto`` runs for a worker that is not root: unshare with ``--user --map-root-user``."""
    setpriv = shutil.which("setpriv")
    nobody = [setpriv or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    in_user_ns = [*nobody, "unshare", "--user", "--map-root-user"]
    pythons = (sys.executable, "/usr/bin/python3")
    python = next((p for p in pythons if setpriv and _runs_as(in_user_ns, [p, "-c", ""])), "")
    if os.geteuid() != 0 or not python:
        pytest.skip("needs root, setpriv, user namespaces and a Python an unprivileged user may run")
    with tempfile.TemporaryDirectory(prefix="croqq-userns-") as top:  # pytest's tmp_path is root's only
        Path(top).chmod(0o755)
        launcher = Path(shutil.copy(jail.CONFINE, top))  # where the unprivileged user can read it
        ws = Path(top) / "ws"
        ws.mkdir(mode=0o777)
        ws.chmod(0o777)
        (ws / "best.cu").write_text("best\n")
        view = [python, "-I", str(launcher), f"--view={ws}", "--ro=best.cu", "--"]
        script = f"echo x > {outside}; echo y > best.cu; echo z > candidate.cu"
        jailed = [*in_user_ns, *jail.UNSHARE, "--", *view, "sh", "-c", script]
        done = subprocess.run(jailed, cwd=ws, capture_output=True, text=True, timeout=60, check=False)
        assert (ws / "candidate.cu").exists(), done.stderr
        assert (ws / "best.cu").read_text() == "best\n" and not outside.exists(), done.stderr


def _runs_as(user: list[str], command: list[str]) -> bool:
    try:
        return subprocess.run([*user, *command], capture_output=True, timeout=60, check=False).returncode == 0
    except OSError:
        return False


def test_the_launcher_reads_its_options_in_both_spellings_and_starts_on_the_standard_library_alone() -> None:
    from croqq.proposers.agent import confine

    args = confine.parse(
        ["--join=/a", "--join", "/b", "--cpu=5", "--as", "7", "--ro=best.cu", "--", "x", "--y"]
    )
    assert (args.join, args.cpu, args.as_, args.ro, args.command) == (
        ["/a", "/b"],
        5,
        7,
        ["best.cu"],
        ["x", "--y"],
    )
    probe = (
        "import sys, runpy; runpy.run_path(sys.argv[1]); "
        "print(sorted({'argparse', 'pathlib', 'ctypes'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, str(jail.CONFINE)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == ["[]"], out.stderr


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--cpu=x", "--", "true"], "argument --cpu: invalid int value: 'x'"),
        (["--bogus", "--", "true"], "unrecognized argument: --bogus"),
        (["--view", "--", "true"], "argument --view: expected one argument"),
        (["--cpu=5"], "no command after --"),
    ],
)
def test_the_launcher_refuses_a_bad_option_with_exit_2_and_says_which(argv: list[str], words: str) -> None:
    run = subprocess.run(
        [sys.executable, "-I", "-S", str(jail.CONFINE), *argv], check=False, capture_output=True, text=True
    )
    assert run.returncode == 2
    assert run.stderr.splitlines()[-1] == f"confine.py: error: {words}"
