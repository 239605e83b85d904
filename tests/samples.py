"""Realistic StoreRequests for benchmarks and tests: what the coordinator would send the writer.

``sample_requests`` plays a plausible tuning history per key (baseline, then KEEP/DISCARD/FAIL with
confirmations, profiles at the FSM's moments, occasional compile-failed attempts) and yields the STORE
requests in iteration order per key, keys interleaved round-robin. The same seed gives the same requests.
Sources are ~1 KB, timing outputs ~2 KB, as in a real run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from croqq.domain.records import (
    Confirmation,
    GpuSnapshot,
    Idea,
    Measurement,
    MeasureResult,
    Profile,
    Strategy,
)
from croqq.domain.shapes import parse_key
from croqq.store import paths
from croqq.store.schema import AttemptRecord, Checkpoint, RoundRecord, StoreRequest, state_entry

FAMILY = "gemm"
EXTS = {"cuda": "cu", "triton": "py", "croqtile": "cq"}
PEAK_TFLOPS = 989.4
KNOBS = {
    "TILE_M": [64, 128, 256],
    "TILE_N": [64, 128, 256],
    "TILE_K": [32, 64, 128],
    "STAGES": [2, 3, 4, 5],
    "WARPS_M": [1, 2, 4],
    "WARPS_N": [1, 2, 4],
    "SPLIT_K": [1, 2, 4],
    "EPI_VEC": [1, 2, 4, 8],
}
SEED_KNOBS = {
    "TILE_M": 128,
    "TILE_N": 128,
    "TILE_K": 64,
    "STAGES": 4,
    "WARPS_M": 2,
    "WARPS_N": 2,
    "SPLIT_K": 1,
    "EPI_VEC": 4,
}
_EPOCH0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


@dataclass
class _Shape:
    """One key's simulated loop (the fields a checkpoint needs)."""

    key: str
    current_iter: int = -1
    best_iter: int = -1
    best_tflops: float = 0.0
    baseline: float = 0.0
    best_knobs: dict[str, int] = field(default_factory=lambda: dict(SEED_KNOBS))
    best_source: str = ""
    best_kernel: str = ""
    discards: int = 0
    attempts: int = 0
    keeps: int = 0
    fails: int = 0
    profile: Profile | None = None
    profile_due: bool = False


def sample_headers(key: str) -> dict[str, str]:
    """The header closure of a sample source: a small stand-in for the family header it includes."""
    dtype = parse_key(key).dtype
    return {f"gemm_{dtype}.cuh": f"// sample {dtype} family header\n#pragma once\n#define CROQQ_SAMPLE 1\n"}


def source_text(key: str, dsl: str, knobs: dict[str, int]) -> str:
    """A plausible ~1 KB candidate source for these knobs."""
    shape = parse_key(key)
    lines = [
        f"// croqq candidate for {key} ({dsl})",
        f"#define GEMM_M {shape.m}",
        f"#define GEMM_N {shape.n}",
        f"#define GEMM_K {shape.k}",
    ]
    lines += [f"#define {name} {value}" for name, value in sorted(knobs.items())]
    lines.append(f'#include "gemm_{shape.dtype}.cuh"')
    body = [
        "",
        "// Tiled GEMM: each CTA computes a TILE_M x TILE_N block of C, streaming TILE_K slices of A and B",
        "// through a STAGES-deep shared-memory pipeline (cp.async), WARPS_M x WARPS_N warps per CTA.",
        'extern "C" __global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)',
        "croqq_gemm(const ElementA* __restrict__ a, const ElementB* __restrict__ b,",
        "           ElementC* __restrict__ c) {",
        "  extern __shared__ char smem[];",
        "  GemmTile<TILE_M, TILE_N, TILE_K, STAGES, WARPS_M, WARPS_N> tile(smem);",
        "  const int k_tiles = (GEMM_K / SPLIT_K + TILE_K - 1) / TILE_K;",
        "  tile.prologue(a, b, blockIdx.x, blockIdx.y, blockIdx.z * k_tiles);",
        "  for (int kt = 0; kt < k_tiles; ++kt) {",
        "    tile.wait_stage(kt);",
        "    tile.mma_stage(kt);",
        "    tile.issue_stage(kt + STAGES - 1);",
        "  }",
        "  tile.epilogue<EPI_VEC>(c, blockIdx.x, blockIdx.y, SPLIT_K > 1);",
        "}",
    ]
    return "\n".join(lines + body) + "\n"


def _timing_raw(rng: random.Random, median_ms: float, repeats: int) -> str:
    rows = [
        f"repeat {i:02d}: {median_ms * rng.uniform(0.985, 1.02):.5f} ms (l2 flushed, inputs rotated)"
        for i in range(repeats)
    ]
    return "warmup: 10 runs\n" + "\n".join(rows) + "\n"


def _snapshot(rng: random.Random, hot: bool) -> GpuSnapshot:
    return GpuSnapshot(
        sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        temp_c=rng.randint(60, 70) if hot else 42,
        power_w=round(rng.uniform(350, 650) if hot else 90.0, 1),
        throttle_reasons=[],
    )


@dataclass(frozen=True)
class _Outcome:
    decision: str
    outcome: str
    tflops: float


def _measure(rng: random.Random, key: str, out: _Outcome, best: float) -> MeasureResult:
    tflops, outcome, keep = out.tflops, out.outcome, out.decision == "KEEP"
    shape = parse_key(key)
    median = 2.0 * shape.m * shape.n * shape.k / (max(tflops, 1.0) * 1e9)
    cand = Measurement(
        outcome=outcome,
        tflops=tflops if outcome == "ok" else 0.0,
        hw_eff_pct=round(100.0 * tflops / PEAK_TFLOPS, 3) if outcome == "ok" else 0.0,
        median_ms=median,
        min_ms=median * 0.99,
        max_ms=median * 1.02,
        repeats=50,
        verified=outcome == "ok",
        detail="" if outcome == "ok" else f"{outcome} during the verification run",
        start=_snapshot(rng, False),
        end=_snapshot(rng, True),
        raw=_timing_raw(rng, median, 50),
    )
    conf = Confirmation(candidate_tflops=tflops, best_tflops=best, rounds=3) if keep else None
    return MeasureResult(candidate=cand, confirmation=conf, gpu_uuid="GPU-00000000-sample")


def _idea(
    rng: random.Random, key: str, dsl: str, base: dict[str, int], strategy: Strategy
) -> tuple[Idea, str]:
    knobs = dict(base)
    for name in rng.sample(sorted(KNOBS), 2 if strategy == "refine" else 4):
        knobs[name] = rng.choice(KNOBS[name])
    changed = [f"{k.lower().replace('_', '')}{v}" for k, v in sorted(knobs.items()) if base.get(k) != v]
    tag = "-".join(changed)[:40].strip("-") or "reshuffle"
    source = source_text(key, dsl, knobs)
    diff = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()) if base.get(k) != v)
    summary = f"set {diff}" if diff else "rerun the best knobs"
    digest = hashlib.sha256(source.encode()).hexdigest()
    return Idea(summary=summary[:300], tag=tag, knobs=knobs, content_hash=digest, strategy=strategy), source


def _strategy(discards: int) -> Strategy:
    return "radical" if discards >= 10 else "escalate" if discards >= 5 else "refine"


@dataclass
class _Ctx:
    gpu: str
    dsl: str
    max_iter: int
    rng: random.Random
    step: int = 0

    @property
    def run(self) -> paths.RunPaths:
        return paths.RunPaths(self.gpu, self.dsl)

    @property
    def ext(self) -> str:
        return EXTS.get(self.dsl, "txt")

    def stamp(self) -> str:
        self.step += 1
        return (_EPOCH0 + dt.timedelta(seconds=37 * self.step)).isoformat(timespec="seconds")


def _checkpoint(ctx: _Ctx, sh: _Shape) -> Checkpoint:
    shape = parse_key(sh.key)
    status = "done" if sh.current_iter >= ctx.max_iter else "active"
    return Checkpoint(
        key=sh.key,
        dtype=shape.dtype,
        m=shape.m,
        n=shape.n,
        k=shape.k,
        mode="from_current_best",
        max_iter=ctx.max_iter,
        current_iter=sh.current_iter,
        best_iter=sh.best_iter,
        best_tflops=sh.best_tflops,
        baseline_tflops=sh.baseline,
        best_kernel=sh.best_kernel,
        best_knobs=sh.best_knobs,
        seed_knobs=SEED_KNOBS,
        consecutive_discards=sh.discards,
        attempts=sh.attempts,
        keeps=sh.keeps,
        fails=sh.fails,
        status=status,
        scenarios=["square"],
        region="far",
        last_updated=ctx.stamp(),
    )


def _request(ctx: _Ctx, sh: _Shape, step_id: str, **kind: object) -> StoreRequest:
    ckpt = _checkpoint(ctx, sh)
    state = state_entry(ckpt)
    return StoreRequest(
        gpu=ctx.gpu,
        dsl=ctx.dsl,
        key=sh.key,
        family=FAMILY,
        ext=ctx.ext,
        epoch=1,
        step_id=step_id,
        checkpoint=ckpt,
        state=state,
        **kind,
    )


def _attempt(ctx: _Ctx, sh: _Shape) -> StoreRequest:
    idea, _ = _idea(ctx.rng, sh.key, ctx.dsl, sh.best_knobs, _strategy(sh.discards))
    sh.attempts += 1
    step_id = f"{sh.key}-a{sh.attempts}"
    att = AttemptRecord(
        key=sh.key,
        attempt_no=sh.attempts,
        after_iter=sh.current_iter,
        idea=idea,
        reason="nvcc: too much shared data (0x30000 bytes, 0xc000 max)",
        log="ptxas error   : Entry function 'croqq_gemm' uses too much shared data\n" * 6,
        epoch=1,
        step_id=step_id,
        timestamp=ctx.stamp(),
    )
    return _request(ctx, sh, step_id, kind="attempt", attempt=att)


def _outcome(ctx: _Ctx, sh: _Shape) -> _Outcome:
    """Decision, outcome and TFLOPS of the next measured iteration."""
    rng = ctx.rng
    if sh.current_iter < 0:
        return _Outcome("BASELINE", "ok", round(rng.uniform(150.0, 650.0), 3))
    draw = rng.random()
    if draw < 0.05:
        outcome = rng.choice(["wrong_answer", "crash", "hang"])
        return _Outcome(f"FAIL_{outcome}", outcome, 0.0)
    if draw < 0.20:
        return _Outcome("KEEP", "ok", round(sh.best_tflops * rng.uniform(1.02, 1.08), 3))
    return _Outcome("DISCARD", "ok", round(sh.best_tflops * rng.uniform(0.6, 1.01), 3))


def _profile(ctx: _Ctx, it: int) -> Profile:
    rng = ctx.rng
    metrics = {
        "sm_throughput_pct": round(rng.uniform(40, 95), 1),
        "dram_throughput_pct": round(rng.uniform(20, 90), 1),
        "achieved_occupancy_pct": round(rng.uniform(10, 60), 1),
    }
    raw = "".join(
        f"section {i}: {name} = {value}\n" for i, (name, value) in enumerate(sorted(metrics.items()))
    )
    return Profile(
        bottleneck=rng.choice(["memory", "compute", "latency"]),
        metrics=metrics,
        raw=raw * 8 + f"profiled before iteration {it}\n",
    )


def _advance(sh: _Shape, out: _Outcome, idea: Idea | None, kernel: str, src: str) -> None:
    decision, tflops = out.decision, out.tflops
    sh.current_iter += 1
    keep = decision == "KEEP"
    if sh.current_iter == 0:
        sh.best_iter, sh.best_tflops, sh.baseline = 0, tflops, tflops
        sh.best_kernel, sh.best_source = kernel, src
        sh.profile_due = True
        return
    sh.discards = 0 if keep else sh.discards + 1
    sh.keeps += int(keep)
    sh.fails += int(decision.startswith("FAIL_"))
    if keep and idea is not None:
        sh.best_iter, sh.best_tflops, sh.best_knobs = sh.current_iter, tflops, idea.knobs
        sh.best_kernel, sh.best_source = kernel, src
    nxt = sh.current_iter + 1
    sh.profile_due = nxt % 10 == 0 or keep or sh.discards == 3


def _iteration(ctx: _Ctx, sh: _Shape) -> StoreRequest:
    it = sh.current_iter + 1
    profile = _profile(ctx, it) if sh.profile_due else None
    if profile is not None:
        sh.profile = profile
    strategy = _strategy(sh.discards)
    idea, src = (
        (None, source_text(sh.key, ctx.dsl, SEED_KNOBS))
        if it == 0
        else _idea(ctx.rng, sh.key, ctx.dsl, sh.best_knobs, strategy)
    )
    best_before = sh.best_tflops if it > 0 else 0.0
    kernel = ctx.run.src(sh.key, it, idea.tag if idea else "baseline", ctx.ext)
    out = _outcome(ctx, sh)
    measure = _measure(ctx.rng, sh.key, out, best_before)
    _advance(sh, out, idea, kernel, src)
    decision, tflops = out.decision, out.tflops
    step_id = f"{sh.key}-i{it}"
    rnd = RoundRecord(
        key=sh.key,
        iteration=it,
        decision=decision,
        tflops=tflops,
        hw_eff_pct=round(100.0 * tflops / PEAK_TFLOPS, 3),
        best_before=best_before,
        best_after=sh.best_tflops,
        kernel=kernel,
        knobs=idea.knobs if idea else SEED_KNOBS,
        idea=idea,
        strategy=strategy,
        consecutive_discards=sh.discards,
        bottleneck=sh.profile.bottleneck if sh.profile else "unknown",
        profile=profile,
        measure=measure,
        run_command=f"croqq-run --key {sh.key} --kernel {kernel} --repeats 50",
        gpu_uuid=measure.gpu_uuid,
        epoch=1,
        step_id=step_id,
        timestamp=ctx.stamp(),
    )
    done = sh.current_iter >= ctx.max_iter
    return _request(
        ctx,
        sh,
        step_id,
        kind="iteration",
        round=rnd,
        source=src,
        headers=sample_headers(sh.key),
        complete=done,
        best_source=sh.best_source if done else "",
        best_headers=sample_headers(sh.key) if done else {},
    )


def sample_requests(
    gpu: str,
    dsl: str,
    keys: list[str],
    iters_per_key: int,
    seed: int,
    *,
    max_iter: int = 150,
    attempt_rate: float = 0.08,
    in_flight: int | None = None,
) -> Iterator[StoreRequest]:
    """STORE requests for iterations 0..iters_per_key-1 of every key (plus a few compile-failed attempts),
    in iteration order per key, keys interleaved: all of them, or ``in_flight`` at a time in schedule
    order (as a fleet of that many GPUs tunes them: the next key starts when one has had its iterations).
    A key completes when it reaches ``max_iter``."""
    ctx = _Ctx(gpu=gpu, dsl=dsl, max_iter=max_iter, rng=random.Random(seed))
    waiting = [_Shape(key=key) for key in reversed(keys)]
    rounds: dict[str, int] = {}
    active: list[_Shape] = []
    while waiting or active:
        while waiting and len(active) < (in_flight or len(keys)):
            active.append(waiting.pop())
        for sh in active:
            rounds[sh.key] = rounds.get(sh.key, 0) + 1
            if sh.current_iter >= max_iter:
                continue
            if sh.current_iter >= 0 and ctx.rng.random() < attempt_rate:
                yield _attempt(ctx, sh)
            yield _iteration(ctx, sh)
        active = [sh for sh in active if rounds[sh.key] < iters_per_key]


def schedule_keys(count: int | None = None) -> list[str]:
    """Keys of the real shape schedule (268 for all dtypes), in priority order."""
    from croqq.domain.manifest import load_manifest
    from croqq.domain.schedule import build_schedule
    from croqq.settings import PROJECT_ROOT

    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    keys = [s.key for s in build_schedule(manifest, "all")]
    return keys if count is None else keys[:count]
