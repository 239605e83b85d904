"""The CPU benchmark's floor: bare Celery chains really make the hops they claim, and nothing is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from benchmarks.capacity_bench import QUEUE, RedisCounters, chain_plan, run_floor
from croqq.processes.redis_server import RedisServer

pytestmark = pytest.mark.slow


@pytest.mark.timeout(2400)
def test_the_floor_executes_every_hop_of_every_chain_once(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    gpu_queue = "gpu.GPU-sim-floor-0"
    counts = {"i": 5, "b": 6, "g": 9, "s": 6}
    spec: dict[str, Any] = {
        "counts": counts,
        "chains": 3,
        "gpu_queues": [gpu_queue],
        "step_id_len": 34,
        "sid": "sm90_Simulated_H100_SXM/cuda/f16_4096x8192x4096",
    }
    before = RedisCounters.read(redis_client)
    floor = run_floor(tmp_path, redis_server, spec, timeout_s=600)  # per chain: only one that never ends
    sent = (RedisCounters.read(redis_client) - before).calls.get("lpush", 0)
    assert floor.hops == 26  # the chains' tails report how far they got: hop n runs only after hop n-1
    assert sent == 26  # every hop is one message (kombu publishes with LPUSH), the first ones by us
    for queue in [*QUEUE.values(), gpu_queue]:  # every message was consumed
        assert redis_client.llen(queue) == 0
    assert not redis_client.exists("unacked", "unacked_index")  # croqq's configuration: no ack emulation
    assert sorted("".join(chain_plan(counts, 3, c) for c in range(3))) == sorted(
        "i" * 5 + "b" * 6 + "g" * 9 + "s" * 6
    )
