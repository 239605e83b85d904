"""A simulated H100-class GPU: the ``sim`` backend.

It builds, measures and profiles candidates of both GEMM kernel families without a GPU, so that the whole
control plane runs on a laptop and in CI. The performance models are :mod:`croqq.backends._simmodel`
(the ``cuda`` family's knobs, mma.sync) and :mod:`croqq.backends._simcutlass` (the ``cutlass`` family's,
CUTLASS's sm90 GEMM), picked by the family's knob names; this module adds what a real backend's caller
sees, judging a candidate source by what is in it:

- **build** reads the knob values from the source's ``#define`` lines; a missing or out-of-space knob, or a
  set that breaks the model's sm_90a rules, is a compile error worded as nvcc would, marked
  ``simulated nvcc:`` (as is every error the model makes up; a real compiler's is left as it is). The
  rest of the source (its *structure*, :func:`croqq.domain.source.structure`) is compared with the
  template's rendering of the same knobs: a pure knob candidate keeps the knob set's own hash-chosen
  fate (``COMPILE_FLAKE_RATE``, ``RUNTIME_FAULT_RATE``); a structural edit draws its fate from the hash
  of its structure (``STRUCTURAL_OUTCOMES``). Seed kernels never fail, and the same source always gets
  the same fate. The artifact (knobs, hash, factor, fault) goes through the artifact store, as a real
  binary does.
  ``CROQQ_SIM_COMPILE=nvcc`` compiles the candidate for real and lets the compiler judge it.
- **measure** times each artifact as the model's TFLOPS x the structural factor, with noise seeded by
  (shape key, content hash, times measured), so a run is reproducible and repeated measures still differ;
  a probe that reports a hang makes the whole call hang.
- **profile** reports the bottleneck the model attributes the most loss to; **vendor_tflops** is a
  cuBLAS-like fraction (0.85-0.95) of the best kernel on Hopper's asynchronous path (the cutlass model's
  optimum), whichever family is tuned: the ``cuda`` family's mma.sync path stays below it.

Under a proposer whose resource check, like an LLM's, misses some over-budget ideas, the outcome mix is
that of LLM-driven tuning logs; ``tests/unit/test_sim_outcome_rates.py`` holds it there.
Nothing uses global random state, and the per-candidate measure counter lives in the backend object, so a
restarted worker replays the same sequence.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel, ConfigDict

from croqq.backends import _simcutlass as cutlass_model
from croqq.backends import _simmodel as model
from croqq.backends._base import Backend, GpuContext
from croqq.backends.cuda import LOG_TAIL, first_error, run_process
from croqq.backends.toolchain import package_includes
from croqq.delivery.artifacts import ArtifactStore
from croqq.domain import source as src
from croqq.domain.knobs import Candidate, knobs_summary, render_source, seed_knobs
from croqq.domain.manifest import Manifest
from croqq.domain.records import BuildOutcome, Measurement, Outcome, Profile
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError, HostError, InvalidRecordError
from croqq.probes._base import BAD_THROTTLE
from croqq.settings import Settings

log = logging.getLogger(__name__)

FAMILY_MODELS: tuple[ModuleType, ...] = (model, cutlass_model)  # each with KNOBS, build_model, predict, ...
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
# a structural edit's fate by the share of structure hashes: cumulative bound -> what happens
STRUCTURAL_OUTCOMES: tuple[tuple[float, str], ...] = (
    (0.06, "miscompile"),
    (0.09, "wrong_answer"),
    (0.105, "crash"),
    (0.225, "win"),
    (1.0, "loss"),
)
SIMULATED = "simulated nvcc: "  # what starts every compile error the model makes up
WIN_FACTORS = (1.005, 1.06)
LOSS_FACTORS = (0.90, 0.995)
MISCOMPILES = (
    'cand.cu(211): error: no instance of function template "croqq::load_tile" matches the argument list',
    "ptxas error   : Arguments mismatch for instruction 'ldmatrix'",
    'cand.cu(274): error: a value of type "const uint8_t *" cannot be used to initialize an entity of '
    'type "const uint32_t *"',
    "ptxas fatal   : Unresolved extern function '_ZN5croqq8cp_asyncEPvPKvb'",
    'cand.cu(288): error: expression must have a constant value (in call to "cp_async_wait")',
)


class SimArtifact(BaseModel):
    """What ``build`` hands to ``measure``: enough to re-derive the model's prediction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sim: int = 1
    dsl: str
    key: str
    hash: str
    knobs: dict[str, int]
    factor: float = 1.0  # the source's structural effect on the knob set's TFLOPS
    fault: Outcome | None = None  # the run-time failure decided at build time


@dataclasses.dataclass(frozen=True)
class Effect:
    """What a build found: a compile error, or the run-time fault and TFLOPS factor the artifact carries."""

    error: str | None = None
    fault: Outcome | None = None
    factor: float = 1.0


def knob_effect(knob_id: str, compiled: bool) -> Effect:
    """A knob set's hash-chosen fate (keyed by its template rendering): the compiler disagreeing (unless
    a real compiler already agreed), or a run-time fault."""
    draw = model.unit("compile", knob_id)
    if draw < COMPILE_FLAKE_RATE and not compiled:
        return Effect(error=COMPILE_FLAKES[int(draw / COMPILE_FLAKE_RATE * len(COMPILE_FLAKES))])
    draw = model.unit("runtime", knob_id)
    if draw >= RUNTIME_FAULT_RATE:
        return Effect()
    share = draw / RUNTIME_FAULT_RATE
    return Effect(fault=next(outcome for bound, outcome in RUNTIME_FAULTS if share < bound))


def structural_effect(digest: str, compiled: bool) -> Effect:
    """A structural edit's fate, from the hash of its structure (see the module docstring); with a real
    compiler that already compiled it a miscompile draw counts as a loss."""
    draw = model.unit("structure", digest)
    kind = next(what for bound, what in STRUCTURAL_OUTCOMES if draw < bound)
    pick = model.unit("structure-pick", digest)
    if kind == "miscompile" and not compiled:
        return Effect(error=MISCOMPILES[int(pick * len(MISCOMPILES))])
    if kind in ("wrong_answer", "crash"):
        return Effect(fault="wrong_answer" if kind == "wrong_answer" else "crash")
    low, high = WIN_FACTORS if kind == "win" else LOSS_FACTORS
    return Effect(factor=low + (high - low) * pick)


def scaled(pred: model.Prediction, factor: float) -> model.Prediction:
    """The prediction of a kernel ``factor`` times as fast (the launch overhead included)."""
    if factor == 1.0:
        return pred
    time_us = pred.time_us / factor
    return dataclasses.replace(
        pred,
        tflops=pred.tflops * factor,
        time_us=time_us,
        efficiency=pred.efficiency * factor,
        launch_fraction=model.LAUNCH_US / time_us,
    )


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()[:8], "big")


class SimBackend(Backend):
    """The simulated GPU; deterministic given its inputs and the order of its calls per candidate."""

    name = "sim"

    def __init__(
        self, manifest: Manifest, settings: Settings, artifacts: ArtifactStore | None = None
    ) -> None:
        super().__init__(manifest, settings, artifacts)
        self._models: dict[tuple[str, str, str], model.ShapeModel] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # -- the model ----------------------------------------------------------------------------------

    def shape_model(self, gpu_type: str, shape: Shape, dsl: str | None = None) -> model.ShapeModel:
        """The hidden model of one shape on one GPU type (cached)."""
        dsl = self._dsl(dsl)
        key = (gpu_type, dsl, shape.key)
        with self._lock:
            cached = self._models.get(key)
        if cached is not None:
            return cached
        family = self.family_model(dsl)
        space = self.manifest.dsl(dsl).knobs
        dtype = self.manifest.dtypes[shape.dtype]
        gpu = self.manifest.gpu(gpu_type)
        built = family.build_model(
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

    def _dsl(self, dsl: str | None) -> str:
        """The family meant: the one named, else CROQQ_DSL, else the default mode's."""
        return self.manifest.family(dsl or self.settings.dsl)

    def check_dsl(self, dsl: str) -> None:
        self.family_model(dsl)

    def family_model(self, dsl: str) -> ModuleType:
        """The performance model of the dsl's knobs (ConfigError, one line, for knobs none models)."""
        space = set(self.manifest.dsl(dsl).knobs)
        for family in FAMILY_MODELS:
            if space == set(family.KNOBS):
                return family
        raise ConfigError(
            f"the sim backend models the knobs of the cuda and cutlass families; dsl {dsl!r} has "
            f"{sorted(space)}: tune it with CROQQ_BACKEND=cuda on GPU hosts"
        )

    def optimum_tflops(self, gpu_type: str, shape: Shape, dsl: str | None = None) -> float:
        """The noise-free TFLOPS of the hidden optimum (for tests and reports)."""
        m = self.shape_model(gpu_type, shape, dsl)
        return self.family_model(self._dsl(dsl)).predict(m, m.optimum).tflops

    def predicted_tflops(
        self, gpu_type: str, shape: Shape, knobs: dict[str, int], dsl: str | None = None
    ) -> float:
        """The noise-free TFLOPS of a knob set."""
        family = self.family_model(self._dsl(dsl))
        return family.predict(self.shape_model(gpu_type, shape, dsl), knobs).tflops

    def _predict(self, gpu_type: str, shape: Shape, art: SimArtifact) -> model.Prediction:
        """The noise-free prediction of a built artifact: its knobs' times its structural factor."""
        family = self.family_model(art.dsl)
        return scaled(family.predict(self.shape_model(gpu_type, shape, art.dsl), art.knobs), art.factor)

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
        """The built artifact, fetched by its reference from the artifact store (never rebuilt)."""
        return self.decoded(shape, artifact, SimArtifact)

    # -- build --------------------------------------------------------------------------------------

    def build(self, shape: Shape, candidate: Candidate) -> BuildOutcome:
        started = time.monotonic()
        family = self.family_model(candidate.dsl)  # refuses a knob family no model knows
        refused = self.rule_refusal(shape, candidate)
        if refused is not None:
            return refused
        real = self.settings.sim_compile == "nvcc"
        if not real:
            self._sleep(self.settings.sim_implement_s)
        command, text = self._nvcc_command(shape, candidate), ""
        a_bytes = self.manifest.dtypes[shape.dtype].a_bytes
        error = self._knob_error(candidate) or family.compile_error(shape, candidate.knobs, a_bytes)
        if error is None and real:
            command, error, text = self._compile(candidate)
        effect = Effect(error=error) if error is not None else self._effect(shape, candidate, real)
        known = family.known_fault(candidate.knobs, a_bytes) if effect.error is None else None
        if known is not None:  # what this knob does on a real GPU, whatever the source's own fate
            effect = dataclasses.replace(effect, fault=known)
        seconds = max(0.001, round(time.monotonic() - started, 3))  # a build ran (0 means none: cached)
        log_text = f"$ {command}\n{text}"
        if effect.error is not None:
            reason = effect.error if text else SIMULATED + effect.error  # text: a real compiler's own
            log.info("sim build %s %s failed: %s", shape.key, candidate.short_hash, reason)
            log_text += "" if text else f"{reason}\n"
            return BuildOutcome(ok=False, reason=reason, log=log_text, seconds=seconds)
        art = SimArtifact(
            dsl=candidate.dsl,
            key=shape.key,
            hash=candidate.content_hash,
            knobs=candidate.knobs,
            factor=effect.factor,
            fault=effect.fault,
        )
        return self.built(shape, candidate, art.model_dump_json().encode(), log_text, seconds)

    def _knob_error(self, candidate: Candidate) -> str | None:
        """A knob the source does not define, or a value outside the manifest's space, as nvcc words it."""
        for name, values in self.manifest.dsl(candidate.dsl).knobs.items():
            if name not in candidate.knobs:
                return f'error: identifier "{name}" is undefined'
            if candidate.knobs[name] not in values:
                allowed = ",".join(str(v) for v in values)
                return f"static_assert failed: {name}={candidate.knobs[name]} is not one of {allowed}"
        return None

    def _effect(self, shape: Shape, candidate: Candidate, real: bool) -> Effect:
        """What the candidate's source does beyond its knobs: nothing for the template rendering with the
        same knobs (then the knob set's own hash-chosen fate), else a draw from the structure's hash."""
        names = self.manifest.dsl(candidate.dsl).knobs
        template = render_source(self.manifest, candidate.dsl, shape, candidate.knobs)
        structure = src.structure(candidate.source, names)
        if structure == src.structure(template, names):
            if self._is_seed(candidate.dsl, shape.dtype, candidate.knobs):
                return Effect()
            return knob_effect(src.sha256(template), compiled=real)
        return structural_effect(src.sha256(structure), compiled=real)

    def _compile(self, candidate: Candidate) -> tuple[str, str | None, str]:
        """nvcc -c of the candidate and its headers in a temp folder of the build folder (the compiler's
        own temporary files too): (command, first error or None, log)."""
        build = self.manifest.dsl(candidate.dsl).build
        if shutil.which(build.compiler) is None:
            raise HostError(
                f"{build.compiler} not found on this build host (CROQQ_SIM_COMPILE=nvcc needs it)"
            )
        includes = package_includes(build, candidate.dsl)  # CUTLASS's headers, from the installed package
        argv = [build.compiler, *candidate.flags, "-I.", *includes, "-c", "-o", "cand.o", "cand.cu"]
        timeout_s = max(self.settings.compile_timeout_s, build.compile_timeout_s or 0.0)
        with self.build_disk():
            self.build_dir.mkdir(parents=True, exist_ok=True)
            work = tempfile.TemporaryDirectory(prefix="croqq-sim-nvcc-", dir=self.build_dir)
        with work as tmp:
            folder = Path(tmp).resolve()
            with self.build_disk():
                self._write_sources(folder, candidate)
            run = run_process(argv, timeout_s, env={"TMPDIR": str(folder)}, cwd=folder)
        text = (run.stdout + run.stderr)[-LOG_TAIL:]
        if run.returncode:
            self.check_compiler_disk(candidate, text)
        if run.returncode is None:
            return " ".join(argv), f"compile timed out after {timeout_s:.0f}s", text
        return " ".join(argv), first_error(text) if run.returncode else None, text

    @staticmethod
    def _write_sources(folder: Path, candidate: Candidate) -> None:
        for name, text in {"cand.cu": candidate.source, **candidate.headers}.items():
            path = (folder / name).resolve()
            if not path.is_relative_to(folder):
                raise InvalidRecordError(f"header name {name!r} leaves the build folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    def _nvcc_command(self, shape: Shape, candidate: Candidate) -> str:
        spec = self.manifest.dsl(candidate.dsl)
        src_name = f"{shape.key}_{candidate.short_hash}.{spec.ext}"
        return " ".join([spec.build.compiler, f"-arch={spec.build.arch}", *spec.build.flags, "-c", src_name])

    # -- measure ------------------------------------------------------------------------------------

    def measure(self, gpu: GpuContext, shape: Shape, artifacts: Sequence[str]) -> list[Measurement]:
        arts = [self.decode(shape, a) for a in artifacts]
        if self._take_hang(gpu):
            return self._gpu_hang(gpu, shape, arts)
        share = self.settings.sim_measure_s  # per kernel: a batch of k kernels holds the GPU k times as long
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
        """The runtime failure of a candidate (decided at build, see :func:`knob_effect`), or None."""
        return art.fault

    def _run_one(self, gpu: GpuContext, shape: Shape, art: SimArtifact, throttled: bool) -> Measurement:
        header = self._raw_header(gpu, shape, art)
        fault = self.runtime_fault(art.dsl, shape.dtype, art)
        if fault is not None:
            return self._failure(shape, art, fault, header)
        pred = self._predict(gpu.gpu_type, shape, art)
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
        tflops = round(tflops, 3)  # as reported, so that hw_eff is the reported figure's
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
            tflops=tflops,
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
        m, family = self.shape_model(gpu.gpu_type, shape, art.dsl), self.family_model(art.dsl)
        pred = self._predict(gpu.gpu_type, shape, art)
        kind = family.bottleneck(m, art.knobs, pred)
        metrics = family.profile_metrics(m, art.knobs, pred, self.manifest.gpu(gpu.gpu_type).mem_gbps)
        lines = [f"==PROF== sim ncu --set full  {shape.key} cand={art.hash[:12]}"]
        lines += [f"  {name:<26} {value:>12g}" for name, value in metrics.items()]
        lines.append(f"  bottleneck: {kind}")
        return Profile(bottleneck=kind, metrics=metrics, raw="\n".join(lines) + "\n")

    def vendor_tflops(self, gpu: GpuContext, shape: Shape) -> float | None:
        ratio = 0.85 + 0.10 * model.unit(f"{gpu.gpu_type}|{shape.key}", "vendor")
        return round(self.library_tflops(gpu.gpu_type, shape) * ratio, 3)

    def library_tflops(self, gpu_type: str, shape: Shape) -> float:
        """The best kernel on Hopper's asynchronous path (WGMMA, TMA), the one vendor libraries run,
        whichever family is tuned: the cutlass model's optimum where a family with its knobs has this
        dtype, else the tuned family's optimum freed of its instruction path's limit."""
        for dsl, spec in self.manifest.dsls.items():
            if set(spec.knobs) == set(cutlass_model.KNOBS) and shape.dtype in spec.kernels:
                return self.optimum_tflops(gpu_type, shape, dsl)
        if self.family_model(self._dsl(None)) is not model:
            return self.optimum_tflops(gpu_type, shape)
        m = self.shape_model(gpu_type, shape)
        gpu, dtype = self.manifest.gpu(gpu_type), self.manifest.dtypes[shape.dtype]
        free = model.ceiling_tflops(shape, dtype.a_bytes, dtype.c_bytes, m.peak_tflops, gpu.mem_gbps)
        return self.optimum_tflops(gpu_type, shape) * free / m.ceiling_tflops
