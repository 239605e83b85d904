"""The replay backend measures a knob configuration by its recorded repeats, and its dsl's knob space is
the cache file's: a search proposer tunes it like any other dsl."""

from __future__ import annotations

from functools import cache

import pytest

from croqq.backends.landscape import Landscape, load_landscape
from croqq.backends.replay import REPLAY_DSL, replay_manifest
from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import check_knobs, seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.records import Strategy
from croqq.domain.shapes import parse_key
from croqq.proposers._base import ProposeContext
from croqq.proposers.search import SearchProposer
from croqq.settings import PROJECT_ROOT, Settings

XGEMM = PROJECT_ROOT / "landscapes" / "xgemm_4096_rtx2080ti.kerneltuner.json.gz"
SHAPE = parse_key("f16_4096x4096x4096")


@cache
def base_manifest() -> Manifest:
    return load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")


@pytest.fixture(scope="module")
def xgemm() -> Landscape:
    return load_landscape(XGEMM)  # ~1 s: once for the module


def test_the_replay_dsl_has_every_knob_of_the_file_and_seeds_at_its_first_valid_configuration(
    xgemm: Landscape,
) -> None:
    manifest = replay_manifest(base_manifest(), xgemm)
    spec = manifest.dsl(REPLAY_DSL)
    assert spec.knobs == xgemm.space and len(spec.knobs) == 15 and spec.knobs["KWG"] == [32]
    assert set(spec.kernels) == set(manifest.dtypes) and "cuda" in manifest.dsls
    for dtype in manifest.dtypes:
        for which in ("reference", "naive"):
            assert seed_knobs(manifest, REPLAY_DSL, dtype, which) == xgemm.first_valid
    assert xgemm.record(xgemm.first_valid) is not None


def test_a_replay_candidate_is_its_knob_macros_and_a_header_that_declares_nothing(xgemm: Landscape) -> None:
    manifest = replay_manifest(base_manifest(), xgemm)
    cand = knob_candidate(manifest, Settings(), REPLAY_DSL, SHAPE, xgemm.first_valid)
    assert cand.knobs == xgemm.first_valid and cand.dsl == REPLAY_DSL
    assert list(cand.headers) == ["replay.h"] and "#define MWG 16" in cand.source
    assert "replay backend" in cand.headers["replay.h"]


def search_context(
    manifest: Manifest, strategy: Strategy, iteration: int, tried: list[str]
) -> ProposeContext:
    seed = seed_knobs(manifest, REPLAY_DSL, SHAPE.dtype, "reference")
    return ProposeContext(
        shape=SHAPE,
        dsl=REPLAY_DSL,
        gpu_type="sm90_Simulated_H100_SXM",
        iteration=iteration,
        knob_space=manifest.dsl(REPLAY_DSL).knobs,
        best_knobs=seed,
        best_source="",
        best_tflops=5.0,
        peak_tflops=989.4,
        strategy=strategy,
        consecutive_discards={"refine": 0, "escalate": 5, "radical": 10}[strategy],
        bottleneck="unknown",
        tried=tried,
    )


@pytest.mark.parametrize("strategy", ["refine", "escalate", "radical"])
def test_the_search_proposer_proposes_new_valid_ideas_on_the_cache_knob_space(
    xgemm: Landscape, strategy: Strategy
) -> None:
    manifest = replay_manifest(base_manifest(), xgemm)
    proposer = SearchProposer(manifest, Settings())
    seed = xgemm.first_valid
    tried = [knob_candidate(manifest, Settings(), REPLAY_DSL, SHAPE, seed).content_hash]
    for iteration in range(1, 13):
        idea = proposer.propose(search_context(manifest, strategy, iteration, tried))
        check_knobs(manifest.dsl(REPLAY_DSL), idea.knobs)  # every knob, each value from the file
        assert idea.content_hash not in tried and idea.knobs != seed and idea.summary
        tried.append(idea.content_hash)
