"""Faults on a :class:`~tests.hostbed.fleet.Fleet`, each timed from the fault to the next stored iteration
of an affected shape (one whose GPU step ran on the host hit; for the writer, any shape).

A scenario submits a small sweep, injects its fault mid-step, lets the fleet finish and returns an
:class:`Outcome` (recovery time, submission, what it observed). tests/multihost asserts the promises;
``python -m benchmarks --only hosts`` repeats the scenarios for recovery times."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from croqq.delivery import clock, keys
from croqq.delivery.redis_client import strs
from croqq.patience import Deadline, wait_until
from croqq.placement import registry
from tests.hostbed.fleet import GPU_HOSTS, Fleet

MAX_ITER = 5
CUT_TRIES = 20
WATCH_S = 300.0  # unloaded seconds a fault may take to recover before the scenario fails


@dataclass
class Outcome:
    submission: str
    max_iter: int
    recovery_s: float  # from the fault to the next stored iteration of an affected shape
    from_heal_s: float | None = None  # partitions: from the heal
    affected: list[str] = field(default_factory=list)
    seen: dict[str, object] = field(default_factory=dict)


class _Watch:
    """Polls the affected shapes from the fault on, in a thread, and notes when one stores an iteration."""

    def __init__(self, fleet: Fleet, sids: list[str]) -> None:
        self.fleet, self.sids = fleet, sids
        self.before = fleet.stored(sids)
        self.at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = Deadline(WATCH_S)
        while self.at is None and not deadline.expired():
            try:
                now = self.fleet.stored(self.sids)
            except Exception:  # the operator's view never partitions, but be safe
                now = {}
            if any(now.get(s, -1) > self.before.get(s, -1) for s in self.sids):
                self.at = time.monotonic()
                return
            time.sleep(0.05)

    def wait(self) -> float:
        self._thread.join()  # the thread gives up once its deadline has passed
        if self.at is None:
            raise TimeoutError(f"none of {self.sids} stored an iteration after the fault")
        return self.at


def _mid_measure(fleet: Fleet, host: str, limit: int) -> tuple[str, list[str]]:
    """Submit, wait until a MEASURE runs on one of ``host``'s GPUs; the submission and the shapes whose
    GPU step runs there now."""
    sub = fleet.submit(max_iter=MAX_ITER, limit=limit)
    running = fleet.wait_running_on(fleet.gpu_uuids(host), "measure")
    return sub, sorted(running)


def partition_gpu_host(fleet: Fleet, host: str = "gpu1", limit: int = 4) -> Outcome:
    """Its link down in the middle of MEASURE for longer than 2x the lease TTL (until the step it held
    was handed to another worker), then healed."""
    sub = fleet.submit(max_iter=MAX_ITER, limit=limit)
    affected, steps, t0 = _cut_mid_step(fleet, host)
    before = _redispatches(fleet)
    time.sleep(2.2 * fleet.config.lease_ttl_s)  # at least: its leases lapse meanwhile
    wait_until(
        lambda: _redispatches(fleet) > before, WATCH_S, f"a step {host} held re-dispatched while cut off"
    )
    redispatched = {s: fleet.shapes([s])[s].step_id for s in affected}
    healed = time.monotonic()
    watch = _Watch(fleet, affected)  # from the heal: what its shapes store next
    fleet.bed.host(host).link_up()
    at = watch.wait()
    fleet.wait_done(sub)
    epochs = {s: int(fleet.client.hget(keys.step(str(steps[s])), "epoch") or 0) for s in affected}
    return Outcome(
        sub,
        MAX_ITER,
        at - t0,
        at - healed,
        affected,
        {"epochs": epochs, "steps": steps, "during": redispatched},
    )


def _cut_mid_step(fleet: Fleet, host: str) -> tuple[list[str], dict[str, str | None], float]:
    """Cut the host's link while a MEASURE runs on one of its GPUs: a step that ended before the cut
    landed does not count (heal and try again). The shapes whose GPU step it held at the cut, their
    step ids, and when the cut was made."""
    uuids = fleet.gpu_uuids(host)
    link = fleet.bed.host(host)
    for _ in range(CUT_TRIES):
        fleet.wait_running_on(uuids, "measure")
        t0 = time.monotonic()
        link.link_down()
        held = sorted(fleet.running_gpu_steps(uuids))  # Redis's view, which the host can no longer change
        if held:
            return held, {s: fleet.shapes([s])[s].step_id for s in held}, t0
        link.link_up()
    raise TimeoutError(f"no GPU step was running on {host} at any of {CUT_TRIES} cuts")


def _redispatches(fleet: Fleet) -> int:
    return int(fleet.client.hget(keys.STATS, "redispatch") or 0)


def kill_host(fleet: Fleet, host: str = "gpu1", limit: int = 4, new_hostname: str | None = None) -> Outcome:
    """SIGKILL every process of the host at once (mid-MEASURE), then boot it again (optionally under a
    new hostname, as a re-created pod) and start its services."""
    sub, affected = _mid_measure(fleet, host, limit)
    watch = _Watch(fleet, affected)
    t0 = time.monotonic()
    target = fleet.bed.host(host)
    target.kill_all()
    target.restart(hostname=new_hostname)
    fleet.start_services(host)
    at = watch.wait()
    fleet.wait_gpus(len(GPU_HOSTS) * fleet.config.sim_gpus)  # its GPUs registered again, both of them
    hosts = {g.uuid: g.host for g in registry.all_gpus(fleet.client) if g.uuid in fleet.gpu_uuids(host)}
    fleet.wait_done(sub)
    return Outcome(sub, MAX_ITER, at - t0, None, affected, {"gpu_hosts": hosts})


def partition_writer(fleet: Fleet, hold_s: float = 30.0, limit: int = 4) -> Outcome:
    """The writer cut off from Redis for ``hold_s`` once iterations are flowing, then healed."""
    sub = fleet.submit(max_iter=MAX_ITER, limit=limit)
    _wait(lambda: int(fleet.client.hget(keys.STATS, "stored") or 0) >= limit + 1, "the first iterations")
    sids = sorted(fleet.shapes(strs(fleet.client.smembers(keys.SHAPES))))
    t0 = time.monotonic()
    fleet.bed.host("writer").link_down()
    time.sleep(1.0)  # a STORE whose transaction was on the wire at the cut may still land
    stored_at_cut = int(fleet.client.hget(keys.STATS, "stored") or 0)
    time.sleep(hold_s - 1.0)
    during = int(fleet.client.hget(keys.STATS, "stored") or 0) - stored_at_cut
    healed = time.monotonic()
    watch = _Watch(fleet, sids)  # from the heal: the next STORE of any shape
    fleet.bed.host("writer").link_up()
    at = watch.wait()
    fleet.wait_done(sub)
    return Outcome(sub, MAX_ITER, at - t0, at - healed, sids, {"stored_during": during})


def skewed_gpu_host(fleet: Fleet, host: str = "gpu2", limit: int = 8) -> Outcome:
    """A GPU host whose wall clock runs ahead (the fleet was started with faketime on it): its step
    deadlines are on Redis's clock, and when all of it is killed mid-MEASURE its steps expire on time."""
    sub, affected = _mid_measure(fleet, host, limit)
    deadlines = [
        float(fleet.client.zscore(keys.RUNNING, str(fleet.shapes([s])[s].step_id)) or 0) for s in affected
    ]
    ahead_s = max(deadlines) - clock.now(fleet.client)
    watch = _Watch(fleet, affected)
    t0 = time.monotonic()
    target = fleet.bed.host(host)
    target.kill_all()
    target.restart()
    fleet.start_services(host)
    at = watch.wait()
    fleet.wait_done(sub)
    return Outcome(sub, MAX_ITER, at - t0, None, affected, {"deadline_ahead_s": ahead_s})


def _wait(done: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    wait_until(done, timeout_s, f"{what} did not happen")
