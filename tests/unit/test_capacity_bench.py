"""The capacity benchmark's arithmetic: GPUs served per part, the floor's hop plans, heartbeats."""

from __future__ import annotations

import pytest

from benchmarks.capacity_bench import (
    _label,
    _letter,
    busy_s,
    capacity_limits,
    chain_plan,
    floor_ceiling,
    heartbeat_calls,
    heartbeats_per_iteration,
    stores_per_commit,
)


def test_each_part_serves_its_budget_over_one_gpus_cost_and_the_smallest_saturates_first() -> None:
    out = capacity_limits(
        redis_cpu_s_per_iter=0.002,  # 0.2 ms/s per GPU at one iteration per 10 s, + 0.1 idle
        bytes_per_iter=60_000,  # 6,000 B/s per GPU, + 1,000 idle
        writer_s_per_iter=0.005,  # 0.5 ms/s per GPU
        idle_cpu_s_per_gpu_s=0.0001,
        idle_bytes_per_gpu_s=1_000,
        shared_cpu_s_per_s=0.05,
        shared_bytes_per_s=500_000,
        cadence_s=10.0,
        headroom=0.5,
        redis_cores=1.0,
        nic_bytes_per_s=125e6,
    )
    assert out["capacity_gpus_redis_cpu"] == 1500  # (0.5 - 0.05) / 0.0003
    assert out["capacity_gpus_redis_network"] == 8857  # (62.5e6 - 0.5e6) / 7,000
    assert out["capacity_gpus_writer"] == 1000  # 0.5 / 0.0005
    assert out["capacity_gpus"] == 1000
    assert out["capacity_saturates_first"] == "writer"
    assert out["capacity_meets_target"] is False


def test_a_cheaper_writer_moves_the_bottleneck_to_redis() -> None:
    out = capacity_limits(0.002, 60_000, 0.001, cadence_s=10.0, headroom=0.5)
    assert out["capacity_gpus_writer"] == 5000
    assert out["capacity_gpus_redis_cpu"] == 2500
    assert (out["capacity_gpus"], out["capacity_saturates_first"]) == (2500, "redis_cpu")
    assert out["capacity_meets_target"] is True


def test_the_floors_ceiling_prices_its_redis_cpu_and_its_store_workers_cpu_per_iteration() -> None:
    out = floor_ceiling({"redis": 2.5, "store": 4.0, "gpu": 9.0}, bytes_per_iter=30_000)
    assert out["cpu_floor_capacity_gpus_redis_cpu"] == 2000  # 0.5 / 0.00025
    assert out["cpu_floor_capacity_gpus_writer"] == 1250  # 0.5 / 0.0004
    assert out["cpu_floor_capacity_gpus_redis_network"] == 20833  # 62.5e6 / 3,000
    assert (out["cpu_floor_capacity_gpus"], out["cpu_floor_capacity_saturates_first"]) == (1250, "writer")


@pytest.mark.parametrize("chains", [1, 3, 16])
def test_floor_chains_together_make_exactly_the_hops_counted_per_queue(chains: int) -> None:
    counts = {"i": 326, "b": 358, "g": 493, "s": 358}
    plans = [chain_plan(counts, chains, c) for c in range(chains)]
    assert {letter: sum(p.count(letter) for p in plans) for letter in counts} == counts
    assert max(len(p) for p in plans) - min(len(p) for p in plans) <= 4


def test_a_floor_chain_interleaves_its_hops_in_croqqs_order() -> None:
    assert chain_plan({"i": 2, "b": 2, "g": 2, "s": 2}, 1, 0) == "ibgsibgs"
    assert chain_plan({"i": 1, "b": 1, "g": 3, "s": 1}, 1, 0).count("g") == 3


def test_heartbeats_are_one_per_quarter_ttl_of_each_steps_real_duration() -> None:
    # the sim's real durations: ideate 60 s, implement 20 s, measure 10 s; one beat every 2.5 s
    assert heartbeats_per_iteration({"ideate": 1, "implement": 1, "measure": 1, "store": 1}, 10.0) == 36.0


def test_a_busy_ideate_worker_renews_its_threads_steps_in_one_call() -> None:
    # ideate: 24 renewals in calls of ideate_concurrency (8); implement (prefork) and measure one each
    steps = {"ideate": 1, "implement": 1, "measure": 1, "store": 1}
    assert heartbeat_calls(steps, 10.0) == {8: 3.0, 1: 12.0}


def test_processes_are_named_by_role() -> None:
    assert _label("/usr/bin/redis-server unixsocket:/tmp/r.sock") == "redis-server"
    assert _label("/v/bin/python -m croqq writer --log-level WARNING") == "croqq writer"
    worker = "/v/bin/python -m benchmarks.capacity_bench floor-worker gpu.GPU-0 prefork 1 2"
    assert _label(worker) == "floor gpu.GPU-0"


def test_every_familys_build_queue_counts_as_a_build_hop() -> None:
    from croqq.delivery.queues import build_queue, gpu_queue

    assert [_letter(build_queue(dsl)) for dsl in ("cuda", "cutlass")] == ["b", "b"]
    assert [_letter(q) for q in ("ideate", "store", gpu_queue("GPU-sim-vm-0"))] == ["i", "s", "g"]


def test_croqq_and_floor_processes_are_compared_by_the_queue_they_serve() -> None:
    from benchmarks.capacity_bench import _by_part

    croqq = {"croqq writer": 0.5, "croqq gpu-worker": 0.1, "croqq gpu-worker (pool)": 0.3, "croqq beat": 0.1}
    floor = {"floor store": 0.2, "floor gpu.GPU-0": 0.05, "floor gpu.GPU-1 (pool)": 0.05}
    assert _by_part(croqq, 100) == {"beat": 1.0, "gpu": 4.0, "store": 5.0}
    assert _by_part(floor, 100) == {"gpu": 1.0, "store": 2.0}


def test_the_writers_busy_time_counts_overlapping_store_steps_once() -> None:
    assert busy_s([]) == 0.0
    assert busy_s([(0.0, 1.0), (2.0, 3.0)]) == 2.0  # apart: both count
    assert busy_s([(0.0, 2.0), (0.5, 1.0), (1.5, 3.0)]) == 3.0  # one group: the union
    assert busy_s([(5.0, 6.0), (0.0, 1.0), (0.5, 2.0)]) == 3.0  # any order


def test_stores_per_commit_reads_group_sizes_from_the_subjects() -> None:
    subjects = [
        "store: 3 record(s)",
        "f16_256x256x256 iter004: raise stages - TFLOPS: 1.00 -> 2.00 (KEEP)",
        "e4m3_1024x1024x1024 attempt2: bigger tile - compile failed (no iteration)",
        "submit: sub-1 (3 shape(s))",
        "summary: sm90/cuda (3 shapes)",
    ]
    assert stores_per_commit(subjects) == 5 / 3
    assert stores_per_commit(["submit: sub-1 (3 shape(s))"]) == 0.0
