"""A run folder has one live supervisor: a second is refused (saying how to stop the first), and the
leftovers of a dead one are stopped and named, never a process that merely reuses a recorded pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from croqq.errors import ConfigError
from croqq.patience import Deadline, wait_until
from croqq.processes import record


def sleeper(group_child: bool = False) -> subprocess.Popen[bytes]:
    """A process in its own session (as the supervisor starts children), optionally with a child of its
    own in its group (a pool child)."""
    code = "import subprocess, time\n"
    if group_child:
        code += "subprocess.Popen(['sleep', '3600'])\n"
    code += "time.sleep(3600)\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def dead_proc(name: str) -> record.Proc:
    done = subprocess.Popen(["sleep", "0"])
    found = record.proc(name, done.pid)
    done.wait()
    assert found is not None
    return found


def write_record(run_dir: Path, supervisor: record.Proc, children: list[record.Proc]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record.write(run_dir / record.RECORD_NAME, supervisor, children)


def members_gone(p: record.Proc, budget_s: float = 60.0) -> bool:
    deadline = Deadline(budget_s)
    while record.group_members(p) and not deadline.expired():
        time.sleep(0.05)
    return not record.group_members(p)


def test_leftovers_of_a_dead_supervisor_are_stopped_and_named(tmp_path: Path) -> None:
    worker, redis = sleeper(group_child=True), sleeper()
    coordinator = record.proc("coordinator", worker.pid)
    assert coordinator is not None
    wait_until(lambda: len(record.group_members(coordinator)) == 2, 60, "the worker's own child to start")
    procs = [coordinator, record.proc("redis", redis.pid, service=True)]
    children = [p for p in procs if p is not None]
    assert len(children) == 2 and len(record.group_members(children[0])) == 2
    write_record(tmp_path, dead_proc("croqq up"), children)

    claim = record.claim(tmp_path, grace_s=2.0)
    try:
        assert [p.name for p in claim.stopped] == ["coordinator", "redis"]
        assert all(members_gone(p) for p in children)
        note = claim.note()
        assert note is not None and note.startswith("stopped what a croqq up (pid ")
        assert f"coordinator (pid {worker.pid}), redis (pid {redis.pid})" in note
    finally:
        claim.release()
        worker.wait(), redis.wait()


def test_a_recorded_pid_now_used_by_another_process_is_left_alone(tmp_path: Path) -> None:
    stranger = sleeper()
    try:
        real = record.proc("writer", stranger.pid)
        assert real is not None
        recycled = real.model_copy(update={"start": real.start - 1})  # same pid, started at another time
        write_record(tmp_path, dead_proc("croqq up"), [recycled])
        claim = record.claim(tmp_path, grace_s=1.0)
        claim.release()
        assert claim.stopped == [] and claim.note() is not None and "left no process running" in claim.note()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_live_supervisor_is_refused_with_how_to_stop_it(tmp_path: Path) -> None:
    other = sleeper()  # stands for another `croqq up` that is still running
    try:
        live = record.proc("croqq up", other.pid)
        assert live is not None
        write_record(tmp_path, live, [])
        with pytest.raises(
            ConfigError, match=rf"already runs in .* \(croqq up pid {other.pid}\).*kill {other.pid}"
        ):
            record.claim(tmp_path)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_run_folder_lock_refuses_a_second_claim_until_released(tmp_path: Path) -> None:
    first = record.claim(tmp_path)
    me = record.proc("croqq up", os.getpid())
    assert me is not None
    write_record(tmp_path, me, [])
    with pytest.raises(ConfigError, match=rf"croqq up pid {os.getpid()}"):
        record.claim(tmp_path)
    first.release()
    (tmp_path / record.RECORD_NAME).unlink()
    second = record.claim(tmp_path)
    assert second.previous is None and second.note() is None
    second.release()


def test_a_record_from_an_earlier_boot_names_nothing(tmp_path: Path) -> None:
    write_record(tmp_path, dead_proc("croqq up"), [])
    path = tmp_path / record.RECORD_NAME
    path.write_text(path.read_text().replace(record.boot_id(), "another-boot"))
    assert record.read(path) is None
