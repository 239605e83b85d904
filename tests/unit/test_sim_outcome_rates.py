"""The simulated GPU, driven through the real pure FSM by the search proposer with an LLM's sloppier
resource check (:class:`LlmLikeSearch`), reproduces the outcome mix of LLM-driven tuning logs: 8-10% KEEP,
80-83% DISCARD, 6-7% compile failures, ~1.5% runtime failures (all as shares of proposals).

The driver below maps each FSM phase to the backend or proposer call a coordinator would dispatch, in
process and with ``time_scale=0``. The campaign is the whole two-dtype schedule (268 shapes x 30
iterations, a few seconds): a 30-shape sample has a sampling spread (~1 point on KEEP and compile
failures, ~1.7 on DISCARD) as wide as the bands themselves, so it would test the sample, not the model.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

import pytest

from croqq.backends._base import GpuContext
from croqq.backends.sim import SimBackend
from croqq.domain.fsm import (
    STALL_ESCALATE,
    STALL_RADICAL,
    BaselineMeasured,
    Built,
    Decided,
    Event,
    Loop,
    Measured,
    Phase,
    Profiled,
    Proposed,
    Start,
    Stored,
    decide_event,
    transition,
)
from croqq.domain.knobs import make_candidate, seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.records import Idea
from croqq.domain.schedule import build_schedule
from croqq.domain.shapes import Shape
from croqq.probes._base import GpuInfo, GpuProbe, Reading
from croqq.proposers._base import ProposeContext
from croqq.proposers.search import SearchProposer
from croqq.settings import PROJECT_ROOT, Settings

GPU_TYPE = "sm90_Simulated_H100_SXM"
ITERATIONS = 30
CATCH_RATE = 0.77  # how often an LLM's envelope check catches an over-budget idea before proposing it


class LlmLikeSearch(SearchProposer):
    """The search proposer as an LLM agent behaves: its resource check misses some over-budget ideas,
    which then reach the compiler and fail there."""

    def caught(self, ctx: ProposeContext, knobs: dict[str, int], rng: random.Random) -> bool:
        return super().caught(ctx, knobs, rng) and rng.random() < CATCH_RATE


class StubProbe(GpuProbe):
    """One healthy, idle GPU."""

    kind = "stub"

    def discover(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                uuid="GPU-stub-0", index=0, name="Simulated H100 SXM", gpu_type=GPU_TYPE, memory_mib=81559
            )
        ]

    def read(self, uuid: str) -> Reading:
        return Reading(uuid=uuid, temp_c=41, sm_clock_mhz=1980, mem_clock_mhz=2619, power_w=310.0)


@dataclass
class Tally:
    decisions: Counter[str] = field(default_factory=Counter)
    compile_failures: int = 0
    proposals: int = 0
    hashes: list[str] = field(default_factory=list)
    strategies: list[tuple[int, str]] = field(default_factory=list)  # (consecutive discards, idea strategy)
    final: Loop | None = None


@dataclass
class Driver:
    """Runs one shape's loop to DONE: each FSM phase becomes the call a coordinator would dispatch."""

    backend: SimBackend
    proposer: SearchProposer
    gpu: GpuContext
    shape: Shape
    tally: Tally = field(default_factory=Tally)
    best_artifact: str = ""

    def run(self, max_iter: int = ITERATIONS) -> Tally:
        settings = self.backend.settings
        loop = Loop(
            max_iter=max_iter, profile_every=settings.profile_every, noise_margin=settings.noise_margin
        )
        loop = transition(loop, Start())
        while loop.phase != Phase.DONE:
            loop = transition(loop, self.event(loop))
        self.tally.final = loop
        return self.tally

    def event(self, loop: Loop) -> Event:
        handler = getattr(self, f"on_{loop.phase.value.lower()}")
        event: Event = handler(loop)
        return event

    def on_baseline(self, loop: Loop) -> BaselineMeasured:
        manifest = self.backend.manifest
        knobs = seed_knobs(manifest, "cuda", self.shape.dtype, "reference")
        cand = make_candidate(manifest, "cuda", self.shape, knobs, PROJECT_ROOT, "sim")
        build = self.backend.build(self.shape, cand)
        assert build.ok, build.reason
        self.best_artifact = build.artifact
        self.tally.hashes.append(cand.content_hash)
        (m,) = self.backend.measure(self.gpu, self.shape, [build.artifact])
        return BaselineMeasured(
            knobs=knobs, measurement=m, vendor_tflops=self.backend.vendor_tflops(self.gpu, self.shape)
        )

    def on_profile(self, loop: Loop) -> Profiled:
        return Profiled(profile=self.backend.profile(self.gpu, self.shape, self.best_artifact))

    def on_ideate(self, loop: Loop) -> Proposed:
        ctx = ProposeContext(
            shape=self.shape,
            dsl="cuda",
            gpu_type=GPU_TYPE,
            iteration=loop.current_iter + 1,
            knob_space=self.backend.manifest.dsl("cuda").knobs,
            best_knobs=loop.best_knobs,
            best_source=loop.best_source,
            best_tflops=loop.best_tflops,
            peak_tflops=self.backend.peak_tflops(GPU_TYPE, self.shape.dtype),
            strategy=loop.strategy,
            consecutive_discards=loop.consecutive_discards,
            bottleneck=loop.last_profile.bottleneck if loop.last_profile else "unknown",
            tried=list(self.tally.hashes),
        )
        idea = self.proposer.propose(ctx)
        assert isinstance(idea, Idea)
        self.tally.proposals += 1
        self.tally.hashes.append(idea.content_hash)
        self.tally.strategies.append((loop.consecutive_discards, idea.strategy))
        return Proposed(idea=idea)

    def on_implement(self, loop: Loop) -> Built:
        assert loop.pending is not None and loop.pending.idea is not None
        cand = make_candidate(
            self.backend.manifest, "cuda", self.shape, loop.pending.idea.knobs, PROJECT_ROOT, "sim"
        )
        build = self.backend.build(self.shape, cand)
        self.tally.compile_failures += int(not build.ok)
        return Built(build=build)

    def on_measure(self, loop: Loop) -> Measured:
        assert loop.pending is not None and loop.pending.build is not None
        result = self.backend.measure_candidate(
            self.gpu, self.shape, loop.pending.build.artifact, self.best_artifact, loop.best_tflops
        )
        return Measured(result=result)

    def on_decide(self, loop: Loop) -> Decided:
        decided = decide_event(loop)
        self.tally.decisions[decided.decision] += 1
        return decided

    def on_store(self, loop: Loop) -> Stored:
        pending = loop.pending
        assert pending is not None
        if pending.attempt_no is not None:
            return Stored(iteration=None)
        if pending.decision == "KEEP" and pending.build is not None:
            self.best_artifact = pending.build.artifact
        return Stored(iteration=pending.iteration)


@cache
def manifest() -> Manifest:
    return load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")


def scheduled_shapes() -> list[Shape]:
    """Every shape of the two-dtype schedule: near and far, large and skinny."""
    return [entry.shape for entry in build_schedule(manifest(), "all")]


def run_campaign(shapes: list[Shape]) -> list[Tally]:
    settings = Settings(time_scale=0.0)
    backend = SimBackend(manifest(), settings)
    proposer = LlmLikeSearch(manifest(), settings)
    gpu = GpuContext(uuid="GPU-stub-0", index=0, gpu_type=GPU_TYPE, probe=StubProbe())
    return [Driver(backend, proposer, gpu, shape).run() for shape in shapes]


@pytest.fixture(scope="module")
def campaign() -> list[Tally]:
    return run_campaign(scheduled_shapes())


def rates(tallies: list[Tally]) -> dict[str, float]:
    decisions: Counter[str] = Counter()
    for t in tallies:
        decisions.update(t.decisions)
    proposals = sum(t.proposals for t in tallies)
    runtime = sum(n for d, n in decisions.items() if d.startswith("FAIL_"))
    return {
        "keep": decisions["KEEP"] / proposals,
        "discard": decisions["DISCARD"] / proposals,
        "compile": sum(t.compile_failures for t in tallies) / proposals,
        "runtime": runtime / proposals,
    }


def test_outcome_rates_match_llm_tuning_logs(campaign: list[Tally]) -> None:
    r = rates(campaign)
    assert 0.08 <= r["keep"] <= 0.10, r
    assert 0.80 <= r["discard"] <= 0.83, r
    assert 0.06 <= r["compile"] <= 0.07, r
    assert 0.01 <= r["runtime"] <= 0.02, r


def test_every_shape_runs_all_iterations_and_proposals_add_up(campaign: list[Tally]) -> None:
    for t in campaign:
        assert t.final is not None and t.final.current_iter == ITERATIONS
        assert sum(t.decisions.values()) == ITERATIONS
        assert t.proposals == ITERATIONS + t.compile_failures


def test_search_never_repeats_a_hash_within_a_shape(campaign: list[Tally]) -> None:
    for t in campaign:
        assert len(t.hashes) == len(set(t.hashes))


def test_strategy_follows_consecutive_discards(campaign: list[Tally]) -> None:
    seen = {strategy for t in campaign for _, strategy in t.strategies}
    assert seen == {"refine", "escalate", "radical"}
    for t in campaign:
        for discards, strategy in t.strategies:
            expected = (
                "radical"
                if discards >= STALL_RADICAL
                else "escalate"
                if discards >= STALL_ESCALATE
                else "refine"
            )
            assert strategy == expected


def test_tuning_improves_on_the_reference(campaign: list[Tally]) -> None:
    gains = [t.final.best_tflops / t.final.baseline_tflops for t in campaign if t.final is not None]
    assert min(gains) >= 0.99
    assert sorted(gains)[len(gains) // 2] > 1.1


def test_campaign_is_reproducible() -> None:
    shapes = scheduled_shapes()[:3]
    first, second = run_campaign(shapes), run_campaign(shapes)
    assert [t.hashes for t in first] == [t.hashes for t in second]
    assert [t.final for t in first] == [t.final for t in second]
