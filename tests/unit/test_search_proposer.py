"""The search proposer moves from the best like an engineer: one knob while refining, several when
escalating, far when radical; it never repeats an idea, never proposes one its resource check catches, and
the same context gives the same idea."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

import pytest

from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.records import Strategy
from croqq.domain.shapes import Shape, parse_key
from croqq.proposers._base import ProposeContext, over_budget
from croqq.proposers.search import GUIDANCE, SearchProposer
from croqq.settings import PROJECT_ROOT, Settings

SHAPE = parse_key("f16_4096x8192x8192")
TAG_RE = r"^[a-z0-9][a-z0-9_-]{0,39}$"


@cache
def manifest() -> Manifest:
    return load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")


def proposer() -> SearchProposer:
    return SearchProposer(manifest(), Settings())


def reference(shape: Shape = SHAPE) -> dict[str, int]:
    return seed_knobs(manifest(), "cuda", shape.dtype, "reference")


def context(
    strategy: Strategy = "refine",
    iteration: int = 1,
    *,
    tried: list[str] | None = None,
    bottleneck: str = "unknown",
    best: dict[str, int] | None = None,
    shape: Shape = SHAPE,
) -> ProposeContext:
    best = reference(shape) if best is None else best
    if tried is None:
        tried = [knob_candidate(manifest(), Settings(), "cuda", shape, reference(shape)).content_hash]
    return ProposeContext(
        shape=shape,
        dsl="cuda",
        gpu_type="sm90_Simulated_H100_SXM",
        iteration=iteration,
        knob_space=manifest().dsl("cuda").knobs,
        best_knobs=best,
        best_source="",
        best_tflops=500.0,
        peak_tflops=989.4,
        strategy=strategy,
        consecutive_discards={"refine": 0, "escalate": 5, "radical": 10}[strategy],
        bottleneck=bottleneck,
        tried=tried,
    )


def changed(a: dict[str, int], b: dict[str, int]) -> list[str]:
    return sorted(k for k in a if a[k] != b[k])


def steps(knob: str, a: int, b: int) -> int:
    values = manifest().dsl("cuda").knobs[knob]
    return abs(values.index(a) - values.index(b))


def test_refine_changes_one_knob_to_a_neighbouring_value() -> None:
    for iteration in range(1, 30):
        idea = proposer().propose(context(iteration=iteration))
        (knob,) = changed(idea.knobs, reference())
        assert steps(knob, idea.knobs[knob], reference()[knob]) == 1
        assert idea.strategy == "refine" and idea.proposer == "search"


def test_summaries_read_like_an_engineers_one_liner() -> None:
    idea = proposer().propose(context())
    (knob,) = changed(idea.knobs, reference())
    assert f"{knob} {reference()[knob]}->{idea.knobs[knob]}" in idea.summary
    assert idea.summary.split()[0] in {"raise", "lower"}
    assert " to " in idea.summary or " for " in idea.summary
    assert len(idea.summary) < 100
    assert len(idea.tag) <= 20 and re.match(TAG_RE, idea.tag)


def test_escalate_changes_two_or_three_knobs() -> None:
    for iteration in range(1, 30):
        idea = proposer().propose(context("escalate", iteration=iteration))
        assert 2 <= len(changed(idea.knobs, reference())) <= 3
        assert idea.strategy == "escalate"


def test_radical_jumps_far() -> None:
    counts = [
        len(changed(proposer().propose(context("radical", iteration=i)).knobs, reference()))
        for i in range(40)
    ]
    assert min(counts) >= 3
    assert sorted(counts)[len(counts) // 2] >= 4


def test_never_proposes_a_tried_hash() -> None:
    tried: list[str] = []
    for i in range(60):
        idea = proposer().propose(context(iteration=i, tried=list(tried)))
        assert idea.content_hash not in tried
        tried.append(idea.content_hash)


def test_an_exhausted_neighbourhood_widens_the_move() -> None:
    space = manifest().dsl("cuda").knobs
    ref = reference()
    neighbours = [
        knob_candidate(manifest(), Settings(), "cuda", SHAPE, {**ref, knob: values[i]}).content_hash
        for knob, values in space.items()
        for i in (values.index(ref[knob]) - 1, values.index(ref[knob]) + 1)
        if 0 <= i < len(values)
    ]
    idea = proposer().propose(context(tried=neighbours))
    assert idea.content_hash not in neighbours
    assert len(changed(idea.knobs, ref)) >= 2


def test_same_context_gives_the_same_idea() -> None:
    strategies: tuple[Strategy, ...] = ("refine", "escalate", "radical")
    for strategy in strategies:
        assert proposer().propose(context(strategy)) == SearchProposer(manifest(), Settings()).propose(
            context(strategy)
        )
    ideas = {proposer().propose(context(iteration=i)).content_hash for i in range(1, 20)}
    assert len(ideas) > 5


@pytest.mark.parametrize("bottleneck", ["memory", "latency", "compute"])
def test_refine_favours_knobs_that_address_the_bottleneck(bottleneck: str) -> None:
    hits: Counter[bool] = Counter()
    for i in range(200):
        idea = proposer().propose(context(iteration=i, bottleneck=bottleneck))
        (knob,) = changed(idea.knobs, reference())
        hits[knob in GUIDANCE[bottleneck]] += 1
    share = hits[True] / 200
    uniform = len(GUIDANCE[bottleneck]) / len(manifest().dsl("cuda").knobs)
    assert share > uniform + 0.1


def test_starts_from_the_reference_when_there_is_no_best_yet() -> None:
    idea = proposer().propose(context(best={}))
    assert len(changed(idea.knobs, reference())) == 1


def test_every_idea_is_a_valid_candidate_for_the_shape() -> None:
    shape = parse_key("e4m3_4096x4096x128")
    strategies: tuple[Strategy, ...] = ("refine", "escalate", "radical")
    for strategy in strategies:
        for i in range(20):
            idea = proposer().propose(context(strategy, iteration=i, shape=shape))
            assert (
                knob_candidate(manifest(), Settings(), "cuda", shape, idea.knobs).content_hash
                == idea.content_hash
            )


def test_never_proposes_an_idea_over_the_resource_budget() -> None:
    strategies: tuple[Strategy, ...] = ("refine", "escalate", "radical")
    for shape in (SHAPE, parse_key("e4m3_4096x4096x128")):
        a_bytes = manifest().dtypes[shape.dtype].a_bytes
        for strategy in strategies:
            for i in range(40):
                idea = proposer().propose(context(strategy, iteration=i, shape=shape))
                assert not over_budget(idea.knobs, a_bytes, shape.k), (strategy, idea.knobs)


def test_never_proposes_what_a_rule_of_the_cutlass_family_refuses() -> None:
    """Its reference sits at the accumulator limit (128x256 cooperative): a larger tile, ping-pong at that
    tile, split-K without stream-K or FP8 fast accumulation on f16 would each be an attempt, never run."""
    spec = manifest().dsl("cutlass")
    strategies: tuple[Strategy, ...] = ("refine", "escalate", "radical")
    for shape in (SHAPE, parse_key("e4m3_4096x4096x128")):
        best = seed_knobs(manifest(), "cutlass", shape.dtype, "reference")
        hashes = [knob_candidate(manifest(), Settings(), "cutlass", shape, best).content_hash]
        for strategy in strategies:
            for i in range(40):
                ctx = context(strategy, iteration=i, shape=shape, best=best, tried=hashes)
                ctx = ctx.model_copy(
                    update={"dsl": "cutlass", "knob_space": spec.knobs, "bottleneck": "memory"}
                )
                idea = proposer().propose(ctx)
                dims, dtype = (shape.m, shape.n, shape.k), manifest().dtypes[shape.dtype]
                assert spec.broken_rule(idea.knobs, dims, dtype) is None, (strategy, idea.knobs)
