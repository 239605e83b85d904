"""Adaptive pipeline depth: observed step times -> each GPU's depth, within memory and fairness limits."""

from __future__ import annotations

import statistics

import redis

from croqq.delivery import keys
from croqq.delivery.ledger import StepRecord
from croqq.placement import depth, registry
from croqq.placement.depth import MIN_OBSERVATIONS, Observed, rule
from croqq.settings import Settings
from croqq.work.executors import think_s

GPU_TYPE = "sm90_Simulated_H100_SXM"
ADAPTIVE = Settings(pipeline_depth=4, pipeline_depth_max=64, pipeline_headroom=1.2)


def seen(off_s: float, gpu_s: float, steps: int = 100) -> Observed:
    return Observed(off_s=off_s, gpu_s=gpu_s, steps=steps)


def test_depth_covers_the_off_gpu_time_of_a_cycle_with_headroom() -> None:
    # 10 s on the GPU per 438 s off it (agent, build, store): 1 + 43.8 shapes, x 1.2
    assert rule(seen(438.0, 10.0), ADAPTIVE, share=1000) == 54
    assert rule(seen(90.0, 10.0), ADAPTIVE, share=1000) == 12


def test_slower_agents_mean_deeper_pipelines_and_faster_ones_shallower() -> None:
    depths = [rule(seen(off, 10.0), ADAPTIVE, share=1000) for off in (5.0, 50.0, 200.0, 400.0)]
    assert depths == sorted(depths) and depths[0] < ADAPTIVE.pipeline_depth < depths[-1]


def test_the_start_depth_holds_until_enough_steps_are_seen() -> None:
    assert rule(seen(438.0, 10.0, steps=MIN_OBSERVATIONS - 1), ADAPTIVE, share=1000) == 4
    assert rule(Observed(), ADAPTIVE, share=1000) == 4


def test_depth_never_exceeds_the_memory_limit() -> None:
    assert rule(seen(5000.0, 1.0), ADAPTIVE, share=1000) == 64
    small = Settings(pipeline_depth=4, pipeline_depth_max=8)
    assert rule(seen(5000.0, 1.0), small, share=1000) == 8


def test_depth_never_exceeds_the_gpus_fair_share() -> None:
    assert rule(seen(438.0, 10.0), ADAPTIVE, share=20) == 20
    assert rule(Observed(), ADAPTIVE, share=2) == 2  # even the start depth
    assert rule(seen(0.0, 10.0), ADAPTIVE, share=0) == 1


def register(client: redis.Redis, uuid: str, status: str = registry.HEALTHY) -> registry.GpuEntry:
    entry = registry.GpuEntry(
        uuid=uuid, host="h", index=0, gpu_type=GPU_TYPE, queue=f"gpu.h.{uuid}", status=status
    )
    registry.register_gpu(client, entry)
    return entry


def test_fair_share_divides_active_and_pending_shapes_among_healthy_gpus(redis_client: redis.Redis) -> None:
    register(redis_client, "GPU-a")
    register(redis_client, "GPU-b")
    register(redis_client, "GPU-q", status=registry.QUARANTINED)
    redis_client.sadd(keys.active("GPU-a"), *[f"s{i}" for i in range(5)])
    redis_client.zadd(keys.pending(GPU_TYPE), {f"p{i}": i for i in range(4)})
    now = depth.load(redis_client, registry.all_gpus(redis_client))
    assert now.share(GPU_TYPE) == 5  # ceil(9 / 2): the quarantined GPU gets none
    assert now.share("sm80_other") == 1


def step(kind: str, dispatched: float, started: float) -> StepRecord:
    return StepRecord(
        step_id="k#1.0", sid="s", kind=kind, epoch=0, status="running", queue="q",
        dispatched_at=dispatched, started_at=started,
    )  # fmt: skip


def observe(client: redis.Redis, uuid: str, record: StepRecord, now: float) -> None:
    pipe = client.pipeline()
    pipe.multi()
    depth.observe(pipe, uuid, record, now)
    pipe.execute()


def test_every_step_counts_from_its_claim_so_no_queue_wait_grows_the_depth(
    redis_client: redis.Redis,
) -> None:
    observe(redis_client, "GPU-a", step("measure", dispatched=0.0, started=30.0), now=40.0)
    observe(redis_client, "GPU-a", step("ideate", dispatched=40.0, started=100.0), now=300.0)
    observe(redis_client, "GPU-a", step("implement", dispatched=300.0, started=300.0), now=320.0)
    first = depth.fold(redis_client, "GPU-a")
    assert first.steps == 3
    # 10 s on the GPU (the 30 s it waited in the GPU queue is not counted), 200 + 20 s off it (nor the
    # 60 s the IDEATE waited for an agent)
    assert abs(first.gpu_s - 10.0) < 0.25 and abs(first.off_s / first.gpu_s - 22.0) < 1e-9
    observe(redis_client, "GPU-a", step("measure", dispatched=320.0, started=320.0), now=330.0)
    obs = depth.fold(redis_client, "GPU-a")
    keep = 1.0 - 1.0 / depth.MIN_WINDOW  # no depth chosen yet: the smallest window
    assert abs(obs.gpu_s - (first.gpu_s * keep + 10.0)) < 1e-6 and abs(obs.off_s - first.off_s * keep) < 1e-6
    assert depth.fold(redis_client, "GPU-a") == obs  # folding twice counts nothing twice


def test_a_saturated_off_gpu_pool_admits_no_more_shapes_than_its_work_needs(
    redis_client: redis.Redis,
) -> None:
    """The CPU-bound demo: IDEATEs wait long for a busy pool; the shapes beyond the window keep waiting."""
    entry = register(redis_client, "GPU-a")
    redis_client.zadd(keys.pending(GPU_TYPE), {f"p{i}": i for i in range(200)})
    t = 0.0
    for _ in range(40):
        observe(redis_client, "GPU-a", step("measure", t, t), now=t + 1.0)
        observe(redis_client, "GPU-a", step("ideate", t + 1.0, t + 51.0), now=t + 55.0)
        t += 55.0
    assert depth.choose(redis_client, ADAPTIVE, entry) == 6  # ceil(1.2 x (1 + 4 / 1)), not 200


def test_old_observations_fade_so_the_depth_follows_a_change(redis_client: redis.Redis) -> None:
    entry = register(redis_client, "GPU-a")
    redis_client.zadd(keys.pending(GPU_TYPE), {f"p{i}": i for i in range(200)})
    t, chosen = 0.0, []
    for i, off in enumerate([95.0] * 400 + [438.0] * 3000):  # the agents get slower
        observe(redis_client, "GPU-a", step("measure", t, t), now=t + 10.0)
        observe(redis_client, "GPU-a", step("ideate", t + 10.0, t + 10.0), now=t + 10.0 + off)
        t += 10.0 + off
        if i % 5 == 4:  # the coordinator fills the GPU now and then
            chosen.append(depth.choose(redis_client, ADAPTIVE, entry))
    assert chosen[0] == 4 and chosen[79] == 13 and chosen[-1] == 54
    assert chosen[80:] == sorted(chosen[80:])
    assert depth.current(redis_client, "GPU-a") == 54


def test_fixed_mode_keeps_pipeline_depth_whatever_it_observes(redis_client: redis.Redis) -> None:
    entry = register(redis_client, "GPU-a")
    fixed = Settings(pipeline_depth=4, pipeline_depth_mode="fixed")
    for i in range(50):
        observe(redis_client, "GPU-a", step("ideate", i, i), now=i + 400.0)
        observe(redis_client, "GPU-a", step("measure", i, i), now=i + 1.0)
    assert depth.choose(redis_client, fixed, entry) == 4
    assert depth.choose(redis_client, ADAPTIVE, entry) == 1  # share: no shape is waiting


def test_the_simulated_think_time_is_lognormal_around_its_median() -> None:
    settings = Settings(sim_ideate_s=264.0, sim_ideate_sigma=0.957, agent_timeout_s=1e9)
    draws = sorted(think_s(settings, f"k#{i}.ab") for i in range(4000))
    assert 240.0 < statistics.median(draws) < 290.0
    assert 780.0 < draws[int(0.9 * len(draws))] < 1040.0
    assert think_s(settings, "k#1.ab") == think_s(settings, "k#1.ab")
    assert think_s(Settings(sim_ideate_s=60.0), "k#1.ab") == 60.0
    capped = Settings(sim_ideate_s=264.0, sim_ideate_sigma=0.957, agent_timeout_s=300.0)
    assert max(think_s(capped, f"k#{i}.ab") for i in range(200)) == 300.0
