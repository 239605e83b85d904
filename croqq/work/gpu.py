"""The GPU guard: before every measurement, prove the GPU is ours (lease) and healthy (probe).

Unhealthy: wait with exponential backoff (the step's lease is kept alive meanwhile) up to
``health_wait_s``; still unhealthy: raise GpuUnavailableError, and the caller quarantines the GPU.
After a hang the GPU is checked again: a GPU that stopped responding is the infrastructure's fault, not
the candidate's, and the step is run again elsewhere instead of being recorded as FAIL_hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from croqq.backends._base import GpuContext
from croqq.delivery import clock, keys
from croqq.domain.records import GpuSnapshot, Measurement
from croqq.errors import GpuLeaseLostError, GpuUnavailableError
from croqq.patience import Deadline
from croqq.work import stats
from croqq.work.context import Runtime

log = logging.getLogger(__name__)


def _claim_for(rt: Runtime, gpu: GpuContext, what: str) -> None:
    """Fencing: the GPU lease must still be this worker's; mark the GPU busy with ``what`` (one trip)."""
    ident = rt.gpu_identity
    pipe = rt.client.pipeline(transaction=False)
    pipe.get(keys.lease(f"gpu:{ident.uuid}"))
    pipe.hset(keys.gpu(gpu.uuid), mapping={"current": what, "since": repr(clock.now(rt.client))})
    holder = pipe.execute()[0]
    if ident.owner and holder not in (None, ident.owner):
        raise GpuLeaseLostError(f"GPU {ident.uuid} lease is held by {holder}, not this worker")


def gate(rt: Runtime, gpu: GpuContext, what: str) -> GpuSnapshot:
    """Block until the GPU is healthy (retrying with a doubling delay; raise after ``health_wait_s``), check
    the lease, mark the GPU busy with ``what``; return the snapshot at the start."""
    # wall seconds, not stretched by load: a GPU's recovery does not slow with this host's load
    delay, deadline = 0.2, Deadline(rt.settings.health_wait_s, wall=True)
    while True:
        health = gpu.probe.health(gpu.uuid)
        if health.ok:
            _claim_for(rt, gpu, what)
            return health.snapshot
        reason = "; ".join(health.problems)
        if deadline.expired():
            raise GpuUnavailableError(
                f"GPU {gpu.uuid} unhealthy for {rt.settings.health_wait_s:.0f}s: {reason}"
            )
        log.warning("GPU %s not ready for %s (%s); retrying in %.1fs", gpu.uuid, what, reason, delay)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def after_run(gpu: GpuContext, measurement: Measurement) -> None:
    """A hang that left the GPU unresponsive is the GPU's fault: raise so the step runs elsewhere."""
    if measurement.outcome != "hang":
        return
    health = gpu.probe.health(gpu.uuid)
    if not health.ok:
        raise GpuUnavailableError(f"GPU {gpu.uuid} hung past the run timeout: {'; '.join(health.problems)}")


@dataclass
class BusySpan:
    """The interval a GPU step held the GPU (Redis clock); ``busy_s`` is set when the step ends. The step
    puts it in its record (``MeasureResult.gpu_started_at``/``gpu_busy_s``), so the results repo alone
    says how busy each GPU was (`croqq report`)."""

    started_at: float
    busy_s: float = 0.0

    def fields(self) -> dict[str, float]:
        return {"gpu_started_at": self.started_at, "gpu_busy_s": self.busy_s}


@contextmanager
def busy(rt: Runtime, gpu: GpuContext, measurements: int = 1) -> Iterator[BusySpan]:
    """Count the time the GPU works (duty cycle) and the kernels it measures in it (a MEASURE of several
    candidates measures each); clear its 'current step' afterwards."""
    span = BusySpan(clock.now(rt.client))
    try:
        yield span
    finally:
        end = clock.now(rt.client)
        span.busy_s = max(0.0, end - span.started_at)
        stats.record_busy(
            rt.client, gpu.uuid, span.started_at, end, clear_current=keys.gpu(gpu.uuid), kernels=measurements
        )
