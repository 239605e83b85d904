"""Tuning quality: how close to the optimum each search strategy gets within a budget of measured
configurations, on the simulated landscape (every scheduled shape) and on recorded landscapes.

Every strategy gets the same budgets, the same seeds and the same measurements: a configuration's time is
one draw from its recorded repeats (the simulated landscape's repeats are the sim backend's noise around
its noise-free prediction), a configuration absent from the landscape is an invalid proposal (counted,
not measured: like a compile failure it costs no GPU time, and it does not count against the budget), and
re-proposing a configuration already measured costs nothing and returns the first measurement. A run
stops when it has measured ``budget`` configurations or made ``PROPOSAL_CAP x budget`` proposals. Its
result is the recorded mean time of the configuration it would ship (the best it measured; croqq's own
proposer ships its confirmed best, as a cluster does) over the landscape's optimum.

Strategies: ``croqq`` (the model proposer, croqq's default), ``croqq-n2`` and ``croqq-n4`` (the same with
2 and 4 candidates per iteration) and ``croqq-search`` (the search proposer), each driven through the same
KEEP/DISCARD rule as a cluster (:func:`croqq.domain.decide.decide` with the interleaved confirmation). With
N candidates an iteration makes N proposer calls one after another (each told the earlier answers as
tried), measures every distinct valid one (each counts against the budget, as every GPU measurement does)
and hands the batch's best to DECIDE; the others enter the history as measured siblings. Given advanced
neighbours (:mod:`benchmarks.transfer_bench`), the nearest ones' shipped best fill the slots first when
:func:`croqq.domain.neighbours.transfer_due` says so, as a cluster offers them. Then ``random`` (uniform
over the knob grid), Optuna's TPE and NSGA-II samplers
(ask/tell; an invalid trial is told as twice the worst time so far: told as failed, TPE keeps sampling the
invalid region, thousands of proposals per run), and Kernel Tuner's
genetic algorithm, simulated annealing and greedy ILS in its simulation mode on a cache file written from
the same landscape. Kernel Tuner is given the landscape's valid set as its restriction (as its users pass
their kernel's restrictions), so it proposes no invalid configuration, and it sees recorded means, not
noisy draws: both favour it.

The report judges croqq at each budget by the tuning-quality rule (:func:`rule`): against the best other
strategy, a median at most ``RULE_GAP_PCT`` % of the optimum worse and a within-5% share at least as large.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
import statistics
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

from croqq.backends import _simmodel as simmodel
from croqq.backends.landscape import Config, Landscape, Record, load_landscape
from croqq.backends.sim import NOISE_SIGMA
from croqq.domain.decide import BASELINE, DISCARD, KEEP, decide, needs_confirmation
from croqq.domain.fsm import STALL_ESCALATE, STALL_RADICAL
from croqq.domain.manifest import Manifest, cached_manifest
from croqq.domain.neighbours import TRANSFER_NEIGHBOURS, nearest, transfer_due
from croqq.domain.records import Confirmation, HistoryEntry, Idea, Measurement, MeasureResult, Strategy
from croqq.domain.schedule import build_schedule
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError, TerminalError
from croqq.proposers._base import ProposeContext, Proposer
from croqq.settings import Settings

log = logging.getLogger(__name__)

SIM = "sim"
SIM_GPU = "sm90_Simulated_H100_SXM"
SIM_REPEATS = 5
PROPOSAL_CAP = 20
CONFIRM_DRAWS = 3
WITHIN = 1.05
RULE_GAP_PCT = 0.25  # croqq's median may trail the best other strategy's by this much (% of the optimum)
OPTUNA = ("tpe", "nsga2")
KERNEL_TUNER = ("genetic_algorithm", "simulated_annealing", "greedy_ils")
CANDIDATES = (1, 2, 4)  # candidates per iteration the benchmark compares
STRATEGIES = (
    "croqq",
    *(f"croqq-n{n}" for n in CANDIDATES[1:]),
    "croqq-search",
    "random",
    *(f"optuna-{s}" for s in OPTUNA),
    *(f"kt-{s}" for s in KERNEL_TUNER),
)
LANDSCAPES = Path(__file__).resolve().parents[1] / "landscapes"
DEFAULT_LANDSCAPE = LANDSCAPES / "xgemm_4096_rtx2080ti.kerneltuner.json.gz"


@dataclass(frozen=True)
class Problem:
    """One landscape to tune, and how croqq's proposer sees it (a manifest dsl and a shape)."""

    group: str  # the landscape's name in the report
    landscape: Landscape
    manifest: Manifest
    dsl: str
    shape: Shape
    seed_knobs: dict[str, int]

    @property
    def optimum_ms(self) -> float:
        return self.landscape.optimum[1]


@dataclass
class Run:
    """One strategy's run: noisy measurements, counted against the budget."""

    problem: Problem
    budget: int
    rng: random.Random
    seen: dict[Config, float] = field(default_factory=dict)
    invalid: int = 0
    proposals: int = 0
    calls: int = 0  # proposer (agent) calls
    shipped: Config | None = None  # what the strategy would ship, when not simply its best measurement
    target: float | None = None  # stop once the shipped configuration is within this ratio of the optimum

    @property
    def done(self) -> bool:
        if self.target is not None and self.seen and self.ratio() <= self.target:
            return True
        return len(self.seen) >= self.budget or self.proposals >= PROPOSAL_CAP * self.budget

    def measure(self, knobs: dict[str, int]) -> float | None:
        """The observed time (ms) of a knob set, or None when it is invalid."""
        self.proposals += 1
        land = self.problem.landscape
        config = land.config(knobs)
        if config in self.seen:
            return self.seen[config]
        if config not in land.records:
            self.invalid += 1
            return None
        self.seen[config] = self.draw(knobs)
        return self.seen[config]

    def draw(self, knobs: dict[str, int], n: int = 1) -> float:
        """A fresh measurement (a re-measure: not counted against the budget)."""
        value = self.problem.landscape.sample_ms(knobs, self.rng, n)
        assert value is not None
        return value

    def ratio(self) -> float:
        """The shipped configuration's recorded mean over the optimum (the best measured unless set)."""
        best = self.shipped
        if best is None:
            if not self.seen:
                return math.inf
            best = min(self.seen, key=self.seen.__getitem__)
        return self.problem.landscape.records[best].time_ms / self.problem.optimum_ms


@dataclass(frozen=True)
class Result:
    group: str
    strategy: str
    budget: int
    ratio: float
    invalid: int


# -- problems -----------------------------------------------------------------------------------------


# the knobs each factor of croqq.backends._simmodel.factors reads (a test holds this against predict)
FACTOR_KNOBS: dict[str, tuple[str, ...]] = {
    "tile": ("TILE_M", "TILE_N", "TILE_K", "SPLIT_K"),
    "stages": ("STAGES",),
    "warps": ("WARPS_M", "WARPS_N", "TILE_M", "TILE_N"),
    "raster": ("RASTER",),
    "swizzle": ("SWIZZLE",),
    "epilogue": ("EPI_VEC",),
}


def sim_model(manifest: Manifest, shape: Shape) -> simmodel.ShapeModel:
    dtype, gpu = manifest.dtypes[shape.dtype], manifest.gpu(SIM_GPU)
    return simmodel.build_model(
        shape,
        manifest.dsl("cuda").knobs,
        a_bytes=dtype.a_bytes,
        c_bytes=dtype.c_bytes,
        gpu_type=SIM_GPU,
        peak=gpu.peak_tflops[shape.dtype],
        mem_gbps=gpu.mem_gbps,
    )


def sim_landscape(manifest: Manifest, shape: Shape) -> Landscape:
    """Every knob set of the cuda dsl on one shape: compile failures are absent, the rest carry the sim's
    noise-free prediction (:func:`croqq.backends._simmodel.predict`, computed factor by factor: each
    factor reads a few knobs, so it is tabulated once per combination of those) and ``SIM_REPEATS``
    repeats around it with the sim backend's noise."""
    model = sim_model(manifest, shape)
    space = model.space
    tables = {}
    for name, knobs in FACTOR_KNOBS.items():
        combos = itertools.product(*(space[k] for k in knobs))
        tables[name] = {
            v: simmodel.factors(model, {**model.optimum, **dict(zip(knobs, v, strict=True))})[name]
            for v in combos
        }
    names = tuple(space)
    index = {name: [names.index(k) for k in knobs] for name, knobs in FACTOR_KNOBS.items()}
    noise = random.Random(shape.key)
    spread = [1.0 / (1.0 + noise.gauss(0.0, NOISE_SIGMA)) for _ in range(SIM_REPEATS)]
    a_bytes = manifest.dtypes[shape.dtype].a_bytes
    records: dict[Config, Record] = {}
    for config in itertools.product(*space.values()):
        if simmodel.compile_error(shape, dict(zip(names, config, strict=True)), a_bytes) is not None:
            continue
        eff = min(simmodel.EFF_CAP, math.prod(tables[f][tuple(config[i] for i in index[f])] for f in tables))
        mean = (shape.flops / (model.ceiling_tflops * eff * 1e6) + simmodel.LAUNCH_US) / 1000.0
        records[config] = Record(time_ms=mean, times_ms=tuple(mean * x for x in spread))
    dims = (shape.m, shape.n, shape.k)
    return Landscape(name=shape.key, keys=names, space=dict(space), records=records, problem=dims)


def sim_problem(index: int) -> Problem:
    manifest = _manifest()
    entry = build_schedule(manifest, "all")[index]
    shape = Shape(dtype=entry.dtype, m=entry.m, n=entry.n, k=entry.k)
    kernel = manifest.dsl("cuda").kernels[shape.dtype]
    return Problem(SIM, sim_landscape(manifest, shape), manifest, "cuda", shape, dict(kernel.naive))


def replay_problem(path: Path) -> Problem:
    from croqq.backends.replay import replay_manifest

    land = load_landscape(path)
    manifest = replay_manifest(_manifest(), land)
    dims = [*land.problem, 4096, 4096, 4096][:3]
    shape = Shape(dtype="f16", m=dims[0], n=dims[1], k=dims[2])
    return Problem(land.name, land, manifest, "replay", shape, land.first_valid)


@cache
def _manifest() -> Manifest:
    return cached_manifest(str(Settings().manifest))


def sim_shapes() -> int:
    return len(build_schedule(_manifest(), "all"))


# -- strategies ---------------------------------------------------------------------------------------


def run_random(problem: Problem, budget: int, seed: int) -> Run:
    run = Run(problem, budget, random.Random(f"random|{seed}"))
    space = problem.landscape.space
    pick = random.Random(f"random-pick|{seed}")
    while not run.done:
        run.measure({k: pick.choice(v) for k, v in space.items()})
    return run


def run_optuna(sampler: str, problem: Problem, budget: int, seed: int) -> Run:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }
    study = optuna.create_study(direction="minimize", sampler=samplers[sampler]())
    run = Run(problem, budget, random.Random(f"optuna-{sampler}|{seed}"))
    tunable = problem.landscape.tunable
    while not run.done:
        trial = study.ask()
        knobs = {k: trial.suggest_categorical(k, v) for k, v in tunable.items()}
        observed = run.measure(knobs)
        if observed is None:
            # an invalid trial is told as the worst time so far, doubled: told as failed instead, TPE
            # ignores it and keeps sampling the same invalid region (thousands of proposals per run)
            study.tell(trial, 2.0 * max(run.seen.values(), default=1.0))
        else:
            study.tell(trial, observed)
    return run


def _strategy(discards: int) -> Strategy:
    if discards >= STALL_RADICAL:
        return "radical"
    return "escalate" if discards >= STALL_ESCALATE else "refine"


def _measurement(flops: float, ms: float) -> Measurement:
    return Measurement(outcome="ok", tflops=flops / (ms * 1e9), median_ms=ms, repeats=1, verified=True)


def run_croqq(
    kind: str,
    problem: Problem,
    budget: int,
    seed: int,
    candidates: int = 1,
    neighbours: Sequence[tuple[Shape, dict[str, int]]] = (),
    target: float | None = None,
) -> Run:
    """A croqq proposer (``model`` or ``search``) in croqq's loop: baseline, then IDEATE -> measure ->
    DECIDE with the interleaved confirmation, ``candidates`` per iteration (the best of the batch enters
    DECIDE). ``neighbours`` are advanced shapes with their shipped best: when a transfer is due, the
    nearest fill the candidate slots first. ``target``: stop once the shipped best is within it."""
    from croqq.proposers.model import ModelProposer
    from croqq.proposers.search import SearchProposer

    settings = Settings()
    proposer = (ModelProposer if kind == "model" else SearchProposer)(problem.manifest, settings)
    run = Run(problem, budget, random.Random(f"croqq|{seed}"), target=target)
    flops, land = problem.shape.flops, problem.landscape
    best_knobs = dict(problem.seed_knobs)
    baseline = run.measure(best_knobs)
    assert baseline is not None, f"{problem.group}: the seed configuration is not valid"
    run.shipped = land.config(best_knobs)
    best_tflops = flops / (baseline * 1e9)
    history = [
        HistoryEntry(iteration=0, summary="baseline", decision=BASELINE, tflops=best_tflops, knobs=best_knobs)
    ]
    nearby = [knobs for _, knobs in nearest(problem.shape, neighbours, TRANSFER_NEIGHBOURS)]
    tried: list[str] = []
    iteration, discards = 1, 0
    while not run.done:
        ctx = _context(problem, iteration, best_knobs, best_tflops, discards, tried, history, seed)
        offered = nearby if transfer_due(iteration - 1, discards) else []
        batch = _gather(proposer, ctx, candidates, offered, run)
        if not batch:
            break
        tried += [idea.content_hash for idea in batch]
        measured = _measure_batch(run, batch, history, iteration)
        if not measured:
            continue
        idea, observed = min(measured, key=lambda pair: pair[1])
        cand = _measurement(flops, observed)
        confirmation = None
        if needs_confirmation(cand, best_tflops, settings.noise_margin):
            confirmation = Confirmation(
                candidate_tflops=flops / (run.draw(idea.knobs, CONFIRM_DRAWS) * 1e9),
                best_tflops=flops / (run.draw(best_knobs, CONFIRM_DRAWS) * 1e9),
                rounds=CONFIRM_DRAWS,
            )
        decision = decide(
            MeasureResult(candidate=cand, confirmation=confirmation), best_tflops, settings.noise_margin
        )
        tflops = confirmation.candidate_tflops if confirmation else cand.tflops
        history.append(
            HistoryEntry(
                iteration=iteration, summary=idea.summary, decision=decision, tflops=tflops, knobs=idea.knobs
            )
        )
        if decision == KEEP:
            best_knobs, best_tflops, discards = dict(idea.knobs), tflops, 0
            run.shipped = land.config(best_knobs)
        else:
            discards += 1
        iteration += 1
    return run


def _context(
    problem: Problem,
    iteration: int,
    best_knobs: dict[str, int],
    best_tflops: float,
    discards: int,
    tried: list[str],
    history: list[HistoryEntry],
    seed: int,
) -> ProposeContext:
    return ProposeContext(
        shape=problem.shape,
        dsl=problem.dsl,
        gpu_type=SIM_GPU,
        iteration=iteration,
        knob_space=problem.manifest.dsl(problem.dsl).knobs,
        best_knobs=best_knobs,
        best_source="",
        best_tflops=best_tflops,
        peak_tflops=problem.manifest.gpu(SIM_GPU).peak_tflops[problem.shape.dtype],
        strategy=_strategy(discards),
        consecutive_discards=discards,
        bottleneck="unknown",
        tried=list(tried),
        history=list(history),
        seed=seed,
    )


def _gather(
    proposer: Proposer, ctx: ProposeContext, slots: int, offered: list[dict[str, int]], run: Run
) -> list[Idea]:
    """An iteration's candidates: the offered neighbours' knob sets this shape has not tried and that are
    not its best (re-rendered for it, nearest first, no proposer call), then one proposer call per
    remaining slot, one after another, each call's ``tried`` holding the earlier answers of the iteration."""
    batch: list[Idea] = []
    tried = list(ctx.tried)
    land = run.problem.landscape
    for knobs in offered:
        if len(batch) == slots:
            break
        try:
            idea = proposer.make_idea(ctx, knobs, "the best of a neighbouring shape", tag="neighbour")
        except ConfigError:  # a knob value outside this problem's space: it cannot be built here
            run.proposals += 1
            run.invalid += 1
            continue
        if idea.content_hash not in tried and land.config(idea.knobs) != land.config(ctx.best_knobs):
            batch.append(idea)
            tried.append(idea.content_hash)
    while len(batch) < slots:
        run.calls += 1
        try:
            answer = proposer.propose(ctx.model_copy(update={"tried": list(tried)}))
        except TerminalError:
            break
        assert isinstance(answer, Idea), answer  # croqq's own proposers answer with ideas
        batch.append(answer)
        tried.append(answer.content_hash)
    return batch


def _measure_batch(
    run: Run, batch: list[Idea], history: list[HistoryEntry], iteration: int
) -> list[tuple[Idea, float]]:
    """Measure every distinct valid candidate of the batch (each counts against the budget, until it is
    spent); invalid ones and repeats are attempts. All but the batch's best go into the history as
    measured siblings, so that the proposer learns from every measurement."""
    land, flops = run.problem.landscape, run.problem.shape.flops
    measured: list[tuple[Idea, float]] = []
    for idea in batch:
        if run.done:
            break
        repeat = land.config(idea.knobs) in run.seen
        observed = run.measure(idea.knobs)
        if observed is None or repeat:
            history.append(
                HistoryEntry(
                    attempt=sum(e.attempt is not None for e in history) + 1,
                    after_iter=iteration - 1,
                    summary=idea.summary,
                    decision="ATTEMPT_compile" if observed is None else "ATTEMPT_repeat",
                    knobs=idea.knobs,
                )
            )
        else:
            measured.append((idea, observed))
    winner = min(measured, key=lambda pair: pair[1], default=None)
    history += [
        HistoryEntry(
            iteration=iteration,
            summary=f"sibling: {idea.summary}",
            decision=DISCARD,
            tflops=flops / (ms * 1e9),
            knobs=idea.knobs,
        )
        for idea, ms in measured
        if winner is None or idea is not winner[0]
    ]
    return measured


class KernelTuner:
    """Kernel Tuner's strategies in its simulation mode, on a cache file written from the landscape.

    Kernel Tuner reads the cache file and builds its search space on every ``tune_kernel`` call (a second
    per call on a 100k-point grid). Within one problem both are the same every time, so they are built
    once and handed back for the following runs (the cache as a copy; the search space as it is, with the
    neighbour indices and arrays it builds lazily, as within one long ``tune_kernel`` call). Runs are
    reproducible for the same sequence of (strategy, budget, seed) on one problem, which is how
    :func:`_evaluate` runs them.
    """

    def __init__(self, problem: Problem, folder: Path) -> None:
        self.problem = problem
        self.path = folder / f"{problem.landscape.name}.json"
        self._cache: dict[str, Any] | None = None
        self._space: Any = None
        self._write()

    def _write(self) -> None:
        land = self.problem.landscape
        head = {
            "device_name": "croqq",
            "kernel_name": land.name,
            "problem_size": list(land.problem[:2]) or [1, 1],
            "tune_params_keys": list(land.keys),
            "tune_params": land.space,
        }
        timings = {"compile_time": 0.0, "verification_time": 0.0, "benchmark_time": 0.0}
        lines = (
            json.dumps(",".join(map(str, c))) + ": " + json.dumps({"config": c, "time": r.time_ms, **timings})
            for c, r in land.records.items()
        )
        # Kernel Tuner's own layout: the cache last, closed by "}\n}"
        self.path.write_text(json.dumps(head)[:-1] + ', "cache": {\n' + ",\n".join(lines) + "}\n}")

    @contextmanager
    def _reused(self) -> Iterator[None]:
        import kernel_tuner.interface as kt_interface
        import kernel_tuner.util as kt_util

        process_cache, searchspace = kt_util.process_cache, kt_interface.Searchspace

        def cached_process_cache(*args: Any, **kwargs: Any) -> dict[str, Any]:
            if self._cache is None:
                self._cache = process_cache(*args, **kwargs)
            return dict(self._cache)

        def cached_searchspace(*args: Any, **kwargs: Any) -> Any:
            if self._space is None:
                self._space = searchspace(*args, **kwargs)
            return self._space

        kt_util.process_cache, kt_interface.Searchspace = cached_process_cache, cached_searchspace
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            kt_util.process_cache, kt_interface.Searchspace = process_cache, searchspace

    def run(self, strategy: str, budget: int, seed: int) -> Run:
        import kernel_tuner
        import numpy

        # Kernel Tuner 1.5 accepts a seed but its strategies draw from the global generators
        random.seed(seed)
        numpy.random.seed(seed)

        land = self.problem.landscape
        keys = land.keys
        valid = land.records

        def restriction(params: dict[str, int]) -> bool:
            return tuple(params[k] for k in keys) in valid

        with self._reused():
            results, _ = kernel_tuner.tune_kernel(
                land.name,
                "/* replayed from the cache */",
                tuple(land.problem[:2]) or (1, 1),
                [],
                land.space,
                restrictions=restriction,
                cache=str(self.path),
                simulation_mode=True,
                strategy=strategy,
                strategy_options={"max_fevals": budget},
                verbose=False,
                quiet=True,
            )
        run = Run(self.problem, budget, random.Random(seed))
        for res in results:
            config = tuple(res["config"])
            if len(run.seen) >= budget:
                break
            run.proposals += 1
            if isinstance(res.get("time"), float) and config in valid:
                run.seen.setdefault(config, res["time"])
            elif config not in run.seen:
                run.invalid += 1
        return run


# -- running ------------------------------------------------------------------------------------------


def _evaluate(problem: Problem, budgets: list[int], seeds: list[int], folder: Path) -> list[Result]:
    kt = KernelTuner(problem, folder)
    out: list[Result] = []
    runners: dict[str, Callable[[int, int], Run]] = {
        "croqq": partial(run_croqq, "model", problem),
        **{f"croqq-n{n}": partial(run_croqq, "model", problem, candidates=n) for n in CANDIDATES[1:]},
        "croqq-search": partial(run_croqq, "search", problem),
        "random": partial(run_random, problem),
        **{f"optuna-{name}": partial(run_optuna, name, problem) for name in OPTUNA},
        **{f"kt-{name}": partial(kt.run, name) for name in KERNEL_TUNER},
    }
    for seed in seeds:
        for budget in budgets:
            for strategy, runner in runners.items():
                run = runner(budget, seed)
                ratio = run.ratio()
                out.append(Result(problem.group, strategy, budget, ratio, run.invalid))
    kt.path.unlink(missing_ok=True)
    return out


def _sim_task(index: int, budgets: list[int], seed: int) -> tuple[float, list[Result]]:
    problem = sim_problem(index)
    with tempfile.TemporaryDirectory(prefix="croqq-tuning-") as folder:
        return problem.optimum_ms, _evaluate(problem, budgets, [seed], Path(folder))


def _replay_task(path: Path, budgets: list[int], seeds: list[int]) -> tuple[float, list[Result]]:
    problem = replay_problem(path)
    with tempfile.TemporaryDirectory(prefix="croqq-tuning-") as folder:
        return problem.optimum_ms, _evaluate(problem, budgets, seeds, Path(folder))


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def summarize(results: list[Result], optima: dict[str, float]) -> dict[str, Any]:
    """The report: ``{"landscapes": {NAME: {"optimum": T, "budgets": {B: {STRATEGY: figures}}}}}``."""
    report: dict[str, Any] = {"landscapes": {}}
    for group in sorted({r.group for r in results}):
        budgets: dict[str, dict[str, dict[str, float | int]]] = {}
        for budget in sorted({r.budget for r in results if r.group == group}):
            row: dict[str, dict[str, float | int]] = {}
            for strategy in STRATEGIES:
                runs = [r for r in results if (r.group, r.budget, r.strategy) == (group, budget, strategy)]
                if not runs:
                    continue
                ratios = [r.ratio for r in runs]
                row[strategy] = {
                    "median": round(statistics.median(ratios), 4),
                    "p90": round(_p90(ratios), 4),
                    "within_5pct": round(sum(x <= WITHIN for x in ratios) / len(ratios), 3),
                    "invalid": sum(r.invalid for r in runs),
                }
            budgets[str(budget)] = row
        report["landscapes"][group] = {
            "optimum": round(optima[group], 6),
            "budgets": budgets,
            "rule": {budget: rule(row) for budget, row in budgets.items() if "croqq" in row},
        }
    return report


def rule(row: dict[str, dict[str, float | int]]) -> dict[str, Any]:
    """The tuning-quality rule at one budget: against the best other strategy (lowest median, ties by the
    larger within_5pct), croqq's median may be worse by at most ``RULE_GAP_PCT`` % of the optimum and its
    within_5pct must be at least the other's. Judged for the default ``croqq``; ``candidates`` judges
    the other N."""
    others = {s: f for s, f in row.items() if not s.startswith("croqq")}
    best = min(others, key=lambda s: (others[s]["median"], -others[s]["within_5pct"]))

    def judge(strategy: str) -> dict[str, Any]:
        ours, theirs = row[strategy], others[best]
        gap = round(100.0 * (ours["median"] - theirs["median"]), 3)
        within = [ours["within_5pct"], theirs["within_5pct"]]
        return {
            "best_other": best,
            "median_gap_pct": gap,
            "within_5pct": within,
            "pass": gap <= RULE_GAP_PCT and within[0] >= within[1],
        }

    variants = {s.removeprefix("croqq-n"): judge(s) for s in row if s.startswith("croqq-n")}
    return {**judge("croqq"), "candidates": variants}


def run(
    landscapes: list[Path],
    budgets: list[int],
    seeds: int,
    sim_limit: int | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The tuning-quality report; ``sim_limit`` tunes only the first shapes of the schedule (tests)."""
    shapes = sim_shapes() if sim_limit is None else min(sim_limit, sim_shapes())
    workers = workers or os.cpu_count() or 1
    results: list[Result] = []
    optima: dict[str, list[float]] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        jobs = [pool.submit(_sim_task, i, budgets, i % seeds) for i in range(shapes)]
        chunks = [list(range(seeds))[w::workers] for w in range(min(workers, seeds))]
        jobs += [pool.submit(_replay_task, path, budgets, chunk) for path in landscapes for chunk in chunks]
        for done, job in enumerate(jobs, 1):
            optimum, rows = job.result()
            results += rows
            optima.setdefault(rows[0].group, []).append(optimum)
            if done % 20 == 0 or done == len(jobs):
                log.info("tuning benchmark: %d/%d problems done", done, len(jobs))
    # the simulated landscape's optimum differs per shape (the ratios are per shape): its median
    return summarize(results, {group: statistics.median(values) for group, values in optima.items()})


def flat_figures(report: dict[str, Any]) -> dict[str, float | int]:
    """The report's headline figures as flat names for the history: per landscape and budget each
    strategy's median and within_5pct and the rule's verdict; per transfer set and N, measurements and
    agent calls off and on and the reduction."""
    out: dict[str, float | int] = {}
    for land, entry in report.get("landscapes", {}).items():
        for budget, row in entry["budgets"].items():
            for strategy, figures in row.items():
                for key in ("median", "within_5pct"):
                    out[_name("tuning", land, budget, strategy, key)] = figures[key]
            if budget in entry.get("rule", {}):
                out[_name("tuning", land, budget, "rule_pass")] = int(entry["rule"][budget]["pass"])
    for name, entry in report.get("transfer", {}).items():
        out[_name("transfer", name, "wall_s")] = entry["wall_s"]
        for n, sides in entry["by_candidates"].items():
            for side in ("off", "on"):
                for key in ("measurements", "agent_calls"):
                    out[_name("transfer", name, f"n{n}", side, key)] = sides[side][key]
            out[_name("transfer", name, f"n{n}", "reduction_pct")] = sides["reduction_pct"]
    return out


def _name(*parts: str) -> str:
    return "_".join(parts).replace("-", "_").replace(".", "_")


def describe(report: dict[str, Any]) -> list[str]:
    """The rule's verdict per landscape and budget, one line each (the text summary)."""
    lines = []
    for land, entry in report.get("landscapes", {}).items():
        for budget, verdict in entry.get("rule", {}).items():
            variants = "".join(f"; N={n}: {_verdict(v)}" for n, v in verdict["candidates"].items())
            lines.append(f"{land} @{budget}: croqq vs {verdict['best_other']}: {_verdict(verdict)}{variants}")
    return lines


def _verdict(v: dict[str, Any]) -> str:
    ours, theirs = v["within_5pct"]
    outcome = "pass" if v["pass"] else "FAIL"
    return f"median {v['median_gap_pct']:+.3f}% of the optimum, within 5% {ours} vs {theirs}: {outcome}"
