"""The simulated GPU's model of the ``cutlass`` family: CUTLASS 3.x's sm90 warp-specialized GEMM (TMA,
WGMMA, thread-block clusters, a persistent or stream-K tile scheduler), one knob set on one shape.

Pure and deterministic like :mod:`croqq.backends._simmodel`, whose roofline, tile reuse, tile waste and
main-loop terms it shares, with the effects a CUTLASS user tunes:

- **wave quantization** over the persistent grid: the SMs a cluster shape can occupy (132 SMs hold 33
  clusters of 4 but 16 of 8, leaving 4 SMs idle) and the tiles (times the split-K splits) in waves of them;
  the stream-K scheduler spreads a partial last wave (or a grid of fewer tiles than SMs) over every SM at
  the price of its fix-up of split tiles;
- **tile efficiency at the problem's edges**, and the grid rounded up to whole clusters;
- **one pipeline fill per persistent CTA**: the producer warp loads the next tile's first stages while
  the consumers finish the last one, so a short K costs the fill once per SM, not once per tile (the
  epilogue still costs, see ping-pong);
- **cluster multicast**: one TMA load feeds the CTAs of a cluster row or column, so the operand traffic
  from L2 falls with the cluster size (most for shapes that are not already compute-bound), with
  diminishing returns, while clusters beyond 2 CTAs pay for their barriers and harder placement;
- **stages vs shared memory**: ``STAGES=0`` takes as many as fit beside the epilogue's staging; fewer than
  four leave the tensor cores waiting on TMA;
- **the epilogue**: the TMA store (``EPILOGUE=0``) stages C through shared memory; direct stores from the
  accumulators (``EPILOGUE=1``) free that memory for stages but cost where the epilogue is a large share
  of a tile's time (a short main loop);
- **split-K / stream-K** helping shapes with few output tiles and a long K, at a reduction cost;
- **ping-pong vs cooperative**: ping-pong overlaps one warpgroup's epilogue with the other's main loop
  (worth most when the main loop is short), cooperative puts both warpgroups on one larger tile (more
  math per byte of shared memory and per register);
- **raster order and swizzle** for L2 locality on large grids;
- **FP8 fast accumulation** (e4m3): 1.25x the precise mainloop, as on an H200 (1352-1368 vs 1073 TFLOPS on
  8192^3), and, as there, outside croqq's e4m3 tolerance: :func:`known_fault` makes it a wrong answer.

The hidden optimum maximizes the prediction knob group by knob group over the combinations the family's
rules allow (:func:`runnable`); its efficiency on a large f16 shape is about 0.80 of the roofline, where
cuBLAS is on an H100. Every factor is in (0, 1], so the predicted TFLOPS never exceed the dense peak.
"""

from __future__ import annotations

import math
from dataclasses import replace

from croqq.backends import _simmodel as base
from croqq.domain.records import Bottleneck, Outcome
from croqq.domain.shapes import Shape

KNOBS = (
    "TILE_M",
    "TILE_N",
    "TILE_K",
    "CLUSTER_M",
    "CLUSTER_N",
    "STAGES",
    "SCHEDULE",
    "EPILOGUE",
    "FAST_ACCUM",
    "SCHEDULER",
    "RASTER",
    "SWIZZLE",
    "SPLITS",
)
SMEM_BYTES = 232448  # 227 KiB per CTA
EPILOGUE_SMEM = 32768  # the TMA epilogue's staging, at most (EPILOGUE 1, direct stores, stages nothing)
DIRECT_STORE_COST = 0.5  # direct stores from the accumulators: strided, and not overlapped as a TMA store
EFF_SCALE = 2.6  # maps the best tile term of a large shape to ~0.8 of the roofline with the rest at 1
FAST_ACCUM_GAIN = 1.25
K_PREF = {1: {32: 0.80, 64: 0.90, 128: 1.0}, 2: {32: 0.85, 64: 1.0, 128: 0.97}}  # by operand bytes
GROUPS = (  # the optimum is searched group by group, in this order, twice
    ("TILE_M", "TILE_N", "TILE_K", "SCHEDULE", "SCHEDULER", "SPLITS"),
    ("CLUSTER_M", "CLUSTER_N"),
    ("STAGES", "EPILOGUE"),
    ("RASTER", "SWIZZLE"),
)


def runnable(knobs: dict[str, int], shape: Shape, a_bytes: int) -> bool:
    """What the family's rules (kernels/manifest.json) allow, and no fast accumulation (a wrong answer)."""
    tm, tn, tk = knobs["TILE_M"], knobs["TILE_N"], knobs["TILE_K"]
    coop = knobs["SCHEDULE"] == 0
    return (
        (not coop or tm >= 128)
        and tk * a_bytes % 128 == 0
        and shape.k % tk == 0
        and knobs["FAST_ACCUM"] == 0
        and knobs["CLUSTER_M"] * knobs["CLUSTER_N"] <= 8
        and (knobs["SPLITS"] == 1 or knobs["SCHEDULER"] == 1)
        and (knobs["SCHEDULER"] == 0 or coop)
        and tm * tn <= (32768 if coop else 16384)
        and max(knobs["STAGES"], 2) * (tm + tn) * tk * a_bytes + epilogue_smem(knobs) <= SMEM_BYTES
    )


def epilogue_smem(knobs: dict[str, int]) -> int:
    return EPILOGUE_SMEM if knobs["EPILOGUE"] == 0 else 0


def stages(knobs: dict[str, int], a_bytes: int) -> int:
    """The main loop's stages: ``STAGES``, or (0) as many as fit beside the epilogue's staging."""
    per_stage = (knobs["TILE_M"] + knobs["TILE_N"]) * knobs["TILE_K"] * a_bytes
    return knobs["STAGES"] or max(1, (SMEM_BYTES - epilogue_smem(knobs)) // per_stage)


def compile_error(shape: Shape, knobs: dict[str, int], a_bytes: int) -> str | None:
    """Nothing beyond the family's rules, which the backend checks first (a knob candidate that breaks one
    is an attempt without a compile)."""
    del shape, knobs, a_bytes
    return None


def known_fault(knobs: dict[str, int], a_bytes: int) -> Outcome | None:
    """FP8 fast accumulation fails croqq's e4m3 tolerance on real GPUs (see the module docstring)."""
    return "wrong_answer" if knobs["FAST_ACCUM"] and a_bytes == 1 else None


def _grid(shape: Shape, knobs: dict[str, int]) -> tuple[int, int, int]:
    """The tiles, the grid rounded up to whole clusters, and the SMs that whole clusters occupy."""
    gm, gn = base.grid(shape, knobs["TILE_M"], knobs["TILE_N"])
    cm, cn = knobs["CLUSTER_M"], knobs["CLUSTER_N"]
    padded = math.ceil(gm / cm) * cm * math.ceil(gn / cn) * cn
    return gm * gn, padded, base.NUM_SMS // (cm * cn) * (cm * cn)


def _waves(shape: Shape, knobs: dict[str, int]) -> float:
    tiles, padded, usable = _grid(shape, knobs)
    waves = padded * knobs["SPLITS"] / usable
    quantized = waves / math.ceil(waves) if waves >= 1.0 else math.sqrt(waves)
    if knobs["SCHEDULER"] == 1 and knobs["SPLITS"] == 1:  # stream-K: every SM busy, a fix-up per split tile
        quantized = 0.96 if waves >= 1.0 else 0.96 * min(1.0, 0.55 + 0.45 * math.sqrt(waves))
    return quantized * tiles / padded * usable / base.NUM_SMS


def factors(model: base.ShapeModel, knobs: dict[str, int]) -> dict[str, float]:
    """Each factor in (0, 1]; ``tile`` is absolute (the optimum's ~0.8 on large shapes)."""
    s, a_bytes = model.shape, model.a_bytes
    tm, tn, tk, splits = knobs["TILE_M"], knobs["TILE_N"], knobs["TILE_K"], knobs["SPLITS"]
    jitter = 1.0 + 0.02 * (base.unit(model.salt, "cutlass-tile", tm, tn, tk) - 0.5)
    _, padded, usable = _grid(s, knobs)
    per_sm = max(1.0, padded * splits / usable)  # the producer runs ahead across its tiles: one fill
    tile = (
        base.reuse(tm, tn)
        * base.tile_waste(s, tm, tn)
        * base.kloop(s.k * per_sm, tk, splits)
        * K_PREF.get(a_bytes, K_PREF[2]).get(tk, 0.9)
        / (1.0 + 0.05 * (splits - 1))
        * jitter
    )
    cluster = knobs["CLUSTER_M"] * knobs["CLUSTER_N"]
    pressure = 0.05 if model.memory_bound else 0.025  # multicast saves most where bytes bind
    sync = 0.02 * max(0.0, math.log2(cluster) - 1.0)  # beyond 2 CTAs: the cluster's barriers and launch
    multicast = 1.0 + pressure * math.sqrt(math.log2(cluster)) - sync
    iters = max(1.0, s.k / (tk * splits))
    epilogue = 1.0 / (iters + 1.0)
    schedule = (
        1.0 - 0.7 * epilogue if knobs["SCHEDULE"] == 0 else 1.0 - 0.2 * epilogue - 0.035 * (tm * tn >= 16384)
    )
    depth = stages(knobs, a_bytes)
    gm, gn = base.grid(s, tm, tn)
    big = min(1.0, gm * gn / (4 * base.NUM_SMS))
    long_side = 1 if gm >= gn else 2  # along M walks down a column of tiles, sharing B panels
    raster = {0: 0.995, long_side: 1.0}.get(knobs["RASTER"], 1.0 - 0.04 * big)
    best_swizzle = 8 if big >= 1.0 else 4 if big >= 0.25 else 1
    swizzle = 1.0 - (0.01 + 0.05 * big) * abs(math.log2(knobs["SWIZZLE"] / best_swizzle)) / 3.0
    return {
        "tile": min(1.0, EFF_SCALE * tile * multicast),
        "waves": _waves(s, knobs),
        "stages": 1.0 if depth >= 4 else 0.96 if depth == 3 else max(0.3, 0.96 - 0.25 * (3 - depth)),
        "schedule": schedule,
        "raster": raster,
        "swizzle": swizzle,
        "epilogue": 1.0 - DIRECT_STORE_COST * epilogue if knobs["EPILOGUE"] == 1 else 1.0,
    }


def predict(model: base.ShapeModel, knobs: dict[str, int]) -> base.Prediction:
    """The noise-free TFLOPS of this knob set on this shape."""
    parts = factors(model, knobs)
    eff = min(base.EFF_CAP, math.prod(parts.values()))
    if knobs["FAST_ACCUM"] and model.a_bytes == 1:
        eff = min(base.EFF_CAP, eff * FAST_ACCUM_GAIN)
    time_us = model.shape.flops / (model.ceiling_tflops * eff * 1e6) + base.LAUNCH_US
    return base.Prediction(
        tflops=model.shape.flops / (time_us * 1e6),
        time_us=time_us,
        efficiency=eff,
        launch_fraction=base.LAUNCH_US / time_us,
        factors=parts,
    )


def optimum(model: base.ShapeModel) -> dict[str, int]:
    """The best runnable knob set, searched group by group (each group's values jointly, twice)."""
    space, s, a_bytes = model.space, model.shape, model.a_bytes
    best = {name: values[0] for name, values in space.items()} | {
        "TILE_M": 128,
        "TILE_N": 128,
        "TILE_K": 128 // a_bytes,
        "SCHEDULE": 0,
        "STAGES": 0,
        "SCHEDULER": 0,
        "SPLITS": 1,
        "FAST_ACCUM": 0,
    }
    for _ in range(2):
        for group in GROUPS:
            combos: list[dict[str, int]] = [{}]
            for name in group:
                combos = [c | {name: v} for c in combos for v in space[name]]
            scored = [
                (predict(model, knobs).tflops, knobs)
                for knobs in (best | c for c in combos)
                if runnable(knobs, s, a_bytes)
            ]
            if scored:
                best = max(scored, key=lambda pair: pair[0])[1]
    return best


def build_model(
    shape: Shape,
    space: dict[str, list[int]],
    *,
    a_bytes: int,
    c_bytes: int,
    gpu_type: str,
    peak: float,
    mem_gbps: float,
) -> base.ShapeModel:
    ceiling = base.ceiling_tflops(shape, a_bytes, c_bytes, peak, mem_gbps)
    model = base.ShapeModel(
        shape=shape,
        a_bytes=a_bytes,
        space=space,
        salt=f"{gpu_type}|{shape.key}",
        peak_tflops=peak,
        ceiling_tflops=ceiling,
        memory_bound=ceiling < peak,
        optimum={},
        weights={},
    )
    return replace(model, optimum=optimum(model))


def loss_groups(model: base.ShapeModel, knobs: dict[str, int]) -> dict[str, float]:
    """Fraction of the optimum's throughput lost, grouped the way a profiler would attribute it."""
    now, best = factors(model, knobs), factors(model, model.optimum)

    def kept(*names: str) -> float:
        return math.prod(min(1.0, now[n] / best[n]) for n in names)

    return {
        "memory": 1.0 - kept("tile", "raster", "swizzle", "epilogue"),
        "latency": 1.0 - kept("waves", "stages"),
        "compute": 1.0 - kept("schedule"),
    }


def bottleneck(model: base.ShapeModel, knobs: dict[str, int], pred: base.Prediction) -> Bottleneck:
    return base.classify(model, loss_groups(model, knobs), pred)


def profile_metrics(
    model: base.ShapeModel, knobs: dict[str, int], pred: base.Prediction, mem_gbps: float
) -> dict[str, float]:
    """ncu-like section values consistent with the prediction (the cuda model's names)."""
    s = model.shape
    gm, gn = base.grid(s, knobs["TILE_M"], knobs["TILE_N"])
    cm, cn = knobs["CLUSTER_M"], knobs["CLUSTER_N"]
    moved = (s.m * s.k * gn / cn + s.k * s.n * gm / cm) * model.a_bytes / 8 + s.m * s.n * 2  # L2-filtered
    dram_pct = min(98.0, 100.0 * moved / (pred.time_us * 1e-6) / (mem_gbps * 1e9))
    consumers = 2  # two consumer warpgroups and a producer, whatever the schedule
    acc = knobs["TILE_M"] * knobs["TILE_N"] // (128 * consumers if knobs["SCHEDULE"] == 0 else 128)
    return {
        "duration_us": round(pred.time_us, 3),
        "sm_throughput_pct": round(100.0 * pred.tflops / model.peak_tflops, 2),
        "tensor_pipe_active_pct": round(
            100.0 * pred.efficiency * model.ceiling_tflops / model.peak_tflops, 2
        ),
        "dram_throughput_pct": round(dram_pct, 2),
        "l2_hit_rate_pct": round(40.0 + 50.0 * pred.factors["swizzle"] ** 4, 2),
        "achieved_occupancy_pct": round(100.0 * 12 / 64, 2),  # 3 warpgroups, one CTA per SM
        "registers_per_thread": float(min(base.MAX_REGS, acc + base.REG_OVERHEAD)),
        "smem_per_block_kib": round(
            (
                stages(knobs, model.a_bytes)
                * (knobs["TILE_M"] + knobs["TILE_N"])
                * knobs["TILE_K"]
                * model.a_bytes
                + epilogue_smem(knobs)
            )
            / 1024,
            1,
        ),
        "waves_per_sm": round(gm * gn * knobs["SPLITS"] / base.NUM_SMS, 3),
        "launch_overhead_pct": round(100.0 * pred.launch_fraction, 2),
    }
