"""Many hosts on one machine (:mod:`tests.hostbed.fleet`): recovery time per fault kind and the bytes each
iteration moves to and from Redis.

Recovery runs from the fault (and, for partitions, from the heal) to the next stored iteration of an
affected shape, over ``repeats`` fresh fleets per kind. Bytes come from Redis's own network counters over a
clean sweep, per stored iteration, with the fleet's idle traffic (measured before the sweep in the same
run) and the artifacts' bytes reported apart."""

from __future__ import annotations

import logging
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from croqq.delivery import keys
from tests.hostbed import faults
from tests.hostbed.bed import bed_available, faketime_available
from tests.hostbed.fleet import Fleet, FleetConfig

log = logging.getLogger(__name__)
TTL_S = 3.0
IDLE_S = 10.0

KINDS: dict[str, tuple[dict[str, object], Callable[[Fleet], faults.Outcome]]] = {
    "gpu_partition": ({}, faults.partition_gpu_host),
    "gpu_host_killed": ({}, faults.kill_host),
    "writer_partition_30s": ({}, faults.partition_writer),
    "gpu_clock_90s_ahead_killed": ({"faketime": {"gpu2": "+90s"}}, faults.skewed_gpu_host),
    "gpu_new_hostname": ({}, lambda f: faults.kill_host(f, new_hostname="gpu1-recreated")),
}


def _fleet(root: Path, **config: object) -> Fleet:
    shutil.rmtree(root, ignore_errors=True)
    return Fleet(root, "bench", FleetConfig(lease_ttl_s=TTL_S, **config))  # type: ignore[arg-type]


def _stats(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(statistics.median(values), 2), "max_s": round(max(values), 2)}


def recovery(work: Path, repeats: int = 3) -> dict[str, object]:
    out: dict[str, object] = {"hosts_lease_ttl_s": TTL_S, "hosts_repeats": repeats}
    for kind, (config, scenario) in KINDS.items():
        if "faketime" in config and faketime_available() is not None:
            log.warning("skipping %s: %s", kind, faketime_available())
            continue
        from_fault, from_heal = [], []
        for i in range(repeats):
            with _fleet(work / f"{kind}-{i}", **config) as fleet:
                result = scenario(fleet)
                problems = fleet.problems(result.submission, result.max_iter)
            if problems:
                raise RuntimeError(f"{kind}: the fleet broke its promises: {problems[:5]}")
            from_fault.append(result.recovery_s)
            if result.from_heal_s is not None:
                from_heal.append(result.from_heal_s)
            log.info("%s run %d: recovery %.2fs (from the heal: %s)", kind, i + 1, result.recovery_s,
                     f"{result.from_heal_s:.2f}s" if result.from_heal_s is not None else "-")  # fmt: skip
        # beside each figure its target: 2x the TTL from the fault; for a partition, the TTL from the heal
        out[f"hosts_recovery_{kind}"] = _stats(from_fault) | ({} if from_heal else {"target_s": 2 * TTL_S})
        if from_heal:
            out[f"hosts_recovery_{kind}_after_heal"] = _stats(from_heal) | {"target_s": TTL_S}
    return out


def network_bytes(work: Path, shapes: int = 8, max_iter: int = 10) -> dict[str, object]:
    with _fleet(work / "bytes", env={"CROQQ_RECONCILE_EVERY_S": "1"}) as fleet:
        time.sleep(3.0)  # boot traffic settles
        b0, t0 = fleet.network_bytes(), time.monotonic()
        time.sleep(IDLE_S)
        idle_rate = (fleet.network_bytes() - b0) / (time.monotonic() - t0)
        b0, t0 = fleet.network_bytes(), time.monotonic()
        fleet.submit(max_iter=max_iter, limit=shapes)
        expected = shapes * (max_iter + 1)
        while int(fleet.client.hget(keys.STATS, "stored") or 0) < expected:  # a 30-byte poll: the
            time.sleep(0.5)  # operator's own traffic stays out of the fleet's bytes
        total, took = fleet.network_bytes() - b0, time.monotonic() - t0
        stats = fleet.client.hgetall(keys.STATS)
    iterations = int(stats["stored"])
    artifacts = int(stats.get("artifact_bytes_put", 0)) + int(stats.get("artifact_bytes_got", 0))
    return {
        "hosts_iterations": iterations,
        "hosts_sweep_s": round(took, 1),
        "hosts_idle_bytes_per_s": round(idle_rate),
        "hosts_bytes_per_iteration": round((total - artifacts) / iterations),
        "hosts_bytes_per_iteration_without_idle": round((total - artifacts - idle_rate * took) / iterations),
        "hosts_artifact_bytes_per_iteration": round(artifacts / iterations),
    }


def run(work: Path, repeats: int = 3) -> dict[str, object]:
    reason = bed_available()
    if reason is not None:
        log.warning("skipping the multi-host benchmark: %s", reason)
        return {"hosts_skipped": reason}
    return network_bytes(work) | recovery(work, repeats)
