"""A simulated H100-class GPU: the ``sim`` backend.

It builds, measures and profiles candidates of the CUDA GEMM knob family without a GPU, so that the
whole control plane (FSM, workers, writer) runs on a laptop and in CI. The performance model lives in
:mod:`croqq.backends._simmodel` (roofline ceiling x an efficiency that falls with each knob's distance
from a hidden per-shape optimum); this module adds what a real backend's caller sees:

- **build** sleeps ``sim_implement_s x time_scale`` and applies sm_90a compile rules (shared memory,
  registers, warp fragment, split-K slice) plus a small hash-chosen share of "the compiler disagreed"
  failures. The artifact is compact JSON: knobs, content hash, shape key and dsl.
- **measure** sleeps ``sim_measure_s x time_scale`` per call (split across the artifacts), then times each
  artifact: multiplicative noise (sigma 0.7%) seeded by (shape key, content hash, how many times this
  backend has measured that candidate), so a run is reproducible and repeated measures still differ.
  A small hash-chosen share of candidates fail at run time (crash, hang after ``run_timeout_s``, wrong
  answer); the manifest's seed kernels never do. A probe with ``take_hang(uuid) -> True``, or one that
  reads the GPU as not responding, makes the whole call hang ("GPU stopped responding") whatever the
  candidates.
- **profile** sleeps ``sim_profile_s x time_scale`` and reports the bottleneck the model attributes the
  most loss to, with ncu-like metrics; **vendor_tflops** is a cuBLAS-like 85-95% of the optimum.

Driven by the search proposer through the FSM (30 iterations from the reference seed, all 268 scheduled
shapes) the outcome mix is ~9.4% KEEP, ~82% DISCARD, ~6.7% compile failures and ~1.7% runtime failures
of proposals, as in LLM-driven tuning logs; ``tests/unit/test_sim_outcome_rates.py`` holds it there.

Nothing uses global random state: every draw comes from a hash or a ``random.Random`` seeded by one. The
per-candidate measure counter lives in the backend object, so a restarted worker replays the sequence.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from croqq.backends import _simmodel as model
from croqq.backends._base import Backend, GpuContext
from croqq.domain.knobs import Candidate, knobs_summary, seed_knobs
from croqq.domain.manifest import Manifest
from croqq.domain.records import BuildOutcome, Measurement, Outcome, Profile
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError, InvalidRecordError
from croqq.probes._base import BAD_THROTTLE
from croqq.settings import Settings

log = logging.getLogger(__name__)

NOISE_SIGMA = 0.007
THROTTLED_SLOWDOWN = 0.9
COMPILE_FLAKE_RATE = 0.02
RUNTIME_FAULT_RATE = 0.018
RUNTIME_FAULTS: tuple[tuple[float, Outcome], ...] = ((0.4, "wrong_answer"), (0.75, "crash"), (1.0, "hang"))
TIMING_BUDGET_MS = 100.0
WARMUP = 10
COMPILE_FLAKES = (
    'error: no instance of overloaded function "cute::copy" matches the argument list',
    "ptxas error: Misaligned shared or local address in ldmatrix",
    'error: identifier "cp_async_wait_group" is undefined in this scope',
    "ptxas fatal: Unresolved extern function '__wgmma_fence_aligned'",
)


class SimArtifact(BaseModel):
    """What ``build`` hands to ``measure``: enough to re-derive the model's prediction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sim: int = 1
    dsl: str
    key: str
    hash: str
    knobs: dict[str, int]


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()[:8], "big")


class SimBackend(Backend):
    """The simulated GPU; deterministic given its inputs and the order of its calls per candidate."""

    name = "sim"

    def __init__(self, manifest: Manifest, settings: Settings) -> None:
        super().__init__(manifest, settings)
        self._models: dict[tuple[str, str, str], model.ShapeModel] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # -- the model ----------------------------------------------------------------------------------

    def shape_model(self, gpu_type: str, shape: Shape, dsl: str | None = None) -> model.ShapeModel:
        """The hidden model of one shape on one GPU type (cached)."""
        dsl = dsl or self.settings.dsl
        key = (gpu_type, dsl, shape.key)
        with self._lock:
            cached = self._models.get(key)
        if cached is not None:
            return cached
        space = self._knob_space(dsl)
        dtype = self.manifest.dtypes[shape.dtype]
        gpu = self.manifest.gpu(gpu_type)
        built = model.build_model(
            shape,
            space,
            a_bytes=dtype.a_bytes,
            c_bytes=dtype.c_bytes,
            gpu_type=gpu_type,
            peak=gpu.peak_tflops[shape.dtype],
            mem_gbps=gpu.mem_gbps,
        )
        with self._lock:
            self._models[key] = built
        return built

    def _knob_space(self, dsl: str) -> dict[str, list[int]]:
        space = self.manifest.dsl(dsl).knobs
        if set(space) != set(model.KNOBS):
            raise ConfigError(
                f"the sim backend models the GEMM knobs {list(model.KNOBS)}; dsl {dsl!r} has {sorted(space)}"
            )
        return space

    def optimum_tflops(self, gpu_type: str, shape: Shape) -> float:
        """The noise-free TFLOPS of the hidden optimum (for tests and reports)."""
        m = self.shape_model(gpu_type, shape)
        return model.predict(m, m.optimum).tflops

    def predicted_tflops(self, gpu_type: str, shape: Shape, knobs: dict[str, int]) -> float:
        """The noise-free TFLOPS of a knob set."""
        return model.predict(self.shape_model(gpu_type, shape), knobs).tflops

    # -- helpers ------------------------------------------------------------------------------------

    def _sleep(self, seconds: float) -> None:
        delay = seconds * self.settings.time_scale
        if delay > 0:
            time.sleep(delay)

    def _is_seed(self, dsl: str, dtype: str, knobs: dict[str, int]) -> bool:
        return any(knobs == seed_knobs(self.manifest, dsl, dtype, which) for which in ("reference", "naive"))

    def _next_count(self, shape: Shape, content_hash: str) -> int:
        with self._lock:
            n = self._counts.get((shape.key, content_hash), 0)
            self._counts[(shape.key, content_hash)] = n + 1
        return n

    def decode(self, shape: Shape, artifact: str) -> SimArtifact:
        try:
            art = SimArtifact.model_validate_json(artifact)
        except ValidationError as exc:
            raise InvalidRecordError(f"not a sim artifact: {artifact[:80]!r}") from exc
        if art.key != shape.key:
            raise InvalidRecordError(f"artifact {art.hash[:12]} was built for {art.key}, not {shape.key}")
        return art

    # -- build --------------------------------------------------------------------------------------

    def build(self, shape: Shape, candidate: Candidate) -> BuildOutcome:
        started = time.monotonic()
        self._sleep(self.settings.sim_implement_s)
        self._knob_space(candidate.dsl)  # refuses a knob family the model does not know
        error = self._compile_error(shape, candidate)
        seconds = round(time.monotonic() - started, 3)
        command = self._nvcc_command(shape, candidate)
        if error is not None:
            log.info("sim build %s %s failed: %s", shape.key, candidate.short_hash, error)
            return BuildOutcome(ok=False, reason=error, log=f"$ {command}\n{error}\n", seconds=seconds)
        art = SimArtifact(
            dsl=candidate.dsl, key=shape.key, hash=candidate.content_hash, knobs=candidate.knobs
        )
        return BuildOutcome(ok=True, artifact=art.model_dump_json(), log=f"$ {command}\n", seconds=seconds)

    def _compile_error(self, shape: Shape, candidate: Candidate) -> str | None:
        a_bytes = self.manifest.dtypes[shape.dtype].a_bytes
        error = model.compile_error(shape, candidate.knobs, a_bytes)
        if error is not None or self._is_seed(candidate.dsl, shape.dtype, candidate.knobs):
            return error
        draw = model.unit("compile", candidate.content_hash)
        if draw < COMPILE_FLAKE_RATE:
            return COMPILE_FLAKES[int(draw / COMPILE_FLAKE_RATE * len(COMPILE_FLAKES))]
        return None

    def _nvcc_command(self, shape: Shape, candidate: Candidate) -> str:
        spec = self.manifest.dsl(candidate.dsl)
        src = f"{shape.key}_{candidate.short_hash}.{spec.ext}"
        return " ".join([spec.build.compiler, f"-arch={spec.build.arch}", *spec.build.flags, "-c", src])

    # -- measure ------------------------------------------------------------------------------------

    def measure(self, gpu: GpuContext, shape: Shape, artifacts: Sequence[str]) -> list[Measurement]:
        arts = [self.decode(shape, a) for a in artifacts]
        if self._take_hang(gpu):
            return self._gpu_hang(gpu, shape, arts)
        share = self.settings.sim_measure_s / max(1, len(arts))
        results = []
        for art in arts:
            start = gpu.probe.snapshot(gpu.uuid)
            self._sleep(share)
            result = self._run_one(
                gpu, shape, art, throttled=bool(BAD_THROTTLE & set(start.throttle_reasons))
            )
            results.append(result.model_copy(update={"start": start, "end": gpu.probe.snapshot(gpu.uuid)}))
        return results

    @staticmethod
    def _take_hang(gpu: GpuContext) -> bool:
        """An injected one-shot hang (``probe.take_hang``), or a GPU that already stopped responding."""
        take = getattr(gpu.probe, "take_hang", None)
        if callable(take) and take(gpu.uuid):
            return True
        return not gpu.probe.read(gpu.uuid).responsive

    def _gpu_hang(self, gpu: GpuContext, shape: Shape, arts: list[SimArtifact]) -> list[Measurement]:
        log.warning("sim GPU %s stopped responding while measuring %s", gpu.uuid, shape.key)
        start = gpu.probe.snapshot(gpu.uuid)
        self._sleep(self.settings.run_timeout_s)
        detail = "GPU stopped responding"
        return [
            Measurement(
                outcome="hang",
                detail=detail,
                start=start,
                raw=self._raw_header(gpu, shape, a)
                + f"timeout after {self.settings.run_timeout_s:g} s: {detail}\n",
            )
            for a in arts
        ]

    def runtime_fault(self, dsl: str, dtype: str, art: SimArtifact) -> Outcome | None:
        """The hash-chosen runtime failure of a candidate, or None; seeds never fail."""
        draw = model.unit("runtime", art.hash)
        if draw >= RUNTIME_FAULT_RATE or self._is_seed(dsl, dtype, art.knobs):
            return None
        share = draw / RUNTIME_FAULT_RATE
        return next(outcome for bound, outcome in RUNTIME_FAULTS if share < bound)

    def _run_one(self, gpu: GpuContext, shape: Shape, art: SimArtifact, throttled: bool) -> Measurement:
        header = self._raw_header(gpu, shape, art)
        fault = self.runtime_fault(art.dsl, shape.dtype, art)
        if fault is not None:
            return self._failure(shape, art, fault, header)
        pred = model.predict(self.shape_model(gpu.gpu_type, shape, art.dsl), art.knobs)
        rng = random.Random(_seed(shape.key, art.hash, self._next_count(shape, art.hash)))
        tflops = (
            pred.tflops * (1.0 + rng.gauss(0.0, NOISE_SIGMA)) * (THROTTLED_SLOWDOWN if throttled else 1.0)
        )
        tflops = min(tflops, self.peak_tflops(gpu.gpu_type, shape.dtype))
        return self._timing(gpu, shape, tflops, rng, header)

    def _timing(
        self, gpu: GpuContext, shape: Shape, tflops: float, rng: random.Random, header: str
    ) -> Measurement:
        median_ms = shape.flops / (tflops * 1e9)
        min_ms = median_ms * (1.0 - abs(rng.gauss(0.0, NOISE_SIGMA)))
        max_ms = median_ms * (1.0 + abs(rng.gauss(0.0, 2 * NOISE_SIGMA)))
        repeats = max(20, min(500, int(TIMING_BUDGET_MS / median_ms)))
        eff = self.hw_eff_pct(gpu.gpu_type, shape.dtype, tflops)
        spec = self.manifest.dtypes[shape.dtype]
        err = spec.atol * rng.uniform(0.01, 0.2)
        raw = (
            f"{header}verify: max_abs_err={err:.3e} atol={spec.atol:g} rtol={spec.rtol:g} PASS\n"
            f"warmup: {WARMUP}  repeats: {repeats}  (L2 flushed, inputs rotated)\n"
            f"time_ms: median {median_ms:.5f} min {min_ms:.5f} max {max_ms:.5f}\n"
            f"TFLOPS: {tflops:.2f}  hw_eff: {eff:.2f}%\n"
        )
        return Measurement(
            outcome="ok",
            tflops=round(tflops, 3),
            hw_eff_pct=eff,
            median_ms=median_ms,
            min_ms=min_ms,
            max_ms=max_ms,
            repeats=repeats,
            verified=True,
            raw=raw,
        )

    def _failure(self, shape: Shape, art: SimArtifact, fault: Outcome, header: str) -> Measurement:
        spec = self.manifest.dtypes[shape.dtype]
        if fault == "hang":
            self._sleep(self.settings.run_timeout_s)
            detail = f"no completion within {self.settings.run_timeout_s:g} s; process killed"
        elif fault == "crash":
            detail = "CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)"
        else:
            rng = random.Random(_seed("verify", art.hash))
            row, col = rng.randrange(shape.m), rng.randrange(shape.n)
            detail = f"max |err| {spec.atol * rng.uniform(3, 400):.3g} > atol {spec.atol:g} at C[{row},{col}]"
        log.info("sim run %s %s: %s (%s)", shape.key, art.hash[:12], fault, detail)
        return Measurement(
            outcome=fault, verified=False, detail=detail, raw=f"{header}FAIL {fault}: {detail}\n"
        )

    @staticmethod
    def _raw_header(gpu: GpuContext, shape: Shape, art: SimArtifact) -> str:
        return (
            f"croqq-bench (sim) gpu={gpu.gpu_type} uuid={gpu.uuid} shape={shape.key} cand={art.hash[:12]}\n"
            f"knobs: {knobs_summary(art.knobs)}\n"
        )

    # -- profile and vendor -------------------------------------------------------------------------

    def profile(self, gpu: GpuContext, shape: Shape, artifact: str) -> Profile:
        art = self.decode(shape, artifact)
        self._sleep(self.settings.sim_profile_s)
        m = self.shape_model(gpu.gpu_type, shape, art.dsl)
        pred = model.predict(m, art.knobs)
        kind = model.bottleneck(m, art.knobs, pred)
        metrics = model.profile_metrics(m, art.knobs, pred, self.manifest.gpu(gpu.gpu_type).mem_gbps)
        lines = [f"==PROF== sim ncu --set full  {shape.key} cand={art.hash[:12]}"]
        lines += [f"  {name:<26} {value:>12g}" for name, value in metrics.items()]
        lines.append(f"  bottleneck: {kind}")
        return Profile(bottleneck=kind, metrics=metrics, raw="\n".join(lines) + "\n")

    def vendor_tflops(self, gpu: GpuContext, shape: Shape) -> float | None:
        m = self.shape_model(gpu.gpu_type, shape)
        ratio = 0.85 + 0.10 * model.unit(m.salt, "vendor")
        return round(model.predict(m, m.optimum).tflops * ratio, 3)
