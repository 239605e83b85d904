"""The replay backend measures a knob configuration by its recorded repeats, and its dsl's knob space is
the cache file's: a search proposer tunes it like any other dsl."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from croqq.backends import backend_manifest, make_backend
from croqq.backends._base import GpuContext
from croqq.backends.landscape import Landscape, load_landscape
from croqq.backends.replay import REPLAY_DSL, ReplayBackend, replay_manifest
from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import check_knobs, seed_knobs, source_candidate
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.records import BuildOutcome, Strategy
from croqq.domain.shapes import parse_key
from croqq.errors import ConfigError
from croqq.probes.sim import SimProbe
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


# -- the backend ------------------------------------------------------------------------------------


def small_cache(path: Path, cache: dict[str, object] | None = None, compress: bool = False) -> Path:
    """A two-knob Kernel Tuner cache: (BLOCK, UNROLL); 64,2 is absent, 128,2 failed to compile."""
    data = {
        "device_name": "test GPU",
        "problem_size": [1024, 1024, 1024],
        "tune_params_keys": ["BLOCK", "UNROLL"],
        "tune_params": {"BLOCK": [32, 64, 128], "UNROLL": [1, 2]},
        "cache": cache
        if cache is not None
        else {
            "32,1": {"time": 2.0, "times": [1.9, 2.0, 2.1, 2.0]},
            "32,2": {"time": 1.5, "times": [1.4, 1.5, 1.6]},
            "64,1": {"time": 1.0, "times": [0.95, 1.0, 1.05, 1.1, 0.9]},
            "128,1": {"time": 3.0, "times": [3.0]},
            "128,2": {"time": "CompilationFailedConfig"},
        },
    }
    body = json.dumps(data).encode()
    path.write_bytes(gzip.compress(body) if compress else body)
    return path


def replay_setup(cache: Path, tmp_path: Path, **settings: object) -> tuple[ReplayBackend, Manifest]:
    s = Settings(backend="replay", replay_cache=cache, run_dir=tmp_path / "run", **settings)  # type: ignore[arg-type]
    manifest = backend_manifest(s)
    be = make_backend(s, manifest)
    assert isinstance(be, ReplayBackend)
    return be, manifest


def gpu() -> GpuContext:
    probe = SimProbe(count=1, host="replay")
    return GpuContext(uuid=probe.discover()[0].uuid, index=0, gpu_type="sm90_Simulated_H100_SXM", probe=probe)


def built(be: ReplayBackend, manifest: Manifest, **knobs: int) -> BuildOutcome:
    return be.build(SMALL, knob_candidate(manifest, be.settings, REPLAY_DSL, SMALL, knobs))


SMALL = parse_key("f16_1024x1024x1024")


@pytest.mark.parametrize("compress", [False, True], ids=["json", "gzip"])
def test_plain_and_gzipped_caches_load_and_give_the_replay_dsl_its_knob_space(
    tmp_path: Path, compress: bool
) -> None:
    be, manifest = replay_setup(small_cache(tmp_path / "c.json", compress=compress), tmp_path)
    assert be.settings.dsl == REPLAY_DSL  # the default dsl with backend=replay
    spec = manifest.dsl(REPLAY_DSL)
    assert spec.knobs == {"BLOCK": [32, 64, 128], "UNROLL": [1, 2]}
    assert seed_knobs(manifest, REPLAY_DSL, "e4m3", "naive") == {"BLOCK": 32, "UNROLL": 1}
    assert be.landscape.problem == (1024, 1024, 1024) and len(be.landscape.records) == 4


def test_measurement_noise_is_drawn_from_the_recorded_repeats_and_reproducible(tmp_path: Path) -> None:
    cache = small_cache(tmp_path / "c.json")
    be, manifest = replay_setup(cache, tmp_path, replay_repeats=3)
    artifact = built(be, manifest, BLOCK=64, UNROLL=1).artifact
    runs = [m for _ in range(40) for m in be.measure(gpu(), SMALL, [artifact])]
    recorded = (0.9, 0.95, 1.0, 1.05, 1.1)
    for m in runs:
        assert m.outcome == "ok" and m.repeats == 3 and m.min_ms in recorded and m.max_ms in recorded
        assert min(recorded) <= m.min_ms <= m.median_ms <= m.max_ms <= max(recorded)
        assert m.tflops == pytest.approx(SMALL.flops / (m.median_ms * 1e9), rel=1e-3)
        assert "drawn from the recorded ones" in m.raw
    assert len({m.median_ms for m in runs}) > 1  # repeated measures differ
    again, _ = replay_setup(cache, tmp_path, replay_repeats=3)  # a restarted worker, same host
    replayed = [m for _ in range(40) for m in again.measure(gpu(), SMALL, [artifact])]
    assert [m.median_ms for m in replayed] == [m.median_ms for m in runs]  # seeded: the same sequence


def test_a_configuration_absent_or_failed_in_the_cache_is_a_failed_build(tmp_path: Path) -> None:
    be, manifest = replay_setup(small_cache(tmp_path / "c.json"), tmp_path)
    for knobs in ({"BLOCK": 64, "UNROLL": 2}, {"BLOCK": 128, "UNROLL": 2}):
        outcome = built(be, manifest, **knobs)
        assert not outcome.ok and "not in the recorded landscape c" in outcome.reason
        assert outcome.reason in outcome.log and "\n" not in outcome.reason
    assert built(be, manifest, BLOCK=128, UNROLL=1).ok


def test_a_source_that_changes_more_than_the_knobs_is_a_failed_build(tmp_path: Path) -> None:
    be, manifest = replay_setup(small_cache(tmp_path / "c.json"), tmp_path)
    knobs = {"BLOCK": 32, "UNROLL": 1}
    good = knob_candidate(manifest, be.settings, REPLAY_DSL, SMALL, knobs)
    edited = source_candidate(
        manifest, REPLAY_DSL, "f16", good.source + "#define PREFETCH 1\n", good.headers, good.toolchain
    )
    outcome = be.build(SMALL, edited)
    assert not outcome.ok and "more than the knob macros" in outcome.reason


def test_profile_reports_an_unknown_bottleneck(tmp_path: Path) -> None:
    be, manifest = replay_setup(small_cache(tmp_path / "c.json"), tmp_path)
    prof = be.profile(gpu(), SMALL, built(be, manifest, BLOCK=32, UNROLL=2).artifact)
    assert prof.bottleneck == "unknown" and prof.metrics == {}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x1f\x8b this is not gzip", "not a Kernel Tuner cache file"),
        (b"{not json", "not a Kernel Tuner cache file"),
        (b'{"cache": {}}', "missing tune_params_keys, tune_params"),
        (b'{"tune_params_keys": ["A"], "tune_params": {"A": [1]}, "cache": [1]}', "cache must map"),
        (
            b'{"tune_params_keys": ["A"], "tune_params": {"A": [1]}, '
            b'"cache": {"1": {"time": "InvalidConfig"}}}',
            "no valid measured configuration",
        ),
    ],
)
def test_a_corrupt_cache_file_is_one_config_error_line(tmp_path: Path, content: bytes, words: str) -> None:
    cache = tmp_path / "bad.json"
    cache.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        replay_setup(cache, tmp_path)
    assert words in str(err.value) and "\n" not in str(err.value) and str(cache) in str(err.value)


def test_backend_replay_without_a_readable_cache_is_one_config_error_line(tmp_path: Path) -> None:
    for path in (None, tmp_path / "missing.json.gz", tmp_path):
        with pytest.raises(ConfigError) as err:
            Settings(backend="replay", replay_cache=path)
        assert "CROQQ_REPLAY_CACHE" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="replay dsl only"):
        Settings(backend="replay", replay_cache=small_cache(tmp_path / "c.json"), dsl="cuda")


def test_knob_names_that_cannot_be_macros_are_refused(tmp_path: Path) -> None:
    raw = {
        "tune_params_keys": ["block-size"],
        "tune_params": {"block-size": [32]},
        "cache": {"32": {"time": 1.0}},
    }
    (tmp_path / "dash.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="block-size cannot be croqq knob macros"):
        replay_manifest(base_manifest(), load_landscape(tmp_path / "dash.json"))


def test_kernel_tuners_lower_case_knob_names_are_knobs(tmp_path: Path) -> None:
    raw = {
        "tune_params_keys": ["block_size_x", "tile"],
        "tune_params": {"block_size_x": [32, 64], "tile": [1, 2]},
        "cache": {"32,1": {"time": 2.0}, "64,2": {"time": 1.0}},
    }
    (tmp_path / "lower.json").write_text(json.dumps(raw))
    manifest = replay_manifest(base_manifest(), load_landscape(tmp_path / "lower.json"))
    knobs = {"block_size_x": 64, "tile": 2}
    cand = knob_candidate(manifest, Settings(), "replay", SMALL, knobs)
    assert {k: v for k, v in cand.knobs.items() if k in knobs} == knobs


def test_the_xgemm_landscape_replays_its_optimum_near_its_recorded_time(
    xgemm: Landscape, tmp_path: Path
) -> None:
    s = Settings(backend="replay", replay_cache=XGEMM, run_dir=tmp_path / "run")
    manifest = replay_manifest(base_manifest(), xgemm)
    be = ReplayBackend(manifest, s, landscape=xgemm)
    knobs, best_ms = xgemm.optimum
    outcome = be.build(SHAPE, knob_candidate(manifest, s, REPLAY_DSL, SHAPE, knobs))
    (m,) = be.measure(gpu(), SHAPE, [outcome.artifact])
    assert m.median_ms == pytest.approx(best_ms, rel=0.05) and m.tflops == pytest.approx(12.0, rel=0.06)


def test_the_search_proposer_works_on_a_small_space_that_shares_one_gemm_knob_name(tmp_path: Path) -> None:
    """TILE_M without its WARPS_M partner, and fewer knobs than a radical jump moves."""
    cache = {
        f"{t},{u},{v}": {"time": 1.0 + t / 100 + u + v, "times": [1.0]}
        for t in (64, 128, 256)
        for u in (1, 2, 3)
        for v in (0, 1)
    }
    raw = {
        "tune_params_keys": ["TILE_M", "UNROLL", "VEC"],
        "tune_params": {"TILE_M": [64, 128, 256], "UNROLL": [1, 2, 3], "VEC": [0, 1]},
        "cache": cache,
    }
    (tmp_path / "small.json").write_text(json.dumps(raw))
    manifest = replay_manifest(base_manifest(), load_landscape(tmp_path / "small.json"))
    proposer = SearchProposer(manifest, Settings())
    for strategy in ("refine", "escalate", "radical"):
        seed = seed_knobs(manifest, REPLAY_DSL, SHAPE.dtype, "reference")
        tried = [knob_candidate(manifest, Settings(), REPLAY_DSL, SHAPE, seed).content_hash]
        for iteration in range(1, 4):  # radical moves all three knobs: 4 such ideas here
            idea = proposer.propose(search_context(manifest, strategy, iteration, tried))
            check_knobs(manifest.dsl(REPLAY_DSL), idea.knobs)
            assert idea.content_hash not in tried
            tried.append(idea.content_hash)
