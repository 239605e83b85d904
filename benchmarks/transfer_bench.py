"""Neighbour transfer: GPU measurements and agent calls until every shape of a set is within 2% of its
optimum, with and without the best kernels of the shapes finished before it, at N candidates per iteration.

A set is visited in the schedule's order (nearest to the manifest's reference shape first, in log2 space):
the simulated sweep of one dtype (``sim-<dtype>``: every scheduled shape's simulated landscape) or a folder
of Kernel Tuner cache files, one per problem, each with its ``problem_size`` [M, N, K] and the same knob
names (the set is named after the folder). Each shape is tuned by croqq's loop
(:func:`benchmarks.tuning_bench.run_croqq`, the model proposer) until the configuration it would ship is
within ``TARGET`` of the shape's optimum, or ``CAP`` measurements (counted as ``CAP``; ``capped`` says how
many). ``off``: every shape from its seed only. ``on``: when a transfer is due
(:func:`croqq.domain.neighbours.transfer_due`), the shipped best of the nearest shapes already run in this
sweep (same dtype, the same log2 distance; advanced: it kept a configuration beyond its seed) fill the
candidate slots first (one the shape has tried, or its best, is skipped), as a cluster offers them.
Measurements count every candidate measured (siblings and neighbours' kernels included; confirmation
re-measures aside, as in the tuning benchmark); agent calls count proposer calls (a neighbour's kernel
costs none). Figures are sums over the set's shapes, averaged over the seeds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.tuning_bench import (
    CANDIDATES,
    Problem,
    Run,
    _manifest,
    replay_problem,
    run_croqq,
    sim_problem,
)
from croqq.backends.landscape import load_landscape
from croqq.domain.schedule import build_schedule, expand_dtypes, log_distance
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError

log = logging.getLogger(__name__)

TARGET = 1.02
CAP = 300
SEEDS = 3
SIM_PREFIX = "sim-"

Loader = Callable[[], Problem]


@dataclass(frozen=True)
class Reach:
    """One shape's run to the target: for one seed, N and transfer on or off."""

    shape: str
    seed: int
    candidates: int
    transfer: bool
    measurements: int
    calls: int
    capped: bool


def sim_sets() -> list[str]:
    return [f"{SIM_PREFIX}{dtype}" for dtype in expand_dtypes(_manifest(), "all")]


def sim_set(name: str, limit: int | None = None) -> list[Loader]:
    """The simulated sweep of one dtype in schedule order (``limit``: only its first shapes)."""
    dtype = name.removeprefix(SIM_PREFIX)
    if not name.startswith(SIM_PREFIX) or name not in sim_sets():
        raise ConfigError(f"transfer set {name!r}: choose from {', '.join(sim_sets())}")
    schedule = build_schedule(_manifest(), "all")
    indices = [i for i, entry in enumerate(schedule) if entry.dtype == dtype][:limit]
    return [partial(sim_problem, i) for i in indices]


def landscape_set(folder: Path) -> list[Path]:
    """A folder's cache files in the schedule's order of their ``problem_size``; one ConfigError line for
    anything that makes it no set (no files, a file without [M, N, K], other knob names, a repeated size)."""
    if not folder.is_dir():
        raise ConfigError(f"--landscape-set {folder}: not a folder of Kernel Tuner cache files")
    paths = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    if not paths:
        raise ConfigError(f"--landscape-set {folder}: no *.json or *.json.gz cache file in it")
    ranked: dict[tuple[int, int, int], Path] = {}
    keys: tuple[str, ...] | None = None
    manifest = _manifest()
    for path in paths:
        land = load_landscape(path)
        if len(land.problem) != 3 or min(land.problem) <= 0:
            raise ConfigError(f"{path}: problem_size must be [M, N, K] (three positive integers) in a set")
        if keys is not None and set(land.keys) != set(keys):
            raise ConfigError(f"{path}: knobs {', '.join(land.keys)} differ from the set's {', '.join(keys)}")
        dims = (land.problem[0], land.problem[1], land.problem[2])
        if dims in ranked:
            raise ConfigError(f"{path}: problem_size {list(dims)} is also {ranked[dims].name}'s")
        keys, ranked[dims] = land.keys, path
    order = sorted(ranked, key=lambda d: (round(log_distance(manifest, *d), 9), d))
    return [ranked[d] for d in order]


def sweep(loaders: list[Loader], seeds: int = SEEDS) -> tuple[list[Reach], float]:
    """Every shape in order, per seed and N, run to the target off and on (on: the shapes before it in
    this sweep, with what they ship, are its neighbours); the wall time in seconds."""
    start = time.monotonic()
    advanced: dict[tuple[int, int], list[tuple[Shape, dict[str, int]]]] = {}
    reaches: list[Reach] = []
    for load in loaders:
        problem = load()
        for seed in range(seeds):
            for n in CANDIDATES:
                done = advanced.setdefault((seed, n), [])
                off = run_croqq("model", problem, CAP, seed, n, (), TARGET)
                on = run_croqq("model", problem, CAP, seed, n, done, TARGET)
                reaches += [_reach(off, seed, n, False), _reach(on, seed, n, True)]
                if on.shipped != problem.landscape.config(problem.seed_knobs):  # advanced: it kept one
                    assert on.shipped is not None
                    done.append((problem.shape, problem.landscape.knobs(on.shipped)))
    return reaches, time.monotonic() - start


def _reach(run: Run, seed: int, n: int, transfer: bool) -> Reach:
    capped = run.ratio() > TARGET
    measurements = CAP if capped else len(run.seen)
    return Reach(run.problem.shape.key, seed, n, transfer, measurements, run.calls, capped)


def summarize(reaches: list[Reach], wall_s: float) -> dict[str, Any]:
    """``{"shapes": N, "off": {...}, "on": {...}, "reduction_pct": R, "by_candidates": {N: ...}}``: the
    top-level ``off``/``on`` are N=1's."""
    seeds = len({r.seed for r in reaches}) or 1
    by: dict[str, dict[str, Any]] = {}
    for n in sorted({r.candidates for r in reaches}):
        sides: dict[str, Any] = {}
        for on in (False, True):
            rows = [r for r in reaches if r.candidates == n and r.transfer == on]
            sides["on" if on else "off"] = {
                "measurements": round(sum(r.measurements for r in rows) / seeds, 1),
                "agent_calls": round(sum(r.calls for r in rows) / seeds, 1),
                "capped": round(sum(r.capped for r in rows) / seeds, 1),
            }
        off, on = sides["off"]["measurements"], sides["on"]["measurements"]
        sides["reduction_pct"] = round(100.0 * (1.0 - on / off), 1) if off else 0.0
        sides["worse_shapes"] = _worse(reaches, n)
        by[str(n)] = sides
    first = by.get("1", next(iter(by.values()), {}))
    return {
        "shapes": len({r.shape for r in reaches}),
        "seeds": seeds,
        **{key: first[key] for key in ("off", "on", "reduction_pct") if key in first},
        "by_candidates": by,
        "wall_s": round(wall_s, 1),
    }


def _worse(reaches: list[Reach], n: int) -> int:
    """Shapes that took more measurements with transfer than without (summed over the seeds)."""
    cost: dict[str, list[int]] = {}
    for r in reaches:
        if r.candidates == n:
            cost.setdefault(r.shape, [0, 0])[r.transfer] += r.measurements
    return sum(on > off for off, on in cost.values())


def run(
    sets: list[str],
    folders: list[Path],
    seeds: int = SEEDS,
    limit: int | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """``{SET: figures}`` for the simulated sets named and the landscape-set folders, one process per set
    (``limit``: only the first shapes of each simulated set, for tests)."""
    jobs: dict[str, list[Loader]] = {name: sim_set(name, limit) for name in sets}
    for folder in folders:
        jobs[folder.name] = [partial(replay_problem, path) for path in landscape_set(folder)]
    out: dict[str, Any] = {}
    if not jobs:
        return out
    with ProcessPoolExecutor(max_workers=min(len(jobs), workers or len(jobs))) as pool:
        futures = {name: pool.submit(sweep, loaders, seeds) for name, loaders in jobs.items()}
        for name, future in futures.items():
            out[name] = summarize(*future.result())
            log.info("transfer benchmark: %s done in %.0f s", name, out[name]["wall_s"])
    return out


def describe(report: dict[str, Any]) -> list[str]:
    """One line per set and N: measurements and agent calls off -> on (the text summary)."""
    lines = []
    for name, entry in report.items():
        for n, sides in entry["by_candidates"].items():
            off, on = sides["off"], sides["on"]
            head = f"transfer {name} ({entry['shapes']} shapes, mean of {entry['seeds']} seeds) N={n}"
            lines.append(
                f"{head}: measurements {off['measurements']} -> {on['measurements']} "
                f"({-sides['reduction_pct']:+.1f}%), agent calls {off['agent_calls']} -> "
                f"{on['agent_calls']}, capped {off['capped']} -> {on['capped']}"
            )
    return lines
