"""Progress without a terminal: `croqq up` and `croqq status --watch` with stdout on a pipe print one
progress line at a steady interval (and `croqq up` appends the same lines to <run dir>/logs/progress.log),
so `make demo 2>&1 | tee demo.log` shows the run advancing."""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.patience import wait_until
from croqq.processes.redis_server import RedisServer
from tests.localenv import run_dirs

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
        **run_dirs(root),
        "CROQQ_PIPELINE_DEPTH": "2",
        "CROQQ_TIME_SCALE": "0.02",
        "CROQQ_PROGRESS_EVERY_S": "1",
    }


def _progress(text: str) -> list[re.Match[str]]:
    return [m for m in map(LINE.match, text.splitlines()) if m]


def _stamp(line: re.Match[str]) -> dt.datetime:
    """The time a progress line says it was taken (its first field, to the second)."""
    return dt.datetime.strptime(line.group(0).split(" ", 1)[0], "%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.timeout(2400)
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

        def submitted() -> bool:  # the cluster is up and submitted
            assert up.poll() is None, "croqq up ended before any progress"
            return (tmp_path / "run" / "logs" / "progress.log").exists()

        wait_until(submitted, 300, "croqq up's first progress line", every_s=0.2)
        watched = tmp_path / "watch.out"
        with watched.open("w") as sink:
            watch = subprocess.Popen(
                [sys.executable, "-m", "croqq", "status", "--watch"],
                env=env,
                cwd=ROOT,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

        def three_lines() -> bool:
            assert watch.poll() is None, watched.read_text()
            return len(_progress(watched.read_text())) >= 3

        try:
            wait_until(three_lines, 300, "3 progress lines from croqq status --watch", every_s=0.1)
        finally:
            watch.send_signal(signal.SIGINT)
            watch.wait(timeout=60)
        out = up.communicate(timeout=1800)[0]  # the whole run: its own waits stretch with the load
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
    expected = r"^\d+ iterations to store: expected duration about \dh\d\dm\d\ds "
    assert re.search(expected, out, re.M), out[:2000]  # said once, when it submitted
    logged = (tmp_path / "run" / "logs" / "progress.log").read_text().splitlines()
    assert [m.group(0) for m in lines] == logged
    stamps = [_stamp(m) for m in _progress(watched.read_text())]
    assert len(stamps) >= 3 and stamps == sorted(stamps), watched.read_text()
    # CROQQ_PROGRESS_EVERY_S=1: one line a second, not a flood (lines >= 1 s apart: the 1st and 3rd are
    # >= 2 s apart, so their stamps, to the second, differ)
    assert stamps[2] > stamps[0], watched.read_text()
    assert "\x1b[" not in watched.read_text()


@pytest.mark.timeout(1800)
def test_status_watch_says_when_redis_is_gone_and_goes_on_when_it_is_back(
    cluster_env: dict[str, str], redis_server: RedisServer, tmp_path: Path
) -> None:
    out = tmp_path / "watch.out"

    def wait_for(what: Callable[[str], bool], why: str) -> None:
        def seen() -> bool:
            assert watch.poll() is None, f"{why}: {out.read_text()[-1500:]}"
            return what(out.read_text())

        try:
            wait_until(seen, 300, why)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {out.read_text()[-1500:]}") from exc

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
        assert watch.wait(timeout=60) == 0
    finally:
        watch.kill()
