"""One fault of each kind, landed mid-step on the real cluster: nothing lost, nothing duplicated.

Each test runs a small cluster (4 simulated GPUs, lease TTL 3 s) to completion through `croqq stress`'s
harness with exactly one fault; kills land on a barrier, so the victim is always in the middle of a step.
The tests assert that the fault recovered; recovery times (target: a killed step finished within 2x the
lease TTL) are figures of ``python -m benchmarks --only recovery``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from croqq.chaos.faults import GPU_FAULTS, KILLS, KINDS
from croqq.chaos.stress import StressConfig, run
from croqq.processes.local import REDIS

pytestmark = pytest.mark.chaos
TTL = 3.0
# a killed step is re-dispatched; Redis killed mid-step leaves its holder alive, which may finish it
KILLED_STEP_KINDS = {kind for kind, (barrier, victim) in KILLS.items() if barrier and victim != REDIS}
WRITER_KILLS = sorted(kind for kind, (_, victim) in KILLS.items() if victim == "writer")
MID_BATCH = sorted(kind for kind, (barrier, _) in KILLS.items() if barrier and barrier.startswith("store"))


def stress_once(
    root: Path, kind: str, agents: int = 6, rounds: int = 6, store_group: int = 1
) -> dict[str, object]:
    cfg = StressConfig(
        agents_per_dsl=agents,
        round_target=rounds,
        seed=7,
        run_name="run",
        dsls=["cuda"],
        kinds=[kind],
        fault_count=1,
        out_root=root,
        sim_gpus=4,
        lease_ttl_s=TTL,
        fault_seconds=20.0,  # a persistent GPU fault outlasts the health wait by far: a GPU step meets it
        timeout_s=240.0,
        log_level="INFO",
        store_group=store_group,
    )
    result = run(cfg)
    assert result.ok, result.problems
    return result.summary


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fault_loses_and_duplicates_nothing(short_tmp: Path, kind: str) -> None:
    summary = stress_once(short_tmp, kind)
    assert summary["faults_injected"] == {kind: 1}, summary["faults_not_landed"]
    assert (summary["rounds_lost"], summary["duplicates"]) == (0, 0)
    assert summary["rounds_stored"] == summary["rounds_expected"] == 36
    assert summary["validate_ok"] is True
    # the fault recovered (the harness fails a fault that never does); how fast is a benchmark figure
    assert summary["recovery_max_s"] is not None
    if kind in ("gpu_overheat", "gpu_xid", "gpu_hang"):  # persistent: quarantine, shapes migrate
        assert summary["quarantines"] >= 1 and summary["migrations"] >= 1
    if kind == "gpu_foreign_process":  # transient: the GPU waits it out, no quarantine
        assert summary["quarantines"] == 0
    assert kind in GPU_FAULTS or summary["redispatches"] >= (1 if kind in KILLED_STEP_KINDS else 0)


@pytest.mark.parametrize("kind", MID_BATCH)
def test_a_writer_or_redis_killed_mid_batch_loses_and_duplicates_nothing(short_tmp: Path, kind: str) -> None:
    summary = stress_once(short_tmp, kind, store_group=8)
    assert summary["faults_injected"] == {kind: 1}, summary["faults_not_landed"]
    assert (summary["rounds_lost"], summary["duplicates"]) == (0, 0)
    assert summary["rounds_stored"] == summary["rounds_expected"] == 36
    assert summary["validate_ok"] is True
    assert kind not in WRITER_KILLS or summary["redispatches"] >= 1  # the dead writer's batch re-dispatched
    assert summary["recovery_max_s"] is not None  # recovered: how fast is a benchmark figure
    subjects = subprocess.run(
        ["git", "-C", str(short_tmp / "run" / "cluster" / "results"), "log", "--format=%s"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert any(s.startswith("store: ") and not s.startswith("store: 1 ") for s in subjects)  # groups formed
