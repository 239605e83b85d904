"""Host problems: a worker whose host cannot do its work (a missing compiler, a broken local setup).

The worker that hit a :class:`~croqq.errors.HostError` gives the step back to its queue (other hosts take
it; the shape is not at fault), records the problem under its worker name (``build@node7``,
``gpu-0-3f9a2c1b@node7``) in ``croqq:host_problems`` for ``croqq status``, and stops taking work: its
main process sees the record on its next heartbeat, shuts down warm and exits with the configuration
code, which supervisors do not restart. A worker of the same role starting on that host again (once it
is fixed) clears the records its stopped predecessors left.
"""

from __future__ import annotations

import os

import redis
from pydantic import BaseModel

from croqq.delivery import clock, keys

ENV_WORKER = "CROQQ_WORKER_NAME"  # set by the worker's main process, inherited by its pool children
ENV_ROLE = "CROQQ_WORKER_ROLE"


class HostProblem(BaseModel):
    worker: str
    role: str
    reason: str
    at: float

    @property
    def host(self) -> str:
        return self.worker.rpartition("@")[2]


def label() -> str:
    return os.environ.get(ENV_WORKER, f"pid{os.getpid()}")


def record(client: redis.Redis, reason: str) -> None:
    problem = HostProblem(
        worker=label(), role=os.environ.get(ENV_ROLE, ""), reason=reason[:300], at=clock.now(client)
    )
    client.hset(keys.HOST_PROBLEMS, problem.worker, problem.model_dump_json())


def clear_stopped(client: redis.Redis, role: str, host: str) -> list[str]:
    """A worker of ``role`` starts on ``host``: forget the problems of that role's workers there that are
    no longer running (it was fixed, or the new worker records the problem again soon)."""
    gone = [
        p.worker
        for p in all_problems(client)
        if p.role == role and p.host == host and not client.exists(keys.worker(p.worker))
    ]
    if gone:
        client.hdel(keys.HOST_PROBLEMS, *gone)
    return gone


def problem(client: redis.Redis, worker: str) -> HostProblem | None:
    raw = client.hget(keys.HOST_PROBLEMS, worker)
    return HostProblem.model_validate_json(raw) if raw else None


def all_problems(client: redis.Redis) -> list[HostProblem]:
    return sorted(
        (HostProblem.model_validate_json(v) for v in client.hvals(keys.HOST_PROBLEMS)), key=lambda p: p.worker
    )
