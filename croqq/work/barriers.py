"""Test barriers: with ``CROQQ_TEST_BARRIERS=true``, a process reaching barrier ``<name>`` while the key
``croqq:barrier:<name>`` exists reports where it is (``croqq:barrier:<name>:reached`` = host:pid:step) and
blocks until the key is deleted. Chaos tests use them to kill a process at an exact point of a step:

    <kind>              a step of that kind, just claimed (e.g. ``measure``, ``store``)
    <kind>:complete     its work done, its result not yet recorded
    store:commit        the writer's commit objects written, the branch not yet moved
"""

from __future__ import annotations

import os
import socket
import time

import redis

from croqq.delivery import keys


def wait_barrier(client: redis.Redis, enabled: bool, name: str, step_id: str = "") -> None:
    if not enabled or not client.exists(keys.barrier(name)):
        return
    client.set(keys.barrier(f"{name}:reached"), f"{socket.gethostname()}:{os.getpid()}:{step_id}")
    while client.exists(keys.barrier(name)):
        time.sleep(0.02)
