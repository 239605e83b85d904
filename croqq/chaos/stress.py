"""`croqq stress`: the real local cluster under a seeded fault schedule, then the invariants.

N tuning loops per dsl run until each has R stored rounds (iterations 000..R-1) while faults are injected
at evenly spread progress points (one at a time: the next waits until the previous has recovered). The
repo is validated at periodic checkpoints during the run and fully checked at the end (every round stored
exactly once, one commit each, git fsck clean, no lease held by a dead process). Outputs, under
``experiments/stress/<run-name>/``: ``summary.json``, ``summary.tsv`` (one row per fault) and
``analysis.md``.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from croqq.chaos.faults import Injected, Injector, PlannedFault, plan
from croqq.chaos.invariants import live_problems, repo_problems, stored_iterations
from croqq.delivery import keys
from croqq.patience import Deadline
from croqq.processes.local import LocalCluster
from croqq.store.validate import validate_repo
from croqq.work import stats

log = logging.getLogger(__name__)
CHECKPOINT_EVERY_S = 20.0
RECOVERY_TIMEOUT_S = 120.0  # unloaded seconds (croqq.patience): a fault not recovered by then fails


@dataclass
class StressConfig:
    agents_per_dsl: int
    round_target: int
    seed: int
    run_name: str
    dsls: list[str]
    kinds: list[str]
    fault_count: int
    out_root: Path = Path("experiments/stress")
    sim_gpus: int = 8
    lease_ttl_s: float = 10.0
    fault_seconds: float = 8.0
    timeout_s: float = 3600.0
    log_level: str = "INFO"
    store_group: int = 1  # the writer's group commit (CROQQ_STORE_GROUP)

    @property
    def out_dir(self) -> Path:
        return self.out_root / self.run_name

    @property
    def expected_rounds(self) -> int:
        return self.agents_per_dsl * self.round_target * len(self.dsls)


@dataclass
class StressResult:
    config: StressConfig
    schedule: list[PlannedFault]
    injected: list[Injected] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def cluster_env(cfg: StressConfig) -> dict[str, str]:
    ttl = cfg.lease_ttl_s
    run = cfg.out_dir.resolve() / "cluster"
    depth = max(1, -(-cfg.agents_per_dsl * len(cfg.dsls) // cfg.sim_gpus))
    return {
        "CROQQ_BROKER_URL": "",
        "CROQQ_RUN_DIR": str(run),
        "CROQQ_RESULTS_REPO": str(run / "results"),
        "CROQQ_BACKEND": "sim",
        "CROQQ_PROBE": "sim",
        "CROQQ_SIM_GPUS": str(cfg.sim_gpus),
        "CROQQ_PIPELINE_DEPTH": str(depth),
        "CROQQ_LEASE_TTL_S": str(ttl),
        "CROQQ_RECONCILE_EVERY_S": str(min(1.0, ttl / 5)),
        "CROQQ_HEALTH_WAIT_S": str(min(3.0, ttl)),
        "CROQQ_RECHECK_EVERY_S": str(ttl),
        "CROQQ_QUARANTINE_COOLDOWN_S": str(ttl),
        "CROQQ_GPU_OFFLINE_S": str(6 * ttl),
        "CROQQ_TEST_BARRIERS": "true",
        "CROQQ_TIME_SCALE": "0",
        "CROQQ_STORE_GROUP": str(cfg.store_group),
    }


def run(cfg: StressConfig) -> StressResult:
    total = cfg.expected_rounds
    schedule = plan(cfg.seed, cfg.kinds, cfg.fault_count, total, cfg.sim_gpus)
    result = StressResult(cfg, schedule)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    scratch = cfg.out_dir / "cluster"
    if scratch.exists():  # a run of the same name before: start afresh, or nothing would be left to do
        log.info("removing the previous run's cluster state %s", scratch)
        shutil.rmtree(scratch)
    env = cluster_env(cfg)
    started = time.monotonic()
    with LocalCluster(env, log_level=cfg.log_level) as cluster:
        cluster.wait_gpus()
        subs = [_submit(cluster, cfg, dsl) for dsl in cfg.dsls]
        _drive(cluster, cfg, result, subs)
        result.problems += _settled_live_problems(cluster, cfg)
        counters = stats.counters(cluster.client)
    repo = Path(env["CROQQ_RESULTS_REPO"])
    final = repo_problems(repo)
    result.problems += [str(p) for p in final]
    result.checkpoints.append(
        {"t": round(time.time(), 1), "rounds": -1, "ok": not final, "problems": [str(p) for p in final][:5]}
    )
    _summarize(result, repo, counters, time.monotonic() - started)
    write_reports(result)
    return result


def _submit(cluster: LocalCluster, cfg: StressConfig, dsl: str) -> str:
    return cluster.submit("all", max_iter=cfg.round_target - 1, limit=cfg.agents_per_dsl, dsl=dsl)


def _drive(cluster: LocalCluster, cfg: StressConfig, result: StressResult, subs: list[str]) -> None:
    """Inject each planned fault once its round count is reached (faults may overlap: the next one does
    not wait for the last to recover, but a GPU fault spares a GPU still recovering from another); track
    every fault until it recovers; stop when all is done."""
    injector = Injector(cluster, cfg.fault_seconds)
    pending = list(result.schedule)
    active: list[tuple[Injected, Deadline]] = []
    deadline = Deadline(cfg.timeout_s)
    next_check = time.monotonic() + CHECKPOINT_EVERY_S  # a cadence, not a deadline: wall seconds
    while not deadline.expired():
        cluster.poll()
        active = [(shot, late) for shot, late in active if not _settle(injector, shot, late)]
        if pending and _rounds(injector) >= pending[0].at_round:
            fault = pending.pop(0)
            log.warning("injecting fault %d: %s (target GPU %d)", fault.index, fault.kind, fault.gpu)
            shot = injector.inject(fault, avoid_gpus={s.gpu for s, _ in active if s.gpu})
            result.injected.append(shot)
            active.append((shot, Deadline(RECOVERY_TIMEOUT_S)))
        if time.monotonic() >= next_check:
            result.checkpoints.append(_checkpoint(cluster))
            next_check = time.monotonic() + CHECKPOINT_EVERY_S
        if not pending and not active and _finished(cluster, subs):
            return
        time.sleep(0.05)
    result.problems.append(f"the run did not finish within {deadline.waited_s:.0f}s")


def _settle(injector: Injector, shot: Injected, late: Deadline) -> bool:
    """True once the fault has recovered (recording when) or is past its recovery deadline."""
    if injector.recovered(shot):
        if shot.landed:
            shot.recovered_at = time.time()
            log.info("fault %d %s recovered in %ss", shot.fault.index, shot.fault.kind, shot.recovery_s)
        return True
    return late.expired()


def _settled_live_problems(cluster: LocalCluster, cfg: StressConfig) -> list[str]:
    """What reconciliation has not cleared of the last faults' leftovers once it has had its time (two
    lease TTLs and some, stretched by the machine's load): [] as soon as nothing is left."""
    settle = Deadline(2 * cfg.lease_ttl_s + 10.0)
    while True:
        problems = live_problems(cluster.client, grace_s=2 * cfg.lease_ttl_s)
        if not problems or settle.expired():
            return problems
        time.sleep(0.5)


def _rounds(injector: Injector) -> int:
    try:
        return injector.rounds()
    except Exception:  # Redis restarting
        return -1


def _finished(cluster: LocalCluster, subs: list[str]) -> bool:
    try:
        return all(cluster.snapshot(sub).finished for sub in subs)
    except Exception:
        return False


def _checkpoint(cluster: LocalCluster) -> dict[str, Any]:
    problems = validate_repo(Path(cluster.settings.results_repo), None)
    rounds = int(cluster.client.hget(keys.STATS, "stored") or 0)
    return {
        "t": round(time.time(), 1),
        "rounds": rounds,
        "ok": not problems,
        "problems": [str(p) for p in problems][:5],
    }


def _summarize(result: StressResult, repo: Path, counters: dict[str, int], seconds: float) -> None:
    cfg = result.config
    rows = stored_iterations(repo)
    duplicates = sum(n - 1 for n in rows.values() if n > 1)
    stored = len(rows)
    lost = max(0, cfg.expected_rounds - stored)
    recoveries = [s.recovery_s for s in result.injected if s.landed and s.recovery_s is not None]
    kill_recoveries = [
        s.recovery_s
        for s in result.injected
        if s.landed and s.recovery_s is not None and s.fault.kind.startswith("kill_")
    ]
    unrecovered = [s for s in result.injected if s.landed and s.recovery_s is None]
    not_landed = [s for s in result.injected if not s.landed]
    if lost:
        result.problems.append(f"{lost} round(s) lost")
    if duplicates:
        result.problems.append(f"{duplicates} duplicated round(s)")
    for shot in unrecovered:
        result.problems.append(
            f"fault {shot.fault.index} {shot.fault.kind} did not recover within {RECOVERY_TIMEOUT_S:.0f}s "
            "(at the machine's load)"
        )
    validate_ok = all(c["ok"] for c in result.checkpoints)
    result.summary = {
        "run_name": cfg.run_name,
        "seed": cfg.seed,
        "dsls": cfg.dsls,
        "agents_per_dsl": cfg.agents_per_dsl,
        "round_target": cfg.round_target,
        "lease_ttl_s": cfg.lease_ttl_s,
        "rounds_expected": cfg.expected_rounds,
        "rounds_stored": stored,
        "rounds_lost": lost,
        "duplicates": duplicates,
        "faults_planned": len(result.schedule),
        "faults_injected": dict(Counter(s.fault.kind for s in result.injected if s.landed)),
        "faults_not_landed": [f"{s.fault.kind}: {s.note}" for s in not_landed],
        "compile_failed_attempts": counters.get("attempts", 0),
        "fail_rounds": counters.get("FAIL", 0),
        "recovery_p50_s": round(statistics.median(recoveries), 2) if recoveries else None,
        "recovery_max_s": round(max(recoveries), 2) if recoveries else None,
        "recovery_kill_p50_s": round(statistics.median(kill_recoveries), 2) if kill_recoveries else None,
        "recovery_kill_max_s": round(max(kill_recoveries), 2) if kill_recoveries else None,
        "redispatches": counters.get("redispatch", 0),
        "quarantines": counters.get("quarantines", 0),
        "migrations": counters.get("migrations", 0),
        "validate_checkpoints": len(result.checkpoints),
        "validate_ok": validate_ok,
        "validate_problems": [p for c in result.checkpoints for p in c["problems"]][:20],
        "seconds": round(seconds, 1),
        "rounds_per_s": round(stored / seconds, 2) if seconds else 0.0,
        "ok": result.ok,
        "problems": result.problems[:50],
    }


def write_reports(result: StressResult) -> None:
    out = result.config.out_dir
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    lines = ["index\tat_round\tkind\ttarget\tlanded\trecovery_s\tnote"]
    for s in result.injected:
        lines.append(
            f"{s.fault.index}\t{s.fault.at_round}\t{s.fault.kind}\t{s.target}\t{s.landed}\t"
            f"{'' if s.recovery_s is None else s.recovery_s}\t{s.note}"
        )
    (out / "summary.tsv").write_text("\n".join(lines) + "\n")
    (out / "analysis.md").write_text(analysis(result))


def analysis(result: StressResult) -> str:
    s = result.summary
    by_kind: dict[str, list[float]] = {}
    for shot in result.injected:
        if shot.landed and shot.recovery_s is not None:
            by_kind.setdefault(shot.fault.kind, []).append(shot.recovery_s)
    rows = "\n".join(
        f"| {k} | {len(v)} | {statistics.median(v):.2f} | {max(v):.2f} |" for k, v in sorted(by_kind.items())
    )
    verdict = (
        "PASSED: every invariant held"
        if result.ok
        else "FAILED:\n\n" + "\n".join(f"- {p}" for p in result.problems)
    )
    return f"""# Stress run `{s["run_name"]}` (seed {s["seed"]})

{verdict}

- {s["agents_per_dsl"]} loops per dsl ({", ".join(s["dsls"])}) x {s["round_target"]} rounds =
  {s["rounds_expected"]} rounds expected; {s["rounds_stored"]} stored, {s["rounds_lost"]} lost,
  {s["duplicates"]} duplicated.
- {sum(s["faults_injected"].values())} faults injected ({len(s["faults_not_landed"])} did not land),
  lease TTL {s["lease_ttl_s"]} s; recovery p50 {s["recovery_p50_s"]} s, max {s["recovery_max_s"]} s.
- Process kills (workers, writer, beat, coordinator, Redis): recovery p50 {s["recovery_kill_p50_s"]} s,
  max {s["recovery_kill_max_s"]} s (target: within 2x the lease TTL). GPU faults also include the run
  timeout of a hang, the health back-off, quarantine and the re-measurement on another GPU.
- {s["redispatches"]} re-dispatches, {s["quarantines"]} quarantines, {s["migrations"]} migrations;
  {s["compile_failed_attempts"]} compile-failed attempts and {s["fail_rounds"]} FAIL rounds
  (candidate faults).
- {s["validate_checkpoints"]} validation checkpoints during the run; validate ok: {s["validate_ok"]}.
- {s["seconds"]} s wall, {s["rounds_per_s"]} rounds/s under faults.

## Recovery by fault kind

| kind | injected | p50 s | max s |
|---|---|---|---|
{rows}
"""
