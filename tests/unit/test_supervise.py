"""The supervisor restarts a child that died, but not one that refused its configuration (exit 2: an
ideate worker whose agent executable is missing would otherwise restart forever) unless a service it
needs (Redis) was down; it restarts Redis on its data; its children die with it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from croqq.patience import wait_until
from croqq.processes.redis_server import RedisServer
from croqq.processes.supervise import EXIT_CONFIG, Child, Supervisor


def test_a_crashed_child_is_restarted_a_refused_one_is_not(tmp_path: Path) -> None:
    crash = Child("crash", [sys.executable, "-c", "raise SystemExit(1)"], {}, tmp_path / "crash.log")
    refused = Child(
        "refused", [sys.executable, "-c", f"raise SystemExit({EXIT_CONFIG})"], {}, tmp_path / "r.log"
    )
    sup = Supervisor([crash, refused])
    sup.start_all()
    try:
        # until the crash was restarted and the refusal seen (once seen, it is never restarted)
        restarted = poll_until(
            sup, lambda r: "crash" in r and bool(refused.history), "the crash restarted, the refusal seen"
        )
        assert "crash" in restarted and "refused" not in restarted
        assert refused.history == [EXIT_CONFIG] and not refused.restart
    finally:
        sup.stop(grace_s=60.0)


def poll_until(sup: Supervisor, done: Callable[[list[str]], bool], what: str) -> list[str]:
    """Poll the supervisor until ``done(restarted so far)`` holds (TimeoutError naming ``what`` if it never
    does); returns the names restarted."""
    restarted: list[str] = []

    def polled() -> bool:
        restarted.extend(sup.poll())
        return done(restarted)

    wait_until(polled, 120, what)
    return restarted


def test_an_exit_2_during_a_service_outage_is_a_crash_not_a_refusal(tmp_path: Path) -> None:
    service = Child("svc", ["sleep", "3600"], {}, tmp_path / "svc.log", ready=lambda popen: None)
    # exits 2 half a second after every start, as a worker that cannot reach Redis would
    needy = Child("needy", [sys.executable, "-c", _EXIT_2_SOON], {}, tmp_path / "needy.log")
    sup = Supervisor([needy, service])
    sup.start_all()
    try:
        assert sup.signal("svc", signal.SIGKILL) is not None  # the outage, while needy runs
        restarted = poll_until(sup, lambda r: not needy.restart, "needy refused once svc is back")
        assert restarted.count("svc") == 1 and restarted.count("needy") == 1
        assert needy.history == [EXIT_CONFIG, EXIT_CONFIG]  # refused only once the service was back
    finally:
        sup.stop(grace_s=60.0)


_EXIT_2_SOON = "import time; time.sleep(0.5); raise SystemExit(2)"


def test_a_supervised_redis_comes_back_with_its_data_on_the_same_socket(short_tmp: Path) -> None:
    server = RedisServer(short_tmp / "redis")
    sup = Supervisor([server.child()])
    sup.start_all()
    try:
        client = server.client()
        client.set("croqq:test:durable", "yes")
        pid = sup.signal("redis", signal.SIGKILL)
        assert poll_until(sup, lambda r: "redis" in r, "redis restarted") == ["redis"]
        assert sup.children["redis"].pid != pid and server.client().get("croqq:test:durable") == "yes"
    finally:
        sup.stop(grace_s=60.0)
    assert not sup.children["redis"].alive() and not server.socket.exists()


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from croqq.processes.supervise import Child, Supervisor\n"
        "sup = Supervisor([Child('c', ['sleep', '3600'], {}, Path(sys.argv[1]))])\n"
        "sup.start_all()\n"
        "print(sup.children['c'].pid, flush=True)\n"
        "time.sleep(3600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "c.log")], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    # TimeoutError if the child outlives its supervisor
    wait_until(lambda: not Path(f"/proc/{child}").exists(), 60, "the child to die with its supervisor")
