"""The ``replay`` backend: measures a knob configuration by looking it up in a recorded tuning cache.

Recorded Kernel Tuner caches (:mod:`croqq.backends.landscape`) become a GPU-free stand-in for the GPU they
were recorded on, so search strategies and the control plane can be compared on a real landscape before
GPU hours are spent.

- **The knob space comes from the file**: :func:`replay_manifest` adds a ``replay`` dsl with the cache's
  knobs, seeded (``reference``, ``naive``) by its first valid configuration. Nothing is compiled.
- **build** stores the knob set as the artifact when the configuration is in the landscape; anything else
  (absent or recorded as failed, a knob outside the space, a source that changes more than the knob
  macros) is a failed build: an attempt, like a compile error.
- **measure** takes the median of ``replay_repeats`` draws from the recorded repeats, seeded like the
  sim's, so the noise is the recorded noise. The times are used as recorded whatever shape is tuned:
  replay each cache on the one shape it was recorded for.
- **profile** has nothing recorded to classify: bottleneck ``unknown``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import re
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from croqq.backends._base import Backend, GpuContext
from croqq.backends.landscape import Landscape, Record, load_landscape
from croqq.delivery.artifacts import ArtifactStore
from croqq.domain import source as src
from croqq.domain.knobs import Candidate, knobs_summary, render_source
from croqq.domain.manifest import BuildSpec, DslSpec, KernelSpec, Manifest
from croqq.domain.records import BuildOutcome, Measurement, Profile
from croqq.domain.shapes import Shape
from croqq.errors import ArtifactMissingError, ConfigError
from croqq.settings import Settings

log = logging.getLogger(__name__)

REPLAY_DSL = "replay"
HEADER = "kernels/replay/replay.h"
MACRO = re.compile(r"^[A-Za-z_]\w*$", re.ASCII)  # a knob is a #define that croqq.domain.source reads back
RESERVED = frozenset({"GEMM_M", "GEMM_N", "GEMM_K"})  # the shape macros every candidate defines


def _check_names(landscape: Landscape) -> None:
    bad = [k for k in landscape.keys if not MACRO.match(k) or k in RESERVED]
    if bad:
        raise ConfigError(
            f"landscape {landscape.name}: knob name(s) {', '.join(bad)} cannot be croqq knob macros "
            "(C identifiers other than GEMM_M/N/K)"
        )


def replay_manifest(manifest: Manifest, landscape: Landscape, dsl: str = REPLAY_DSL) -> Manifest:
    """``manifest`` plus a dsl whose knob space is the landscape's, with a kernel for every dtype seeded
    at ``landscape.first_valid`` and a build spec that compiles nothing."""
    _check_names(landscape)
    seed = dict(landscape.first_valid)
    spec = DslSpec(
        ext="h",
        knobs={k: list(v) for k, v in landscape.space.items()},
        kernels={dtype: KernelSpec(source=HEADER, reference=seed, naive=seed) for dtype in manifest.dtypes},
        build=BuildSpec(
            compiler="none",
            arch=REPLAY_DSL,
            flags=[],
            dtype_flags={},
            include_dirs=[HEADER.rsplit("/", 1)[0]],
            libs=[],
        ),
    )
    return manifest.model_copy(update={"dsls": {**manifest.dsls, dsl: spec}})


@functools.lru_cache(maxsize=2)
def _cached(path: str) -> Landscape:
    return load_landscape(Path(path))


def settings_landscape(settings: Settings) -> Landscape:
    """The landscape of ``CROQQ_REPLAY_CACHE``, loaded once per process (a ConfigError line if it is
    unset or not a cache file)."""
    if settings.replay_cache is None:
        raise ConfigError("CROQQ_BACKEND=replay needs CROQQ_REPLAY_CACHE (a Kernel Tuner cache file)")
    return _cached(str(settings.replay_cache))


class ReplayArtifact(BaseModel):
    """What ``build`` hands to ``measure``: the knob set, for the shape it was built for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replay: int = 1
    dsl: str
    key: str
    hash: str
    knobs: dict[str, int]


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()[:8], "big")


class ReplayBackend(Backend):
    """Measures knob configurations by their recorded repeats (see the module docstring)."""

    name = "replay"

    def __init__(
        self,
        manifest: Manifest,
        settings: Settings,
        artifacts: ArtifactStore | None = None,
        landscape: Landscape | None = None,
    ) -> None:
        super().__init__(manifest, settings, artifacts)
        self.landscape = landscape or settings_landscape(settings)
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # -- build --------------------------------------------------------------------------------------

    def build(self, shape: Shape, candidate: Candidate) -> BuildOutcome:
        command = f"$ replay {self.landscape.name} {knobs_summary(candidate.knobs)}\n"
        rec = self._lookup(shape, candidate)
        if isinstance(rec, str):
            log.info("replay build %s %s failed: %s", shape.key, candidate.short_hash, rec)
            return BuildOutcome(ok=False, reason=rec, log=f"{command}{rec}\n")
        art = ReplayArtifact(
            dsl=candidate.dsl, key=shape.key, hash=candidate.content_hash, knobs=candidate.knobs
        )
        text = f"{command}recorded: mean {rec.time_ms:.5f} ms over {len(rec.times_ms)} repeats\n"
        return self.built(shape, candidate, art.model_dump_json().encode(), text)

    def _lookup(self, shape: Shape, candidate: Candidate) -> Record | str:
        """The candidate's record, or why it cannot be replayed (one line)."""
        where = f"the recorded landscape {self.landscape.name}"
        unknown = sorted(set(candidate.knobs) - set(self.landscape.keys))
        if unknown:
            return f"knob(s) {', '.join(unknown)} are not knobs of {where}"
        try:
            rec = self.landscape.record(candidate.knobs)
        except ConfigError:
            missing = sorted(set(self.landscape.tunable) - set(candidate.knobs))
            return f"the source does not define knob(s) {', '.join(missing)} of {where}"
        if rec is None:
            return f"not in {where} (the configuration did not compile or was not measured)"
        template = render_source(self.manifest, candidate.dsl, shape, candidate.knobs)
        names = self.landscape.keys
        if src.structure(candidate.source, names) != src.structure(template, names):
            return f"the source changes more than the knob macros; {where} holds knob configurations only"
        return rec

    # -- measure ------------------------------------------------------------------------------------

    def decode(self, shape: Shape, artifact: str) -> ReplayArtifact:
        """The built artifact, fetched by its reference from the artifact store (never rebuilt)."""
        return self.decoded(shape, artifact, ReplayArtifact)

    def measure(self, gpu: GpuContext, shape: Shape, artifacts: Sequence[str]) -> list[Measurement]:
        arts = [(a, self.decode(shape, a)) for a in artifacts]
        results = []
        for artifact, art in arts:
            start = gpu.probe.snapshot(gpu.uuid)
            result = self._run_one(gpu, shape, artifact, art)
            results.append(result.model_copy(update={"start": start, "end": gpu.probe.snapshot(gpu.uuid)}))
        return results

    def _next_count(self, shape: Shape, content_hash: str) -> int:
        with self._lock:
            n = self._counts.get((shape.key, content_hash), 0)
            self._counts[(shape.key, content_hash)] = n + 1
        return n

    def _run_one(self, gpu: GpuContext, shape: Shape, artifact: str, art: ReplayArtifact) -> Measurement:
        rec = self.landscape.record(art.knobs)
        if rec is None:  # built against another cache: a build host builds it again, and refuses it
            raise ArtifactMissingError(
                f"{shape.key}: artifact {art.hash[:12]} is not in this host's landscape "
                f"{self.landscape.name}",
                artifact,
            )
        rng = random.Random(_seed(shape.key, art.hash, self._next_count(shape, art.hash)))
        draws = [rng.choice(rec.times_ms) for _ in range(self.settings.replay_repeats)]
        if self.settings.time_scale > 0:
            time.sleep(sum(draws) / 1000.0 * self.settings.time_scale)
        median_ms = statistics.median(draws)
        tflops = shape.flops / (median_ms * 1e9)
        eff = self.hw_eff_pct(gpu.gpu_type, shape.dtype, tflops)
        raw = (
            f"croqq-bench (replay) gpu={gpu.gpu_type} uuid={gpu.uuid} shape={shape.key} "
            f"cand={art.hash[:12]}\n"
            f"knobs: {knobs_summary(art.knobs)}\n"
            f"recorded: {self.landscape.name} mean {rec.time_ms:.5f} ms, {len(rec.times_ms)} repeats "
            "(verified when recorded)\n"
            f"repeats: {len(draws)} drawn from the recorded ones\n"
            f"time_ms: median {median_ms:.5f} min {min(draws):.5f} max {max(draws):.5f}\n"
            f"TFLOPS: {tflops:.3f}  hw_eff: {eff:.2f}%\n"
        )
        return Measurement(
            outcome="ok",
            tflops=round(tflops, 4),
            hw_eff_pct=eff,
            median_ms=median_ms,
            min_ms=min(draws),
            max_ms=max(draws),
            repeats=len(draws),
            verified=True,
            raw=raw,
        )

    # -- profile ------------------------------------------------------------------------------------

    def profile(self, gpu: GpuContext, shape: Shape, artifact: str) -> Profile:
        art = self.decode(shape, artifact)
        raw = (
            f"replay {shape.key} cand={art.hash[:12]}: {self.landscape.name} records times only, no profile\n"
        )
        return Profile(bottleneck="unknown", raw=raw)
