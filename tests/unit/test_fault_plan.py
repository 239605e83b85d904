"""The stress fault schedule: same seed, same schedule; every kind; bad kinds refused."""

from __future__ import annotations

import pytest

from croqq.chaos.faults import KINDS, parse_kinds, plan
from croqq.errors import ConfigError


def test_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    kinds = parse_kinds("default")
    assert plan(5, kinds, 50, 2000, 8) == plan(5, kinds, 50, 2000, 8)
    assert plan(5, kinds, 50, 2000, 8) != plan(6, kinds, 50, 2000, 8)


def test_schedule_covers_every_kind_in_order_of_progress() -> None:
    schedule = plan(1, list(KINDS), 50, 2000, 8)
    assert len(schedule) == 50 and {f.kind for f in schedule} == set(KINDS)
    rounds = [f.at_round for f in schedule]
    assert rounds == sorted(rounds) and rounds[0] > 0 and rounds[-1] < 2000
    assert all(0 <= f.gpu < 8 for f in schedule)


def test_fault_kinds_are_validated() -> None:
    assert parse_kinds("none") == [] and plan(1, [], 10, 100, 8) == []
    assert parse_kinds("kill_redis,gpu_xid") == ["kill_redis", "gpu_xid"]
    with pytest.raises(ConfigError, match=r"unknown fault kind\(s\) \['kill_everything'\]"):
        parse_kinds("kill_redis,kill_everything")
