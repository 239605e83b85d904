"""The simulated GPU's model of the cutlass family (croqq/backends/_simcutlass.py): its seeds build and
measure on every scheduled shape, its hidden optimum is a knob set the family's rules allow, it sits where
CUTLASS and cuBLAS do on an H100, and each knob moves the prediction the way it does on the hardware."""

from __future__ import annotations

import pytest

from croqq.backends import _simcutlass as cutlass
from croqq.backends.sim import SimBackend
from croqq.domain.knobs import make_candidate, seed_knobs
from croqq.domain.schedule import build_schedule
from croqq.domain.shapes import Shape, parse_key
from croqq.settings import PROJECT_ROOT, Settings
from tests.unit.test_sim_backend import GPU_TYPE, gpu, manifest

BIG = parse_key("f16_8192x8192x8192")


def backend() -> SimBackend:
    return SimBackend(manifest(), Settings(time_scale=0.0, dsl="cutlass"))


def knobs_for(shape: Shape, **changes: int) -> dict[str, int]:
    return seed_knobs(manifest(), "cutlass", shape.dtype, "reference") | changes


def tflops(shape: Shape, **changes: int) -> float:
    return backend().predicted_tflops(GPU_TYPE, shape, knobs_for(shape, **changes), "cutlass")


def test_the_seeds_build_and_measure_and_the_optimum_is_allowed_on_every_scheduled_shape() -> None:
    be, spec = backend(), manifest().dsl("cutlass")
    shapes = [s.shape for s in build_schedule(manifest(), "all") if s.shape.dtype in spec.kernels]
    assert len(shapes) > 100
    for shape in shapes:
        for which in ("reference", "naive"):
            seed = seed_knobs(manifest(), "cutlass", shape.dtype, which)
            build = be.build(shape, make_candidate(manifest(), "cutlass", shape, seed, PROJECT_ROOT, "sim"))
            assert build.ok, (shape.key, which, build.reason)
            (m,) = be.measure(gpu(), shape, [build.artifact])
            assert m.outcome == "ok" and m.tflops > 0, (shape.key, which, m.detail)
        model = be.shape_model(GPU_TYPE, shape, "cutlass")
        dims = (shape.m, shape.n, shape.k)
        assert spec.broken_rule(model.optimum, dims, manifest().dtypes[shape.dtype]) is None, shape.key
        peak = manifest().gpu(GPU_TYPE).peak_tflops[shape.dtype]
        assert be.optimum_tflops(GPU_TYPE, shape, "cutlass") <= peak


def test_the_family_sits_where_cutlass_and_cublas_do_on_an_h100() -> None:
    be = backend()
    peak = manifest().gpu(GPU_TYPE).peak_tflops["f16"]
    best = be.optimum_tflops(GPU_TYPE, BIG, "cutlass")
    assert 0.74 * peak <= best <= 0.82 * peak  # best published dense f16 at large sizes: ~795 of 989
    vendor = be.vendor_tflops(gpu(), BIG)
    assert vendor is not None and 0.9 <= tflops(BIG) / vendor <= 1.15  # an H200: the reference at cuBLAS


def test_a_partial_last_wave_costs_the_persistent_grid_and_stream_k_recovers_it() -> None:
    full = parse_key("f16_1536x2816x8192")  # 12 x 11 tiles of 128x256: one whole wave of 132 SMs
    partial = parse_key("f16_1664x2816x8192")  # 13 x 11 = 143 tiles: a second wave of 11
    one = {"CLUSTER_M": 1, "CLUSTER_N": 1}
    assert tflops(partial, **one) < 0.75 * tflops(full, **one) * (1664 / 1536)
    assert tflops(partial, SCHEDULER=1, **one) > 1.2 * tflops(partial, **one)
    assert tflops(full, SCHEDULER=1, **one) < tflops(full, **one)  # nothing to balance: only the fix-up


def test_split_k_helps_a_small_output_with_a_long_k() -> None:
    skinny = parse_key("f16_256x256x8192")
    assert tflops(skinny, SCHEDULER=1, SPLITS=4) > 1.5 * tflops(skinny)  # 8 CTAs at work, not 2
    assert tflops(BIG, SCHEDULER=1, SPLITS=4) < tflops(BIG)  # enough tiles already: only the reduction


def test_clusters_multicast_and_larger_ones_cost_more_than_they_save() -> None:
    one = tflops(BIG, CLUSTER_M=1, CLUSTER_N=1)
    assert tflops(BIG, CLUSTER_M=2, CLUSTER_N=1) > one
    assert tflops(BIG, CLUSTER_M=2, CLUSTER_N=4) < tflops(BIG, CLUSTER_M=2, CLUSTER_N=1)


def test_too_few_stages_starve_the_tensor_cores() -> None:
    assert tflops(BIG, STAGES=2) < 0.8 * tflops(BIG, STAGES=4) and tflops(BIG, STAGES=4) == tflops(BIG)


def test_ping_pong_wins_on_a_short_main_loop_and_cooperative_on_a_long_one() -> None:
    short, tile = parse_key("f16_4096x4096x256"), {"TILE_M": 128, "TILE_N": 128}
    assert tflops(short, SCHEDULE=1, **tile) > tflops(short, SCHEDULE=0, **tile)
    assert tflops(BIG, SCHEDULE=1, **tile) < tflops(BIG, SCHEDULE=0, **tile)


def test_direct_stores_cost_where_the_epilogue_is_a_large_share_of_a_tile() -> None:
    short = parse_key("f16_4096x4096x256")  # 4 k-tiles per output tile: the epilogue is a fifth of it
    assert tflops(short, EPILOGUE=1) < 0.95 * tflops(short, EPILOGUE=0)
    assert tflops(BIG, EPILOGUE=1) > 0.99 * tflops(BIG, EPILOGUE=0)  # 128 k-tiles: it hardly shows


def test_fp8_fast_accumulation_is_faster_and_a_wrong_answer_as_on_an_h200() -> None:
    shape, be = parse_key("e4m3_8192x8192x8192"), backend()
    fast = knobs_for(shape, FAST_ACCUM=1)
    assert be.predicted_tflops(GPU_TYPE, shape, fast, "cutlass") == pytest.approx(
        min(cutlass.FAST_ACCUM_GAIN * tflops(shape), be.optimum_tflops(GPU_TYPE, shape, "cutlass") * 2),
        rel=0.01,
    )
    build = be.build(shape, make_candidate(manifest(), "cutlass", shape, fast, PROJECT_ROOT, "sim"))
    assert build.ok
    (m,) = be.measure(gpu(), shape, [build.artifact])
    assert m.outcome == "wrong_answer"


def test_a_knob_set_that_breaks_a_rule_is_refused_without_a_compile() -> None:
    bad = knobs_for(BIG, SCHEDULE=1, SCHEDULER=1)  # ping-pong has no stream-K
    build = backend().build(BIG, make_candidate(manifest(), "cutlass", BIG, bad, PROJECT_ROOT, "sim"))
    assert not build.ok and build.reason.startswith("knob rule: CUTLASS's ping-pong kernel does not support")
    assert build.log == "(not compiled)"
