"""Compile time per kernel family: how many knob settings each family's rules accept at the manifest's
reference shape, and a random sample of them compiled for sm_90a by the cuda backend with the real nvcc
(every setting the rules accept should compile), with the compile time's p50 and p95. The families run
side by side in one run, so the CUTLASS family's cost reads against the mma.sync family's on the same host.
"""

from __future__ import annotations

import itertools
import logging
import random
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from croqq.backends.cuda import CudaBackend
from croqq.backends.toolchain import knob_candidate
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import Shape
from croqq.settings import PROJECT_ROOT, Settings

log = logging.getLogger("benchmarks.compile")

SAMPLES = 12  # per family and dtype
SEED = 27
COMPILE_TIMEOUT_S = 3600.0  # a loaded 2-core host: the figure is the time, not a timeout


def accepted(manifest: Manifest, dsl: str, dtype: str, dims: tuple[int, int, int]) -> list[dict[str, int]]:
    """Every knob setting of the family that its rules accept for this shape and dtype."""
    spec = manifest.dsl(dsl)
    names = sorted(spec.knobs)
    every = (
        dict(zip(names, values, strict=True)) for values in itertools.product(*(spec.knobs[n] for n in names))
    )
    return [k for k in every if spec.broken_rule(k, dims, manifest.dtypes[dtype]) is None]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(
    work: Path, samples: int = SAMPLES, dsls: tuple[str, ...] = (), dtypes: tuple[str, ...] = ()
) -> dict[str, Any]:
    if shutil.which("nvcc") is None:
        log.warning("compile benchmark skipped: nvcc is not installed (the CUDA toolkit)")
        return {}
    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    dims = manifest.reference_shape
    backend = CudaBackend(
        manifest,
        Settings(
            backend="cuda",
            build_dir=work / "build",
            run_dir=work / "run",
            compile_timeout_s=COMPILE_TIMEOUT_S,
        ),
    )
    figures: dict[str, Any] = {}
    rng = random.Random(SEED)
    for dsl in dsls or tuple(manifest.dsls):
        for dtype in manifest.dsl(dsl).kernels:
            if dtypes and dtype not in dtypes:
                continue
            space = accepted(manifest, dsl, dtype, dims)
            picked = rng.sample(space, min(samples, len(space)))
            shape = Shape(dtype=dtype, m=dims[0], n=dims[1], k=dims[2])

            def build(knobs: dict[str, int], shape: Shape = shape, dsl: str = dsl) -> tuple[bool, float, str]:
                started = time.monotonic()
                outcome = backend.build(shape, knob_candidate(manifest, backend.settings, dsl, shape, knobs))
                return outcome.ok, time.monotonic() - started, outcome.reason

            with ThreadPoolExecutor(max_workers=2) as pool:  # the host's build concurrency on 2 cores
                results = list(pool.map(build, picked))
            times = [seconds for ok, seconds, _ in results if ok]
            for (ok, _, reason), knobs in zip(results, picked, strict=True):
                if not ok:
                    log.info("%s %s %s does not compile: %s", dsl, dtype, knobs, reason)
            prefix = f"compile_{dsl}_{dtype}"
            figures[f"{prefix}_accepted"] = len(space)
            figures[f"{prefix}_sampled"] = len(picked)
            figures[f"{prefix}_compiled"] = len(times)
            figures[f"{prefix}_p50_s"] = round(statistics.median(times), 1) if times else None
            figures[f"{prefix}_p95_s"] = round(_percentile(times, 0.95), 1) if times else None
            log.info(
                "%s %s: %d settings accepted, %d of %d sampled compile, p50 %s s, p95 %s s",
                dsl, dtype, len(space), len(times), len(picked),
                figures[f"{prefix}_p50_s"], figures[f"{prefix}_p95_s"],
            )  # fmt: skip
    return figures
