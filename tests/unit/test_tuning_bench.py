"""The tuning benchmark: fair accounting, the report's exact format, Kernel Tuner reused faithfully."""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import transfer_bench
from benchmarks import tuning_bench as tb
from croqq.backends import _simmodel as simmodel
from croqq.backends.landscape import load_landscape
from croqq.domain import neighbours
from croqq.domain.manifest import load_manifest
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError
from croqq.settings import PROJECT_ROOT

pytest.importorskip(
    "optuna", reason="the bench dependency group is not installed (pip install --group bench)"
)
pytest.importorskip(
    "kernel_tuner", reason="the bench dependency group is not installed (pip install --group bench)"
)

SPACE = {"A": [1, 2, 4, 8], "B": [16, 32, 64], "C": [0, 1]}


def toy_cache(path: Path, problem_size: list[int] | None = None, best_a: int = 4) -> Path:
    """A Kernel Tuner cache over SPACE: A=8 with B=16 did not compile (absent); one failed at run time.
    The optimum is (best_a, 32, 0)."""
    cache = {}
    for a, b, c in itertools.product(*SPACE.values()):
        if (a, b) == (8, 16):
            continue
        t = 1.0 + abs(a - best_a) * 0.3 + abs(b - 32) * 0.01 + c * 0.2
        cache[f"{a},{b},{c}"] = {"A": a, "B": b, "C": c, "time": t, "times": [t * 0.98, t, t * 1.02]}
    cache["1,16,1"] = {"A": 1, "B": 16, "C": 1, "time": "RuntimeFailedConfig"}
    size = problem_size or [512, 512]
    body = {"tune_params_keys": list(SPACE), "tune_params": SPACE, "problem_size": size, "cache": cache}
    path.write_text(json.dumps(body))
    return path


def test_invalid_proposals_are_counted_but_not_measured_and_repeats_are_free(tmp_path: Path) -> None:
    problem = tb.replay_problem(toy_cache(tmp_path / "toy.json"))
    run = tb.Run(problem, budget=3, rng=random.Random(0))
    assert run.measure({"A": 8, "B": 16, "C": 0}) is None
    assert run.measure({"A": 1, "B": 16, "C": 1}) is None  # recorded as a failure: invalid too
    first = run.measure({"A": 4, "B": 32, "C": 0})
    assert first is not None and run.measure({"A": 4, "B": 32, "C": 0}) == first
    assert (run.invalid, len(run.seen), run.proposals, run.done) == (2, 1, 4, False)
    assert run.ratio() == 1.0  # (4, 32, 0) is the optimum


def test_the_report_has_exactly_the_documented_shape(tmp_path: Path) -> None:
    cache = toy_cache(tmp_path / "toy.json")
    report = tb.run([cache], budgets=[4, 8], seeds=2, sim_limit=1, workers=2)
    assert set(report) == {"landscapes"}
    assert set(report["landscapes"]) == {"sim", "toy"}
    assert report["landscapes"]["toy"]["optimum"] == pytest.approx(1.0)
    for land in report["landscapes"].values():
        assert set(land) == {"optimum", "budgets", "rule"} and set(land["budgets"]) == {"4", "8"}
        assert set(land["rule"]) == {"4", "8"}
        for row in land["budgets"].values():
            assert set(row) == set(tb.STRATEGIES)
            for figures in row.values():
                assert set(figures) == {"median", "p90", "within_5pct", "invalid"}
                assert 1.0 <= figures["median"] <= figures["p90"]
                assert 0.0 <= figures["within_5pct"] <= 1.0 and figures["invalid"] >= 0


def test_kernel_tuner_runs_are_valid_within_budget_and_reproducible(tmp_path: Path) -> None:
    problem = tb.replay_problem(toy_cache(tmp_path / "toy.json"))
    runs = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        kt = tb.KernelTuner(problem, tmp_path / folder)
        runs.append(
            [
                kt.run(strategy, budget, seed)
                for seed in (1, 2)
                for budget in (4, 8)
                for strategy in tb.KERNEL_TUNER
            ]
        )
    for first, second in zip(*runs, strict=True):
        assert list(first.seen) == list(second.seen)  # the same sequence of runs gives the same results
        assert 0 < len(first.seen) <= first.budget and first.invalid == 0  # given the valid set
        assert all(config in problem.landscape.records for config in first.seen)


def test_the_simulated_landscape_is_the_sim_models_prediction_for_every_knob_set_that_compiles() -> None:
    problem = tb.sim_problem(0)
    land, shape = problem.landscape, problem.shape
    model = tb.sim_model(load_manifest(PROJECT_ROOT / "kernels" / "manifest.json"), shape)
    grid = [dict(zip(land.keys, c, strict=True)) for c in itertools.product(*land.space.values())]
    for knobs in random.Random(0).sample(grid, 3000):
        rec = land.record(knobs)
        if simmodel.compile_error(shape, knobs, 2) is not None:
            assert rec is None
        else:
            assert rec is not None
            assert rec.time_ms == pytest.approx(simmodel.predict(model, knobs).time_us / 1000, rel=1e-12)
    assert land.optimum[0] == model.optimum
    assert land.record(problem.seed_knobs) is not None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--landscape", "/nonexistent/cache.json"], "landscape file not found"),
        (["--budgets", "30,many"], "--budgets"),
        (["--seeds", "0"], "--seeds"),
    ],
)
def test_bad_tuning_arguments_are_one_line_and_exit_2(args: list[str], words: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "tuning", "--out", str(tmp_path / "r.json"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("python -m benchmarks: error: ")]
    assert len(errors) == 1 and words in errors[0], proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_the_project_landscape_loads_with_its_recorded_figures() -> None:
    land = load_landscape(tb.DEFAULT_LANDSCAPE)
    assert len(land.records) == 17956 and land.grid_size == 82944
    assert land.optimum[1] == pytest.approx(11.482779)
    assert (tb.LANDSCAPES / "LICENSE-benchmark_hub").read_text().startswith("MIT License")


def recorded_proposals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[str], str]]:
    """Every model-proposer call of the test: (iteration, the hashes it was told were tried, its answer)."""
    from croqq.proposers.model import ModelProposer

    calls: list[tuple[int, list[str], str]] = []
    propose = ModelProposer.propose

    def recording(self: ModelProposer, ctx: tb.ProposeContext) -> tb.Idea:
        idea = propose(self, ctx)
        assert isinstance(idea, tb.Idea)
        calls.append((ctx.iteration, list(ctx.tried), idea.content_hash))
        return idea

    monkeypatch.setattr(ModelProposer, "propose", recording)
    return calls


def test_two_candidates_per_iteration_are_distinct_and_each_measurement_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = recorded_proposals(monkeypatch)
    problem = tb.replay_problem(toy_cache(tmp_path / "toy.json"))
    run = tb.run_croqq("model", problem, budget=9, seed=0, candidates=2)
    assert len(run.seen) == 9 and run.calls == len(calls)
    by_iteration: dict[int, list[tuple[list[str], str]]] = {}
    for iteration, tried, answer in calls:
        by_iteration.setdefault(iteration, []).append((tried, answer))
    assert len(by_iteration) >= 3
    for batch in by_iteration.values():
        assert len(batch) == 2
        (_, first), (tried, second) = batch
        assert first in tried and first != second  # the second call knew the first answer
    # every distinct valid answer was measured (the baseline aside), but for one the budget cut off
    assert len(calls) - run.invalid - (len(run.seen) - 1) in (0, 1)


def test_transfer_offers_the_nearest_neighbours_best_first_without_a_proposer_call(tmp_path: Path) -> None:
    problem = tb.replay_problem(toy_cache(tmp_path / "toy.json", [1024, 1024, 1024]))
    near, second, far = ({"A": 2, "B": 64, "C": 0}, {"A": 8, "B": 32, "C": 1}, {"A": 4, "B": 32, "C": 0})

    def shape(m: int, dtype: str = "f16") -> Shape:
        return Shape(dtype=dtype, m=m, n=1024, k=1024)

    neighbours = [(shape(4096), far), (shape(2048), second), (shape(512), near), (shape(1024, "e4m3"), far)]
    land = problem.landscape
    run = tb.run_croqq("model", problem, budget=3, seed=0, neighbours=neighbours)
    # baseline, then iteration 1 and 2: the two nearest f16 shapes' best, nearest first (ties by M, N, K)
    assert list(run.seen)[1:] == [land.config(near), land.config(second)] and run.calls == 0
    # with two slots both come in the first iteration, and the proposer fills none of them
    run = tb.run_croqq("model", problem, budget=3, seed=0, candidates=2, neighbours=neighbours)
    assert list(run.seen)[1:] == [land.config(near), land.config(second)] and run.calls == 0
    # a neighbour's best that is this shape's own best (here its seed) is skipped: the next one comes first
    own = [(shape(768), land.knobs(land.config(problem.seed_knobs))), *neighbours]
    run = tb.run_croqq("model", problem, budget=2, seed=0, neighbours=own)
    assert list(run.seen)[1:] == [land.config(near)] and run.calls == 0
    # without neighbours the same run asks the proposer
    assert tb.run_croqq("model", problem, budget=3, seed=0).calls == 2


def write_set(folder: Path) -> Path:
    folder.mkdir()
    toy_cache(folder / "small.json", [512, 512, 512], best_a=2)
    toy_cache(folder / "ref.json", [4096, 8192, 8192])
    toy_cache(folder / "half_k.json", [4096, 8192, 4096])
    return folder


def test_a_landscape_set_is_visited_from_the_reference_shape_and_finds_neighbours_by_problem_size(
    tmp_path: Path,
) -> None:
    paths = transfer_bench.landscape_set(write_set(tmp_path / "set"))
    assert [p.name for p in paths] == ["ref.json", "half_k.json", "small.json"]
    problems = [tb.replay_problem(p) for p in paths]
    assert [neighbours.dims(p.shape) for p in problems] == [
        (4096, 8192, 8192),
        (4096, 8192, 4096),
        (512, 512, 512),
    ]
    small, others = problems[2], [(p.shape, p.group) for p in problems[:2]]
    assert tb.nearest(small.shape, others, 1) == [(problems[1].shape, "half_k")]
    report = transfer_bench.run([], [tmp_path / "set"], seeds=1)
    figures = report["set"]
    assert figures["shapes"] == 3 and set(figures["by_candidates"]) == {"1", "2", "4"}
    for sides in figures["by_candidates"].values():
        for side in ("off", "on"):
            assert 3 <= sides[side]["measurements"] <= 3 * transfer_bench.CAP
            assert sides[side]["capped"] == 0


@pytest.mark.parametrize(
    ("size", "words"), [([512, 512], "problem_size must be [M, N, K]"), ([512, 512, 512], "also small.json")]
)
def test_a_bad_landscape_set_is_one_line(tmp_path: Path, size: list[int], words: str) -> None:
    folder = write_set(tmp_path / "set")
    toy_cache(folder / "zz_bad.json", size)
    with pytest.raises(ConfigError, match=re.escape(words)):
        transfer_bench.landscape_set(folder)


def test_the_json_report_has_the_transfer_object_beside_the_landscapes(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "set")
    args = ["--landscape", str(toy_cache(tmp_path / "toy.json")), "--budgets", "4", "--seeds", "1"]
    args += [
        "--sim-shapes",
        "0",
        "--transfer-sets",
        "",
        "--landscape-set",
        str(folder),
        "--transfer-seeds",
        "1",
    ]
    args += ["--json", "--history", str(tmp_path / "h.jsonl"), "--out", str(tmp_path / "r.json")]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "tuning", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(proc.stdout)
    assert set(report) == {"landscapes", "transfer"} and set(report["transfer"]) == {"set"}
    entry = report["transfer"]["set"]
    assert entry["shapes"] == 3
    assert entry["off"]["measurements"] == entry["by_candidates"]["1"]["off"]["measurements"] > 0
    assert entry["on"]["measurements"] == entry["by_candidates"]["1"]["on"]["measurements"] > 0
    figures = json.loads((tmp_path / "h.jsonl").read_text())["figures"]
    assert figures["transfer_set_n4_on_measurements"] == entry["by_candidates"]["4"]["on"]["measurements"]
    assert figures["tuning_toy_4_rule_pass"] == int(report["landscapes"]["toy"]["rule"]["4"]["pass"])


def row(**strategies: tuple[float, float]) -> dict[str, dict[str, float | int]]:
    return {
        s.replace("_", "-"): {"median": m, "within_5pct": w, "p90": m, "invalid": 0}
        for s, (m, w) in strategies.items()
    }


def test_the_rule_passes_within_a_quarter_percent_and_at_least_the_others_within_5pct() -> None:
    verdict = tb.rule(row(croqq=(1.0040, 0.8), croqq_n2=(1.0, 0.9), random=(1.2, 0.1), kt_x=(1.0020, 0.8)))
    assert verdict["best_other"] == "kt-x" and verdict["median_gap_pct"] == pytest.approx(0.2)
    assert verdict["within_5pct"] == [0.8, 0.8] and verdict["pass"] is True
    assert verdict["candidates"]["2"]["pass"] is True
    (line,) = tb.describe({"landscapes": {"toy": {"rule": {"30": verdict}}}})
    assert line.startswith("toy @30: croqq vs kt-x: median +0.200% of the optimum") and "FAIL" not in line


@pytest.mark.parametrize(
    "others",
    [
        {"kt_x": (1.0010, 0.8), "optuna_tpe": (1.0010, 0.85)},  # a tie on the median: the larger within_5pct
        {"kt_x": (1.0, 0.5)},  # the median trails by more than 0.25%
    ],
)
def test_the_rule_fails_on_either_criterion(others: dict[str, tuple[float, float]]) -> None:
    verdict = tb.rule(row(croqq=(1.0030, 0.8), croqq_search=(1.0, 1.0), **others))
    assert verdict["pass"] is False and verdict["best_other"] != "croqq-search"
    assert tb.describe({"landscapes": {"toy": {"rule": {"30": verdict}}}})[0].endswith(": FAIL")
