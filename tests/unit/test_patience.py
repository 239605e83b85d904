"""Waits that stretch with the machine's load: a deadline counts unloaded seconds, CROQQ_PATIENCE scales
every budget (a bad value is refused, never ignored), and a wait that times out names what it waited for.
A wall deadline (leases, stop graces) counts plain wall seconds: no load, no CROQQ_PATIENCE."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq import patience
from croqq.errors import ConfigError
from croqq.patience import Deadline, wait_until
from tests.output import error_line

Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture
CPUS = os.cpu_count() or 1


def load(monkeypatch: pytest.MonkeyPatch, per_cpu: float) -> list[float]:
    """Make the 1-minute load average ``per_cpu`` x the CPU count; returns the times it was read."""
    reads: list[float] = []

    def getloadavg() -> tuple[float, float, float]:
        reads.append(time.monotonic())
        return (per_cpu * CPUS, 0.0, 0.0)

    monkeypatch.setattr(os, "getloadavg", getloadavg)
    return reads


@pytest.fixture(autouse=True)
def no_patience_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CROQQ_PATIENCE", raising=False)


def test_a_deadline_stretches_with_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    load(monkeypatch, 0.5)
    idle = Deadline(0.2)
    time.sleep(0.3)
    assert idle.expired()
    load(monkeypatch, 100.0)
    busy = Deadline(0.2)
    time.sleep(0.3)
    assert not busy.expired()  # 0.3 s at 100x slower is 0.003 unloaded seconds


def test_a_deadline_reads_the_load_average_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = load(monkeypatch, 1.0)
    deadline = Deadline(60)
    for _ in range(1000):
        deadline.expired()
    assert len(reads) == 1
    monkeypatch.setattr(patience, "LOAD_EVERY_S", 0.05)
    time.sleep(0.06)
    deadline.expired()
    assert len(reads) == 2


def test_croqq_patience_scales_every_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Deadline(2).budget_s == 2
    monkeypatch.setenv("CROQQ_PATIENCE", "3")
    assert Deadline(2).budget_s == 6


@pytest.mark.parametrize("bad", ["fast", "0", "-2", "nan", "inf"])
def test_a_bad_croqq_patience_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("CROQQ_PATIENCE", bad)
    with pytest.raises(ConfigError, match=r"^CROQQ_PATIENCE='.*' is not a positive number: use") as caught:
        Deadline(1)
    assert "\n" not in str(caught.value)


def test_a_bad_croqq_patience_is_refused_by_the_cli_before_anything_starts(
    tmp_path: Path, croqq: Cli
) -> None:
    env = {"CROQQ_PATIENCE": "slow", "CROQQ_RUN_DIR": str(tmp_path / "run")}
    result = croqq(env, "up", "--dtype", "f16", "--exit-when-done")
    assert result.returncode == 2
    assert error_line(result.stderr).startswith(
        "croqq: error: CROQQ_PATIENCE='slow' is not a positive number"
    )
    assert not (tmp_path / "run").exists()


def test_wait_until_returns_what_the_check_found() -> None:
    answers = iter([None, 0, "ready"])
    assert wait_until(lambda: next(answers), 5, "the third answer", every_s=0.01) == "ready"


def test_wait_until_raises_timeout_naming_the_event(monkeypatch: pytest.MonkeyPatch) -> None:
    load(monkeypatch, 0.5)
    with pytest.raises(TimeoutError, match=r"^the fish to bite: not within \d+ s \(budget 0.1 s at load\)"):
        wait_until(lambda: False, 0.1, "the fish to bite", every_s=0.01)


def test_a_wall_deadline_counts_wall_seconds_whatever_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = load(monkeypatch, 100.0)
    deadline = Deadline(0.2, wall=True)
    assert not deadline.expired()
    assert 0 < deadline.left_s <= 0.2
    time.sleep(0.3)
    assert deadline.expired()  # a stretched deadline would have 0.197 unloaded seconds left
    assert deadline.left_s < 0
    assert reads == []  # the load average is never read


@pytest.mark.parametrize("patience_set", ["100", "slow"])
def test_a_wall_deadline_ignores_croqq_patience(monkeypatch: pytest.MonkeyPatch, patience_set: str) -> None:
    monkeypatch.setenv("CROQQ_PATIENCE", patience_set)
    deadline = Deadline(0.2, wall=True)
    assert deadline.budget_s == 0.2
    time.sleep(0.3)
    assert deadline.expired()


def test_wait_until_wall_times_out_in_wall_seconds_naming_the_event(monkeypatch: pytest.MonkeyPatch) -> None:
    load(monkeypatch, 100.0)
    monkeypatch.setenv("CROQQ_PATIENCE", "100")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^the lease to expire: not within 0.2 s$"):
        wait_until(lambda: False, 0.2, "the lease to expire", every_s=0.01, wall=True)
    assert time.monotonic() - started < 2
    answers = iter([None, "taken"])
    assert wait_until(lambda: next(answers), 0.2, "the lease", every_s=0.01, wall=True) == "taken"


def test_a_zero_wall_budget_is_expired_at_once() -> None:
    assert Deadline(0, wall=True).expired()  # `croqq clean` checks the writer lock once, without waiting
