"""The real cluster deepens a GPU's pipeline when its shapes' agents are slow (adaptive depth)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from croqq.delivery import keys
from croqq.patience import wait_until
from croqq.placement import depth
from croqq.processes.local import LocalCluster

pytestmark = pytest.mark.slow


def test_slow_agents_raise_each_gpus_depth_up_to_its_fair_share(cluster_env: dict[str, str]) -> None:
    env = cluster_env | {
        "CROQQ_TIME_SCALE": "0.01",
        # the agent thinks 100x as long as a measurement takes (10 s here): the depth, ceil(1.5 x (1 + off-GPU
        # s / GPU s)), reaches the fair share (8) even when a loaded machine adds a second to each GPU step
        "CROQQ_SIM_IDEATE_S": "1000",
        "CROQQ_SIM_IMPLEMENT_S": "20",
        "CROQQ_SIM_MEASURE_S": "10",
        "CROQQ_SIM_PROFILE_S": "15",
        "CROQQ_PIPELINE_DEPTH": "2",  # where each GPU starts
        "CROQQ_PIPELINE_DEPTH_MAX": "12",
        "CROQQ_IDEATE_CONCURRENCY": "24",
        "CROQQ_BUILD_POOL": "threads",
        "CROQQ_BUILD_CONCURRENCY": "4",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        client = cluster.client
        uuids = sorted(client.smembers(keys.GPUS))
        cluster.submit("f16", max_iter=60, limit=16)

        def fair_share() -> bool:
            cluster.poll()
            return [client.scard(keys.active(u)) for u in uuids] == [8, 8]

        # 16 shapes on 2 GPUs: each takes its fair share (8), below the memory limit (12); that each
        # started at 2 is the log's "pipeline depth 2 -> " below
        wait_until(fair_share, 300, "8 active shapes on each GPU", every_s=0.5)
        assert [depth.current(client, u) for u in uuids] == [8, 8]
        assert [g.depth for g in cluster.snapshot().gpus] == [8, 8]  # what `croqq status` shows
        assert client.zcard(keys.pending("sm90_Simulated_H100_SXM")) == 0
    logs = Path(env["CROQQ_RUN_DIR"]) / "logs"
    text = "".join(p.read_text() for p in logs.glob("*.log"))
    assert "pipeline depth 2 -> " in text


def test_a_saturated_agent_pool_finishes_shapes_while_the_farther_ones_wait(
    cluster_env: dict[str, str],
) -> None:
    """One agent slot for two GPUs, so IDEATEs queue behind it: the shapes beyond the GPUs' depths (the
    admission window) wait in the schedule's order, and shapes finish while the farther ones still wait.
    (That the queue's wait does not grow the depth is test_pipeline_depth's.)"""
    env = cluster_env | {
        "CROQQ_TIME_SCALE": "0.01",
        "CROQQ_SIM_IDEATE_S": "60",
        "CROQQ_SIM_IMPLEMENT_S": "20",
        "CROQQ_SIM_MEASURE_S": "10",
        "CROQQ_SIM_PROFILE_S": "15",
        "CROQQ_IDEATE_CONCURRENCY": "1",
        "CROQQ_BUILD_POOL": "threads",
        "CROQQ_BUILD_CONCURRENCY": "4",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=3, limit=60)
        order = json.loads(cluster.client.get(keys.submission(sub)) or "[]")  # in the schedule's order

        def first_done() -> list[str] | None:
            cluster.poll()
            snap = cluster.snapshot(sub)
            return [snap.shapes[sid].status for sid in order] if snap.total.done else None

        statuses = wait_until(first_done, 600, "a shape done", every_s=0.5)
        assert statuses is not None and "pending" in statuses  # some shapes still wait ...
        waiting = statuses.index("pending")
        assert set(statuses[waiting:]) == {"pending"}  # ... and they are the last of the schedule
