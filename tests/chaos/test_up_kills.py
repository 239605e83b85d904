"""`croqq up` keeps its promises while anything under it is SIGKILLed: Redis, every role, their pool
children, or the `croqq up` supervisor itself; the run finishes on its own with nothing lost or duplicated.

These drive a real `croqq up` subprocess (embedded Redis, 2 simulated GPUs, lease TTL 3 s) and find its
processes in /proc, so what is tested is the supervisor's own restarts, not the stress harness's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from croqq.chaos.invariants import repo_problems, stored_iterations
from croqq.patience import Deadline, wait_until
from croqq.store.paths import RunPaths
from tests.localenv import FAST_RECOVERY, ROOT, run_croqq, run_dirs
from tests.output import error_line

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
RUN = "tuning/sm90_Simulated_H100_SXM/cutlass"  # the default (from_current_best) family
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
SHAPES, MAX_ITER = 8, 15
SHORT_MAX_ITER = 6  # killing the supervisor once needs less work to land mid-run
KINDS = {"redis", "coordinator", "writer", "beat", "build-worker", "ideate-worker", "gpu-worker", "pool"}


def up_env(root: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        **run_dirs(root),
        "CROQQ_PIPELINE_DEPTH": "2",
        **FAST_RECOVERY,
        "CROQQ_TIME_SCALE": "0.02",  # ~2 s per iteration and shape: 128 iterations take about a minute
    }


def start_up(root: Path, log: str, max_iter: int = MAX_ITER) -> subprocess.Popen[bytes]:
    argv = ["up", "--dtype", "f16", "--max-iter", str(max_iter), "--limit", str(SHAPES), "--sim-gpus", "2"]
    with (root / log).open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "croqq", *argv, "--exit-when-done"],
            env=up_env(root),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _proc(pid: int) -> tuple[int, list[str]] | None:
    """(parent pid, argv) of a live process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[1]), argv) if fields[0] not in ("Z", "X") else None


def _role(argv: list[str]) -> str:
    if "redis-server" in argv[0]:
        return "redis"
    rest = argv[argv.index("croqq") + 1 :] if "croqq" in argv else ["?"]
    if rest[0] == "gpu-worker":
        return f"gpu{rest[rest.index('--index') + 1]}"
    return rest[0]


def tree(root_pid: int) -> dict[int, str]:
    """pid -> role of every process under ``root_pid``: its children by command line, their descendants as
    '<role> pool' (Celery's pool children, forked without exec)."""
    procs = {int(e): p for e in os.listdir("/proc") if e.isdigit() and (p := _proc(int(e))) is not None}
    roles: dict[int, str] = {}
    frontier = [pid for pid, (ppid, _) in procs.items() if ppid == root_pid]
    for pid in frontier:
        roles[pid] = _role(procs[pid][1])
    while frontier:
        frontier = [pid for pid, (ppid, _) in procs.items() if ppid in frontier and pid not in roles]
        for pid in frontier:
            parent = roles[procs[pid][0]]
            roles[pid] = parent if parent.endswith(" pool") else f"{parent} pool"
    return roles


def kind(role: str) -> str:
    if role.endswith(" pool"):
        return "pool"
    return "gpu-worker" if role.startswith("gpu") else role


def kill_randomly(up: subprocess.Popen[bytes], seconds: float, every_s: float, seed: int) -> list[str]:
    """SIGKILL one process of ``up``'s tree every ``every_s`` (each kind of process in turn, in a random
    order each round, then a random process of that kind), never ``up`` itself, for ``seconds`` (unloaded:
    the window stretches with the machine's load) or until ``up`` exits; return what was killed."""
    rng = random.Random(seed)
    killed: list[str] = []
    order: list[str] = []
    window = Deadline(seconds)
    while not window.expired() and up.poll() is None:
        time.sleep(every_s)
        procs = tree(up.pid)
        present = sorted({kind(r) for r in procs.values()})
        if not order:
            order = rng.sample(sorted(KINDS), len(KINDS))
        wanted = next((k for k in order if k in present), None)
        if wanted is None:
            continue
        order.remove(wanted)
        pid = rng.choice(sorted(p for p, r in procs.items() if kind(r) == wanted))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(f"{procs[pid]}:{pid}")
    return killed


def assert_nothing_lost(root: Path, max_iter: int = MAX_ITER) -> None:
    repo = root / "results"
    assert repo_problems(repo) == []  # validate, one row and one commit per iteration, git fsck
    rows = stored_iterations(repo)
    assert len(rows) == SHAPES * (max_iter + 1) and set(rows.values()) == {1}
    state = json.loads((repo / RUN / "state.json").read_text())["shapes"]
    assert len(state) == SHAPES
    assert all(e["status"] == "done" for e in state.values()), state
    ckpts = [json.loads((repo / PATHS.checkpoint(k)).read_text()) for k in state]
    assert all(c["current_iter"] == max_iter for c in ckpts), ckpts
    done = run_croqq(up_env(root), "validate", "--dsl", "all")
    assert done.returncode == 0, done.stdout + done.stderr


def wait_stored(root: Path, up: subprocess.Popen[bytes], log: str, count: int, budget_s: float = 300) -> None:
    """Until the results repo has ``count`` commits; fails if ``up`` exits first or they never come."""

    def stored() -> bool:
        assert up.poll() is None, output(root, log)[-3000:]
        commits = subprocess.run(
            ["git", "-C", str(root / "results"), "rev-list", "--count", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
        return commits.returncode == 0 and int(commits.stdout.strip() or 0) >= count

    wait_until(stored, budget_s, f"{count} commits in the results repo", every_s=0.5)


def wait_exit(proc: subprocess.Popen[bytes] | subprocess.Popen[str], budget_s: float, what: str) -> int:
    """``proc``'s exit code, once it has exited (within ``budget_s`` unloaded seconds)."""
    wait_until(lambda: proc.poll() is not None, budget_s, what, every_s=0.2)
    return proc.wait()


def output(root: Path, log: str) -> str:
    return (root / log).read_text(errors="replace")


@pytest.mark.timeout(3600)
def test_random_kills_under_croqq_up_lose_and_duplicate_nothing(short_tmp: Path) -> None:
    up = start_up(short_tmp, "up.log")
    try:
        wait_stored(short_tmp, up, "up.log", 10)
        killed = kill_randomly(up, seconds=120, every_s=3.0, seed=int(os.environ.get("CROQQ_TEST_SEED", "5")))
        rc = wait_exit(up, 900, "croqq up to finish the run after the kills")
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=120)
    print(f"{len(killed)} processes killed: {', '.join(killed)}")
    assert rc == 0, output(short_tmp, "up.log")[-3000:]
    assert {kind(k.split(":")[0]) for k in killed} == KINDS, killed
    assert "done in" in output(short_tmp, "up.log")
    assert_nothing_lost(short_tmp)


@pytest.mark.timeout(3600)
def test_a_killed_croqq_up_takes_its_cluster_along_and_a_rerun_finishes(short_tmp: Path) -> None:
    first = start_up(short_tmp, "first.log", max_iter=SHORT_MAX_ITER)
    try:
        wait_stored(short_tmp, first, "first.log", 20)

        def every_kind_running() -> dict[int, str] | None:  # a child restarting (or a pool forking) is back
            assert first.poll() is None, output(short_tmp, "first.log")[-3000:]
            procs = tree(first.pid)
            return procs if {kind(r) for r in procs.values()} == KINDS else None

        procs = wait_until(every_kind_running, 300, f"every kind of process under croqq up: {sorted(KINDS)}")
        first.kill()  # the supervisor itself: no clean shutdown, no chance to stop its children
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()

    def all_gone() -> bool:
        return not any(_proc(pid) for pid in procs)

    with contextlib.suppress(TimeoutError):  # those left are named below
        wait_until(all_gone, 60, "the killed supervisor's children to die")
    left = {pid: role for pid, role in procs.items() if _proc(pid)}
    assert not left, f"still running after the supervisor was killed: {left}"

    second = start_up(short_tmp, "second.log", max_iter=SHORT_MAX_ITER)
    try:
        rc = wait_exit(second, 900, "the second croqq up to finish the run")
    finally:
        if second.poll() is None:
            second.send_signal(signal.SIGINT)
            second.wait(timeout=120)
    text = output(short_tmp, "second.log")
    assert rc == 0, text[-3000:]
    assert f"a croqq up (pid {first.pid}) that died in" in text and "left no process running" in text
    assert_nothing_lost(short_tmp, SHORT_MAX_ITER)


@pytest.mark.timeout(1800)
def test_a_second_croqq_up_on_a_live_run_folder_is_refused(short_tmp: Path) -> None:
    first = subprocess.Popen(
        [sys.executable, "-m", "croqq", "up", "--sim-gpus", "1"],
        env=up_env(short_tmp),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []  # what the first printed (read on, so that it never blocks on a full pipe)

    def read() -> None:
        assert first.stdout is not None
        for line in first.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def cluster_up() -> bool:
            assert first.poll() is None, "".join(lines)
            return any("croqq cluster up" in line for line in list(lines))

        wait_until(cluster_up, 300, "the first croqq up to say `croqq cluster up`")
        second = run_croqq(up_env(short_tmp), "up", "--sim-gpus", "1", timeout=300)
        refused = error_line(second.stderr)
        assert second.returncode == 2, second.stderr
        assert f"already runs in {short_tmp / 'run'} (croqq up pid {first.pid})" in refused
        assert f"`kill {first.pid}`" in refused and first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        try:
            wait_exit(first, 180, "the first croqq up to stop on SIGINT")
        finally:
            if first.poll() is None:
                first.kill()
            reader.join(timeout=60)
    assert first.returncode == 0, "".join(lines)[-3000:]
