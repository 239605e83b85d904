"""The simulated GPU's performance model: what one knob set would achieve on one GEMM shape.

Pure and deterministic: every "random" choice is a hash of its inputs, so the same (gpu type, shape,
knobs) always gives the same prediction. The model, in the order it is applied:

1. **Roofline ceiling**: ``min(path peak, arithmetic intensity x mem_gbps)``, with each operand moved
   once. The path peak is the dtype's peak from the manifest times ``PATH_FRACTION``: this family's
   instruction path (warp-level ``mma.sync`` fed by ``cp.async`` through registers) cannot keep Hopper's
   tensor cores as busy as the asynchronous warpgroup path (WGMMA from shared memory, TMA) does, so its
   best kernel tops out near 60-65% of the dense peak, where hand-tuned mma.sync GEMMs on an H100 do.
2. **Tile score** (TILE_M, TILE_N, TILE_K, SPLIT_K), physical rather than learned: operand reuse of the
   CTA tile, wave quantization over the SMs, tile waste where the tile does not divide M or N, main-loop
   length, the split-K reduction and a per-dtype TILE_K preference; a small hash jitter breaks ties.
3. **The hidden optimum**: the tile that maximizes the score, then the other knobs picked by rules a GPU
   engineer would recognize, perturbed by the hash of (gpu type, shape key). The optimum always compiles.
4. **Distance penalties** for the other knobs: 1 at the optimum, falling with the distance in steps of the
   knob's values, asymmetric where the hardware is (too few stages starve the tensor cores far more than
   too many cost occupancy).
5. ``time = flops / (ceiling x efficiency) + launch overhead``, with efficiency below 1, so the predicted
   TFLOPS never exceed the manifest's peak.

Compile rules (sm_90a), as the kernel template's static_asserts: shared memory within the per-block limit,
the fp32 accumulator fragment within 256 registers per thread, a warp tile at least one MMA fragment wide,
the split-K slice a multiple of TILE_K. A fragment that fits but pushes a thread past 255 registers
compiles and spills, at a cost in throughput. Where the seeds land against the optimum is held by
``tests/unit/test_sim_backend.py``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

from croqq.domain.records import Bottleneck
from croqq.domain.shapes import Shape

KNOBS = (
    "TILE_M",
    "TILE_N",
    "TILE_K",
    "STAGES",
    "WARPS_M",
    "WARPS_N",
    "RASTER",
    "SWIZZLE",
    "SPLIT_K",
    "EPI_VEC",
)
NUM_SMS = 132
SMEM_LIMIT_BYTES = 227 * 1024
MAX_REGS = 255
MAX_ACC_REGS = 256  # the kernel template refuses bigger accumulator fragments
REG_OVERHEAD = 40
MMA_FRAG_N = 32
LAUNCH_US = 2.0
EFF_SCALE = 2.6  # maps the best tile score of a large shape to ~80% of the roofline ceiling
PATH_FRACTION = 0.8  # mma.sync's share of the WGMMA peak; x ~0.77 at the optimum: ~61% of dense peak
EFF_CAP = 0.97
REUSE_HALF = 192.0
TILE_K_PREF = {  # by operand bytes: fp8 wants K=128 per stage, f16 K=64
    1: {32: 0.86, 64: 0.94, 128: 1.0},
    2: {32: 0.93, 64: 1.0, 128: 0.95},
}
SWIZZLE_LOSS = (0.0, 0.55, 0.8, 1.0)  # most of the L2 locality comes with the first step of swizzle
WARP_OCCUPANCY = {1: 0.5, 2: 0.78, 4: 1.0, 8: 1.0, 16: 0.97}


@functools.lru_cache(maxsize=1 << 16)
def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (sha256; cached: a landscape asks for the same
    tile's jitter for every other knob's value)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def pick(options: list[int], *parts: object) -> int:
    return options[int(unit(*parts) * len(options))]


# -- compile rules ------------------------------------------------------------------------------------


def smem_bytes(knobs: dict[str, int], a_bytes: int) -> int:
    return (knobs["TILE_M"] + knobs["TILE_N"]) * knobs["TILE_K"] * a_bytes * knobs["STAGES"]


def acc_regs(knobs: dict[str, int]) -> int:
    warps = knobs["WARPS_M"] * knobs["WARPS_N"]
    return knobs["TILE_M"] * knobs["TILE_N"] // (warps * 32)


def spill_factor(knobs: dict[str, int]) -> float:
    """Registers beyond 255 per thread spill to local memory: a steep slowdown, not a failure."""
    regs = acc_regs(knobs) + REG_OVERHEAD
    return 1.0 if regs <= MAX_REGS else (MAX_REGS / regs) ** 2


def known_fault(knobs: dict[str, int], a_bytes: int) -> None:
    """No knob of this family fails at run time by itself (see the cutlass model's)."""
    del knobs, a_bytes


def compile_error(shape: Shape, knobs: dict[str, int], a_bytes: int) -> str | None:
    """The first rule this knob set breaks, as a compiler would word it (None: it compiles)."""
    smem = smem_bytes(knobs, a_bytes)
    if smem > SMEM_LIMIT_BYTES:
        return (
            "ptxas error: Entry function uses too much shared data "
            f"({smem:#x} bytes, {SMEM_LIMIT_BYTES:#x} max)"
        )
    acc = acc_regs(knobs)
    if acc > MAX_ACC_REGS:
        return (
            f"static_assert failed: accumulator fragment of {acc} fp32 registers per thread "
            f"exceeds {MAX_ACC_REGS} (use more warps or a smaller tile)"
        )
    warp_n = knobs["TILE_N"] // knobs["WARPS_N"]
    if warp_n < MMA_FRAG_N:
        return (
            f"static_assert failed: warp tile N {knobs['TILE_N']}/{knobs['WARPS_N']}={warp_n} "
            f"is not a multiple of the {MMA_FRAG_N}-wide MMA fragment"
        )
    slice_k = shape.k // knobs["SPLIT_K"]
    if shape.k % knobs["SPLIT_K"] or slice_k % knobs["TILE_K"]:
        return (
            f"static_assert failed: K slice {shape.k}/{knobs['SPLIT_K']} is not a multiple "
            f"of TILE_K={knobs['TILE_K']}"
        )
    return None


# -- tile score ---------------------------------------------------------------------------------------


def grid(shape: Shape, tm: int, tn: int) -> tuple[int, int]:
    return math.ceil(shape.m / tm), math.ceil(shape.n / tn)


def wave_eff(shape: Shape, tm: int, tn: int, sk: int) -> float:
    gm, gn = grid(shape, tm, tn)
    slots = NUM_SMS * (2 if tm * tn <= 8192 else 1)
    waves = gm * gn * sk / slots
    if waves < 1.0:  # a partial wave: fewer CTAs each get more of L2 and DRAM
        return math.sqrt(waves)
    return waves / math.ceil(waves)


def tile_waste(shape: Shape, tm: int, tn: int) -> float:
    gm, gn = grid(shape, tm, tn)
    return shape.m * shape.n / (gm * tm * gn * tn)


def reuse(tm: int, tn: int) -> float:
    intensity = tm * tn / (tm + tn)
    big = 0.74 if tm * tn > 128 * 256 else 1.0  # one CTA per SM, epilogue not overlapped
    return big * intensity / (intensity + REUSE_HALF)


def kloop(k: float, tk: int, sk: int) -> float:
    iters = max(1.0, k / (tk * sk))
    return iters / (iters + 1.5)


def tile_score(shape: Shape, a_bytes: int, knobs: dict[str, int], salt: str) -> float:
    tm, tn, tk, sk = knobs["TILE_M"], knobs["TILE_N"], knobs["TILE_K"], knobs["SPLIT_K"]
    jitter = 1.0 + 0.02 * (unit(salt, "tile", tm, tn, tk, sk) - 0.5)
    split_cost = 1.0 / (1.0 + 0.05 * (sk - 1))
    pref = TILE_K_PREF.get(a_bytes, TILE_K_PREF[2]).get(tk, 0.9)
    return (
        reuse(tm, tn)
        * wave_eff(shape, tm, tn, sk)
        * tile_waste(shape, tm, tn)
        * kloop(shape.k, tk, sk)
        * split_cost
        * pref
        * jitter
    )


# -- the hidden optimum -------------------------------------------------------------------------------


def max_stages(tm: int, tn: int, tk: int, a_bytes: int) -> int:
    return SMEM_LIMIT_BYTES // ((tm + tn) * tk * a_bytes)


def _warp_layout(space: dict[str, list[int]], tm: int, tn: int, salt: str) -> tuple[int, int]:
    best: tuple[float, int, int] | None = None
    for wm in space["WARPS_M"]:
        for wn in space["WARPS_N"]:
            layout = {"TILE_M": tm, "TILE_N": tn, "WARPS_M": wm, "WARPS_N": wn}
            if wm * wn < 4 or tn // wn < MMA_FRAG_N or spill_factor(layout) < 1.0:
                continue
            off = abs(math.log2(tm / wm) - 6) + abs(math.log2(tn / wn) - 6) + unit(salt, "warps", wm, wn)
            if best is None or off < best[0]:
                best = (off, wm, wn)
    if best is None:
        raise ValueError(f"no valid warp layout for a {tm}x{tn} tile")
    return best[1], best[2]


def _best_tile(shape: Shape, space: dict[str, list[int]], a_bytes: int, salt: str) -> dict[str, int]:
    best: tuple[float, dict[str, int]] | None = None
    for tm in space["TILE_M"]:
        for tn in space["TILE_N"]:
            for tk in space["TILE_K"]:
                if max_stages(tm, tn, tk, a_bytes) < 3:
                    continue
                for sk in space["SPLIT_K"]:
                    if shape.k % sk or (shape.k // sk) % tk:
                        continue
                    knobs = {"TILE_M": tm, "TILE_N": tn, "TILE_K": tk, "SPLIT_K": sk}
                    score = tile_score(shape, a_bytes, knobs, salt)
                    if best is None or score > best[0]:
                        best = (score, knobs)
    if best is None:
        raise ValueError(f"no tile fits {shape.key}")
    return best[1]


def _stages(shape: Shape, tile: dict[str, int], a_bytes: int, salt: str) -> int:
    iters = shape.k / (tile["TILE_K"] * tile["SPLIT_K"])
    base = 3 if iters < 8 else 4 if iters < 64 else 5
    base += pick([-1, 0, 0, 0, 1], salt, "stages")
    return max(3, min(base, max_stages(tile["TILE_M"], tile["TILE_N"], tile["TILE_K"], a_bytes), 6))


def optimum(shape: Shape, space: dict[str, list[int]], a_bytes: int, salt: str) -> dict[str, int]:
    """The hidden best knob set for this shape on this GPU type."""
    opt = _best_tile(shape, space, a_bytes, salt)
    tm, tn = opt["TILE_M"], opt["TILE_N"]
    opt["STAGES"] = _stages(shape, opt, a_bytes, salt)
    opt["WARPS_M"], opt["WARPS_N"] = _warp_layout(space, tm, tn, salt)
    gm, gn = grid(shape, tm, tn)
    flip = unit(salt, "raster") < 0.15
    opt["RASTER"] = int((gn > gm) != flip)
    tiles = gm * gn * opt["SPLIT_K"]
    swizzles = [4, 8] if tiles >= 2 * NUM_SMS else [2, 4] if tiles >= NUM_SMS // 2 else [1, 2]
    opt["SWIZZLE"] = pick(swizzles, salt, "swizzle")
    opt["EPI_VEC"] = 4 if opt["SPLIT_K"] > 1 else pick([8, 8, 8, 4], salt, "epi")
    return opt


# -- the per-shape model and its prediction -----------------------------------------------------------


@dataclass(frozen=True)
class ShapeModel:
    """Everything hidden about one (gpu type, shape): its ceiling, optimum and knob sensitivities."""

    shape: Shape
    a_bytes: int
    space: dict[str, list[int]]
    salt: str
    peak_tflops: float
    ceiling_tflops: float
    memory_bound: bool
    optimum: dict[str, int]
    weights: dict[str, float]


@dataclass(frozen=True)
class Prediction:
    tflops: float
    time_us: float
    efficiency: float
    launch_fraction: float
    factors: dict[str, float]


def ceiling_tflops(shape: Shape, a_bytes: int, c_bytes: int, peak: float, mem_gbps: float) -> float:
    """Roofline: min(peak, flops/byte x GB/s), with A, B and C each moved once."""
    moved = (shape.m * shape.k + shape.k * shape.n) * a_bytes + shape.m * shape.n * c_bytes
    return min(peak, shape.flops / moved * mem_gbps / 1000.0)


def _weights(shape: Shape, opt: dict[str, int], salt: str) -> dict[str, float]:
    gm, gn = grid(shape, opt["TILE_M"], opt["TILE_N"])
    big = min(1.0, gm * gn * opt["SPLIT_K"] / (4 * NUM_SMS))

    def jit(name: str) -> float:
        return 0.8 + 0.4 * unit(salt, "weight", name)

    return {
        "stages": 0.06 * jit("stages"),
        "warps": 0.012 * jit("warps"),
        "raster": (0.01 + 0.035 * big) * jit("raster"),
        "swizzle": (0.03 + 0.07 * big) * jit("swizzle"),
        "epilogue": 0.025 * (1.0 + min(3.0, 4096 / shape.k)) / 2.0 * jit("epilogue"),
    }


def build_model(
    shape: Shape,
    space: dict[str, list[int]],
    *,
    a_bytes: int,
    c_bytes: int,
    gpu_type: str,
    peak: float,
    mem_gbps: float,
) -> ShapeModel:
    salt = f"{gpu_type}|{shape.key}"
    ceiling = ceiling_tflops(shape, a_bytes, c_bytes, peak * PATH_FRACTION, mem_gbps)
    opt = optimum(shape, space, a_bytes, salt)
    return ShapeModel(
        shape=shape,
        a_bytes=a_bytes,
        space=space,
        salt=salt,
        peak_tflops=peak,
        ceiling_tflops=ceiling,
        memory_bound=ceiling < peak * PATH_FRACTION,
        optimum=opt,
        weights=_weights(shape, opt, salt),
    )


def _steps(model: ShapeModel, knobs: dict[str, int], name: str) -> int:
    values = model.space[name]
    return values.index(knobs[name]) - values.index(model.optimum[name])


def _stages_factor(model: ShapeModel, knobs: dict[str, int]) -> float:
    d, w = _steps(model, knobs, "STAGES"), model.weights["stages"]
    loss = w * -d + 0.04 * d * d if d < 0 else 0.3 * w * d
    return max(0.05, 1.0 - loss)


def _warps_factor(model: ShapeModel, knobs: dict[str, int]) -> float:
    opt = model.optimum
    occ_c = WARP_OCCUPANCY.get(knobs["WARPS_M"] * knobs["WARPS_N"], 0.9)
    occ_o = WARP_OCCUPANCY.get(opt["WARPS_M"] * opt["WARPS_N"], 0.9)
    dist = abs(math.log2(knobs["WARPS_M"] / opt["WARPS_M"])) + abs(
        math.log2(knobs["WARPS_N"] / opt["WARPS_N"])
    )
    return min(1.0, occ_c / occ_o) * max(0.05, 1.0 - model.weights["warps"] * dist) * spill_factor(knobs)


def factors(model: ShapeModel, knobs: dict[str, int]) -> dict[str, float]:
    """Each factor is in (0, 1]; the tile factor is absolute (the optimum's is ~0.8 on large shapes)."""
    w = model.weights
    return {
        "tile": EFF_SCALE * tile_score(model.shape, model.a_bytes, knobs, model.salt),
        "stages": _stages_factor(model, knobs),
        "warps": _warps_factor(model, knobs),
        "raster": 1.0 - w["raster"] * abs(_steps(model, knobs, "RASTER")),
        "swizzle": 1.0 - w["swizzle"] * SWIZZLE_LOSS[min(3, abs(_steps(model, knobs, "SWIZZLE")))],
        "epilogue": 1.0 - w["epilogue"] * abs(_steps(model, knobs, "EPI_VEC")),
    }


def predict(model: ShapeModel, knobs: dict[str, int]) -> Prediction:
    """The noise-free TFLOPS of this knob set on this shape."""
    parts = factors(model, knobs)
    eff = min(EFF_CAP, math.prod(parts.values()))
    main_us = model.shape.flops / (model.ceiling_tflops * eff * 1e6)
    time_us = main_us + LAUNCH_US
    return Prediction(
        tflops=model.shape.flops / (time_us * 1e6),
        time_us=time_us,
        efficiency=eff,
        launch_fraction=LAUNCH_US / time_us,
        factors=parts,
    )


# -- profiling ----------------------------------------------------------------------------------------


def _rel(value: float, best: float) -> float:
    return min(1.0, value / best) if best > 0 else 1.0


def loss_groups(model: ShapeModel, knobs: dict[str, int]) -> dict[str, float]:
    """Fraction of the optimum's throughput lost, grouped the way a profiler would attribute it."""
    s, opt = model.shape, model.optimum
    part = factors(model, knobs)
    pref = TILE_K_PREF.get(model.a_bytes, TILE_K_PREF[2])
    memory = (
        _rel(reuse(knobs["TILE_M"], knobs["TILE_N"]), reuse(opt["TILE_M"], opt["TILE_N"]))
        * _rel(tile_waste(s, knobs["TILE_M"], knobs["TILE_N"]), tile_waste(s, opt["TILE_M"], opt["TILE_N"]))
        * part["swizzle"]
        * part["raster"]
    )
    latency = (
        part["stages"]
        * _rel(
            wave_eff(s, knobs["TILE_M"], knobs["TILE_N"], knobs["SPLIT_K"]),
            wave_eff(s, opt["TILE_M"], opt["TILE_N"], opt["SPLIT_K"]),
        )
        * _rel(kloop(s.k, knobs["TILE_K"], knobs["SPLIT_K"]), kloop(s.k, opt["TILE_K"], opt["SPLIT_K"]))
    )
    compute = (
        part["warps"] * part["epilogue"] * _rel(pref.get(knobs["TILE_K"], 0.9), pref.get(opt["TILE_K"], 0.9))
    )
    return {"memory": 1.0 - memory, "latency": 1.0 - latency, "compute": 1.0 - compute}


def classify(model: ShapeModel, losses: dict[str, float], pred: Prediction) -> Bottleneck:
    """launch when fixed overhead dominates, else the group losing most (ties: memory, then latency; at the
    optimum: the roofline's side). Every family model's bottleneck."""
    if pred.launch_fraction > 0.3:
        return "launch"
    if max(losses.values()) < 0.03:
        return "memory" if model.memory_bound else "compute"
    return max(("memory", "latency", "compute"), key=lambda group: losses[group])


def bottleneck(model: ShapeModel, knobs: dict[str, int], pred: Prediction) -> Bottleneck:
    return classify(model, loss_groups(model, knobs), pred)


def profile_metrics(
    model: ShapeModel, knobs: dict[str, int], pred: Prediction, mem_gbps: float
) -> dict[str, float]:
    """ncu-like section values consistent with the prediction."""
    s = model.shape
    gm, gn = grid(s, knobs["TILE_M"], knobs["TILE_N"])
    ctas_per_sm = 2 if knobs["TILE_M"] * knobs["TILE_N"] <= 8192 else 1
    warps = knobs["WARPS_M"] * knobs["WARPS_N"]
    moved = (s.m * s.k * gn + s.k * s.n * gm) * model.a_bytes / 8 + s.m * s.n * 2  # L2-filtered traffic
    dram_pct = min(98.0, 100.0 * moved / (pred.time_us * 1e-6) / (mem_gbps * 1e9))
    return {
        "duration_us": round(pred.time_us, 3),
        "sm_throughput_pct": round(100.0 * pred.tflops / model.peak_tflops, 2),
        "tensor_pipe_active_pct": round(
            100.0 * pred.efficiency * model.ceiling_tflops / model.peak_tflops, 2
        ),
        "dram_throughput_pct": round(dram_pct, 2),
        "l2_hit_rate_pct": round(40.0 + 50.0 * factors(model, knobs)["swizzle"] ** 4, 2),
        "achieved_occupancy_pct": round(min(100.0, 100.0 * warps * ctas_per_sm / 64), 2),
        "registers_per_thread": float(min(MAX_REGS, acc_regs(knobs) + REG_OVERHEAD)),
        "smem_per_block_kib": round(smem_bytes(knobs, model.a_bytes) / 1024, 1),
        "waves_per_sm": round(gm * gn * knobs["SPLIT_K"] / (NUM_SMS * ctas_per_sm), 3),
        "launch_overhead_pct": round(100.0 * pred.launch_fraction, 2),
    }
