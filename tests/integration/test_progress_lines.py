"""Progress without a terminal: `croqq up` and `croqq status --watch` with stdout on a pipe print one
progress line at a steady interval (and `croqq up` appends the same lines to <run dir>/logs/progress.log),
so `make demo 2>&1 | tee demo.log` shows the run advancing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.processes.redis_server import RedisServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ progress: (\d+)/(\d+) iterations \(\d+\.\d%\) after \S+, "
    r"[\d.]+ iter/s, ETA \S+; shapes done (\d+) active \d+ pending \d+ error 0; KEEP \d+ DISCARD \d+ "
    r"FAIL \d+ attempts \d+; GPUs 2 \(\d healthy, \d busy\)$"
)


def _env(root: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "CROQQ_RUN_DIR": str(root / "run"),
        "CROQQ_RESULTS_REPO": str(root / "results"),
        "CROQQ_PIPELINE_DEPTH": "2",
        "CROQQ_TIME_SCALE": "0.02",
        "CROQQ_PROGRESS_EVERY_S": "1",
    }


def _progress(text: str) -> list[re.Match[str]]:
    return [m for m in map(LINE.match, text.splitlines()) if m]


def test_up_and_status_watch_print_progress_lines_to_a_pipe(tmp_path: Path) -> None:
    env = _env(tmp_path)
    argv = ["up", "--dtype", "f16", "--max-iter", "10", "--limit", "3", "--sim-gpus", "2", "--exit-when-done"]
    up = subprocess.Popen(
        [sys.executable, "-m", "croqq", *argv],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "logs" / "progress.log").exists():  # the cluster is up and submitted
            assert up.poll() is None and time.monotonic() < deadline, "croqq up ended before any progress"
            time.sleep(0.2)
        watched = tmp_path / "watch.out"
        with watched.open("w") as sink:
            watch = subprocess.Popen(
                [sys.executable, "-m", "croqq", "status", "--watch"],
                env=env,
                cwd=ROOT,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        seen: list[float] = []  # when the watcher's 1st, 2nd, 3rd line appeared
        deadline = time.monotonic() + 60
        while len(seen) < 3 and time.monotonic() < deadline and watch.poll() is None:
            if len(_progress(watched.read_text())) > len(seen):
                seen.append(time.monotonic())
            time.sleep(0.05)
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=20)
        out = up.communicate(timeout=240)[0]
    finally:
        up.kill()
    assert up.returncode == 0, out[-2000:]
    lines = _progress(out)
    # one line a second from submission to the end, then the final one when every shape is done
    assert len(lines) >= 3, out[-2000:]
    done = [int(m.group(1)) for m in lines]
    assert done == sorted(done) and done[-1] == int(lines[-1].group(2)) == 3 * 11, out[-2000:]
    assert int(lines[-1].group(3)) == 3
    assert "\x1b[" not in out, "no terminal: no escape sequences"
    logged = (tmp_path / "run" / "logs" / "progress.log").read_text().splitlines()
    assert [m.group(0) for m in lines] == logged
    assert len(seen) == 3, watched.read_text()
    assert seen[2] - seen[0] > 1.5, "CROQQ_PROGRESS_EVERY_S=1: one line a second, not a flood"
    assert "\x1b[" not in watched.read_text()


def test_status_watch_says_when_redis_is_gone_and_goes_on_when_it_is_back(
    cluster_env: dict[str, str], redis_server: RedisServer, tmp_path: Path
) -> None:
    out = tmp_path / "watch.out"

    def wait_for(what: Callable[[str], bool], why: str) -> None:
        deadline = time.monotonic() + 60
        while not what(out.read_text()):
            assert watch.poll() is None and time.monotonic() < deadline, f"{why}: {out.read_text()[-1500:]}"
            time.sleep(0.1)

    with out.open("w") as sink:
        watch = subprocess.Popen(
            [sys.executable, "-m", "croqq", "status", "--watch", "--every", "0.3"],
            env={"PATH": "/usr/bin:/bin", **cluster_env},
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda text: "progress: " in text, "no progress line")
        redis_server.kill()
        wait_for(lambda text: "croqq: Redis unreachable" in text, "nothing said of the lost Redis")
        redis_server.start()
        gone = out.read_text().count("progress: ")
        wait_for(lambda text: text.count("progress: ") > gone, "no progress line after Redis came back")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=20) == 0
    finally:
        watch.kill()
