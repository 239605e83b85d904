"""The model proposer: any knob space, never a repeat, learns what builds, and converges."""

from __future__ import annotations

import itertools
from functools import cache

import pytest

from benchmarks.tuning_bench import Problem, run_croqq
from croqq.backends.landscape import Landscape, Record
from croqq.backends.replay import replay_manifest
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.records import HistoryEntry
from croqq.domain.shapes import parse_key
from croqq.proposers._base import ProposeContext, over_budget
from croqq.proposers.model import INITIAL, ModelProposer
from croqq.settings import PROJECT_ROOT, Settings

SHAPE = parse_key("f16_1024x1024x1024")
SPACE = {"BLOCK": [16, 32, 64, 128, 256], "UNROLL": [1, 2, 4, 8], "VEC": [1, 2, 4, 8], "PIPE": [1, 2, 3]}
OPT = {"BLOCK": 64, "UNROLL": 4, "VEC": 2, "PIPE": 3}


def bowl(knobs: dict[str, int]) -> float:
    """A landscape whose time grows with the distance (in list steps) from OPT."""
    return 1.0 + sum((SPACE[k].index(v) - SPACE[k].index(OPT[k])) ** 2 for k, v in knobs.items()) * 0.2


@cache
def toy() -> Landscape:
    """SPACE with its bowl; VEC=8 with BLOCK=16 does not build (absent)."""
    records = {}
    for config in itertools.product(*SPACE.values()):
        knobs = dict(zip(SPACE, config, strict=True))
        if knobs["VEC"] == 8 and knobs["BLOCK"] == 16:
            continue
        t = bowl(knobs)
        records[config] = Record(time_ms=t, times_ms=(t * 0.99, t, t * 1.01))
    return Landscape(name="toy", keys=tuple(SPACE), space=SPACE, records=records, problem=(1024, 1024))


@cache
def manifest() -> Manifest:
    return replay_manifest(load_manifest(PROJECT_ROOT / "kernels" / "manifest.json"), toy())


def context(history: list[HistoryEntry], *, seed: int = 0, tried: list[str] | None = None) -> ProposeContext:
    return ProposeContext(
        shape=SHAPE,
        dsl="replay",
        gpu_type="sm90_Simulated_H100_SXM",
        iteration=len(history),
        knob_space=manifest().dsl("replay").knobs,
        best_knobs=toy().first_valid,
        best_source="",
        best_tflops=1.0,
        peak_tflops=989.4,
        strategy="refine",
        consecutive_discards=0,
        bottleneck="unknown",
        tried=tried or [],
        history=history,
        seed=seed,
    )


def measured(knobs: dict[str, int], i: int) -> HistoryEntry:
    return HistoryEntry(iteration=i, summary="x", decision="DISCARD", tflops=1.0 / bowl(knobs), knobs=knobs)


def spread_history(n: int) -> list[HistoryEntry]:
    configs = list(itertools.islice(itertools.product(*SPACE.values()), 0, 600, 600 // n))[:n]
    return [measured(dict(zip(SPACE, c, strict=True)), i) for i, c in enumerate(configs)]


def test_ideas_use_exactly_the_knob_space_given_and_are_never_repeated() -> None:
    proposer = ModelProposer(manifest(), Settings())
    history = spread_history(INITIAL + 2)
    tried: list[str] = []
    seen = {tuple(e.knobs.values()) for e in history}
    for _ in range(25):
        idea = proposer.propose(context(history, tried=tried))
        knobs = {k: v for k, v in idea.knobs.items() if k in SPACE}
        assert set(idea.knobs) == set(SPACE) and all(v in SPACE[k] for k, v in knobs.items())
        assert idea.content_hash not in tried and tuple(knobs.values()) not in seen
        assert idea.proposer == "model" and idea.summary.startswith("model-guided")
        tried.append(idea.content_hash)
        seen.add(tuple(knobs.values()))
        history.append(measured(knobs, len(history)))


def test_the_same_context_gives_the_same_idea_and_the_seed_varies_the_spread() -> None:
    proposer = ModelProposer(manifest(), Settings())
    for history in (spread_history(INITIAL + 3), spread_history(2)):
        first = proposer.propose(context(history))
        assert proposer.propose(context(history)).content_hash == first.content_hash
    # before the model (fewer than INITIAL measured), the spread-out draws follow the seed
    tried = [first.content_hash]
    ideas = {proposer.propose(context(history, seed=s, tried=tried)).content_hash for s in range(1, 6)}
    assert len(ideas) > 1


def test_knob_values_that_failed_to_build_are_avoided() -> None:
    proposer = ModelProposer(manifest(), Settings())
    history = spread_history(INITIAL + 4)
    failed = [
        HistoryEntry(
            attempt=i + 1, summary="x", decision="ATTEMPT_compile", knobs={**OPT, "VEC": 8, "PIPE": p}
        )
        for i, p in enumerate((1, 2, 3) * 3)
    ]
    tried: list[str] = []
    vec8 = 0
    for _ in range(12):
        idea = proposer.propose(context(history + failed, tried=tried))
        tried.append(idea.content_hash)
        vec8 += idea.knobs["VEC"] == 8
        history.append(measured({k: idea.knobs[k] for k in SPACE}, len(history)))
    assert vec8 <= 1


@pytest.mark.parametrize("seed", range(5))
def test_it_converges_on_a_bowl_within_thirty_measurements(seed: int) -> None:
    problem = Problem("toy", toy(), manifest(), "replay", SHAPE, toy().first_valid)
    run = run_croqq("model", problem, 30, seed)
    assert len(run.seen) == 30
    assert run.ratio() <= 1.05, f"seed {seed}: shipped {run.ratio():.3f}x the optimum"


@pytest.mark.parametrize(("dsl", "seed"), [("cuda", "naive"), ("cutlass", "reference")])
def test_on_the_gemm_knobs_it_never_proposes_what_the_resource_check_or_a_family_rule_refuses(
    dsl: str, seed: str
) -> None:
    real = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    shape = parse_key("f16_4096x4096x4096")
    proposer = ModelProposer(real, Settings())
    knobs = seed_knobs(real, dsl, "f16", seed)
    history = [HistoryEntry(iteration=0, summary="baseline", decision="BASELINE", tflops=100.0, knobs=knobs)]
    tried: list[str] = []
    for i in range(1, 16):
        ctx = context(history, tried=tried).model_copy(
            update={"shape": shape, "dsl": dsl, "knob_space": real.dsl(dsl).knobs, "best_knobs": knobs}
        )
        idea = proposer.propose(ctx)
        assert not over_budget(idea.knobs, 2, shape.k), idea.knobs
        assert real.dsl(dsl).broken_rule(idea.knobs, (4096, 4096, 4096), real.dtypes["f16"]) is None, (
            idea.knobs
        )
        tried.append(idea.content_hash)
        history.append(
            HistoryEntry(iteration=i, summary="x", decision="DISCARD", tflops=100.0 + i, knobs=idea.knobs)
        )
