"""Worker names say what a worker is, and two workers never share one (Flower and the registry key on it)."""

from __future__ import annotations

import socket
import subprocess

import redis

from croqq.delivery.leases import owner_id, process_space
from croqq.processes.naming import claim_node, gpu_node, keep_node


def test_a_gpu_worker_is_named_by_its_index_and_uuid_prefix() -> None:
    assert gpu_node(0, "GPU-3F9A2C1B-77d2-4e1c-9a0b-0123456789ab") == "gpu-0-3f9a2c1b"
    assert gpu_node(7, "GPU-00c0ffee-0000-0000-0000-000000000000") == "gpu-7-00c0ffee"


def test_a_simulated_gpu_is_named_sim_and_apart_from_its_twin_on_another_machine() -> None:
    a, b = gpu_node(0, "GPU-sim-node7-0"), gpu_node(0, "GPU-sim-node8-0")
    assert a.startswith("gpu-0-sim") and len(a) == len("gpu-0-sim") + 8 and a != b
    assert gpu_node(0, "GPU-sim-node7-0") == a  # stable across restarts


def test_the_first_worker_of_a_role_has_the_plain_name_and_the_next_ones_a_number(
    redis_client: redis.Redis,
) -> None:
    first, lease1 = claim_node(redis_client, "build", "node7", owner_id("build"), 10.0)
    second, _ = claim_node(redis_client, "build", "node7", owner_id("build"), 10.0)
    third, _ = claim_node(redis_client, "build", "node7", owner_id("build"), 10.0)
    other_host, _ = claim_node(redis_client, "build", "node8", owner_id("build"), 10.0)
    assert (first, second, third, other_host) == (
        "build@node7",
        "build-2@node7",
        "build-3@node7",
        "build@node8",
    )
    lease1.release()
    again, _ = claim_node(redis_client, "build", "node7", owner_id("build"), 10.0)
    assert again == "build@node7"  # a stopped worker's name is free again


def test_a_restarted_worker_takes_back_the_name_of_its_killed_predecessor(redis_client: redis.Redis) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    corpse = f"{socket.gethostname()}:{dead.pid}:{process_space()}:0badc0de:coordinator"
    redis_client.set("croqq:lease:node:coordinator@node7", corpse, px=60_000)
    name, lease = claim_node(redis_client, "coordinator", "node7", owner_id("coordinator"), 10.0)
    assert name == "coordinator@node7" and lease.held()


def test_a_live_holder_on_another_host_is_never_taken_for_dead(redis_client: redis.Redis) -> None:
    redis_client.set("croqq:lease:node:ideate@node7", "elsewhere:1:ffffffff:12345678:ideate", px=60_000)
    name, _ = claim_node(redis_client, "ideate", "node7", owner_id("ideate"), 10.0)
    assert name == "ideate-2@node7"


def test_a_name_forgotten_by_redis_is_held_again_on_the_next_beat(redis_client: redis.Redis) -> None:
    name, lease = claim_node(redis_client, "build", "node7", owner_id("build"), 10.0)
    redis_client.flushall()
    keep_node(lease)
    assert lease.held() and redis_client.pttl(f"croqq:lease:node:{name}") > 0
