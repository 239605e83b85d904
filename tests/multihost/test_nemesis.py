"""The combined nemesis (:mod:`tests.hostbed.nemesis`) on the five-host bed: a seeded schedule of
overlapping faults (partitions of any host, Redis's and the writer's included; SIGKILLs of every kind of
croqq process; Redis restarts; clock skew; a GPU host lost for good and another joining) with a sweep in
flight, then a heal, then the checker over the whole history. The seed is printed and named in the failure
message; ``CROQQ_NEMESIS_SEED`` replays one. Long runs: ``python -m tests.hostbed.nemesis --minutes 30``."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from croqq.chaos.invariants import epoch_problems
from croqq.delivery import keys
from tests.hostbed import nemesis
from tests.hostbed.bed import bed_available
from tests.hostbed.fleet import Fleet

REASON = bed_available()
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.skipif(REASON is not None, reason=f"host bed unavailable: {REASON}"),
]
SEED = int(os.environ.get("CROQQ_NEMESIS_SEED", "31"))
FAULTS_S = 100.0  # a CI-length schedule


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cqnemesis-"))
    yield path
    if os.environ.get("CROQQ_KEEP_BED") is None:
        shutil.rmtree(path, ignore_errors=True)


def test_the_same_seed_gives_the_same_schedule_with_overlapping_faults_of_every_kind() -> None:
    schedule = nemesis.plan(SEED, FAULTS_S)
    assert schedule == nemesis.plan(SEED, FAULTS_S) != nemesis.plan(SEED + 1, FAULTS_S)
    kinds = {p.kind for p in schedule}
    assert {"partition", "kill", "redis_restart", "lose_host", "join_host"} <= kinds
    # the storm: a partition still holds while Redis restarts and the writer is killed
    redis = next(p for p in schedule if p.kind == "redis_restart" and any(
        q.kind == "partition" and q.at < p.at < q.at + q.hold for q in schedule))  # fmt: skip
    assert any(
        p.target == "writer@writer" and redis.at < p.at < redis.at + redis.hold + 1.5 for p in schedule
    )
    lost = next(p for p in schedule if p.kind == "lose_host")
    assert all(lost.target not in p.target for p in schedule if p.at > lost.at and p.kind != "lose_host")


def _checker_catches_a_stale_measurement(fleet: Fleet) -> None:
    """The epoch check can fail: a GPU step re-claimed (a new epoch) after its measurement started."""
    client = fleet.client
    measured = next(
        k
        for k in client.scan_iter(match=keys.step("*"))
        if client.hget(k, "kind") == "measure" and client.hget(k, "status") == "done"
    )
    client.hset(measured, "started_at", repr(float(client.hget(measured, "finished_at") or 0) + 60))
    _, wrong = epoch_problems(fleet.repo, client)
    assert len(wrong) == 1 and "stale result" in wrong[0], wrong


def test_a_seeded_nemesis_over_a_sweep_loses_nothing_and_the_sweep_completes_after_the_heal(
    root: Path,
) -> None:
    print(f"nemesis seed {SEED} (replay: CROQQ_NEMESIS_SEED={SEED})")
    report = nemesis.run(root, SEED, FAULTS_S, after=_checker_catches_a_stale_measurement)
    for fault in report.faults:
        print(f"  {fault.start:7.2f}-{fault.end}s {fault.kind} {fault.target} {fault.arg}")
    assert report.problems == [], f"seed {SEED}: {report.problems[:20]}"
    assert (report.lost, report.duplicated, report.stored) == (0, 0, report.expected), f"seed {SEED}"
    assert report.epochs_checked == report.expected, f"seed {SEED}"
    assert {"partition", "kill", "redis_restart", "lose_host", "join_host"} <= set(report.faults_by_kind)
