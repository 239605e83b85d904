"""The tuning benchmark: fair accounting, the report's exact format, Kernel Tuner reused faithfully."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import tuning_bench as tb
from croqq.backends import _simmodel as simmodel
from croqq.backends.landscape import load_landscape
from croqq.domain.manifest import load_manifest
from croqq.settings import PROJECT_ROOT

pytest.importorskip(
    "optuna", reason="the bench dependency group is not installed (pip install --group bench)"
)
pytest.importorskip(
    "kernel_tuner", reason="the bench dependency group is not installed (pip install --group bench)"
)

SPACE = {"A": [1, 2, 4, 8], "B": [16, 32, 64], "C": [0, 1]}


def toy_cache(path: Path) -> Path:
    """A Kernel Tuner cache over SPACE: A=8 with B=16 did not compile (absent); one failed at run time."""
    cache = {}
    for a, b, c in itertools.product(*SPACE.values()):
        if (a, b) == (8, 16):
            continue
        t = 1.0 + abs(a - 4) * 0.3 + abs(b - 32) * 0.01 + c * 0.2
        cache[f"{a},{b},{c}"] = {"A": a, "B": b, "C": c, "time": t, "times": [t * 0.98, t, t * 1.02]}
    cache["1,16,1"] = {"A": 1, "B": 16, "C": 1, "time": "RuntimeFailedConfig"}
    body = {"tune_params_keys": list(SPACE), "tune_params": SPACE, "problem_size": [512, 512], "cache": cache}
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
        assert set(land) == {"optimum", "budgets"} and set(land["budgets"]) == {"4", "8"}
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
