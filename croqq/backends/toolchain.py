"""The compiler's identity and the candidates built from this host's manifest include folders.

The compiler version is part of every candidate's content hash (a new nvcc never reuses a stale build
or counts as "already tried"). It is read once per process from ``<compiler> --version``; the simulated
backend, unless it really compiles (``CROQQ_SIM_COMPILE=nvcc``), names itself ``sim``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

from croqq.domain.knobs import Candidate, make_candidate, resolve_candidate
from croqq.domain.manifest import Manifest
from croqq.domain.shapes import Shape
from croqq.settings import Settings

SIM_TOOLCHAIN = "sim"


@functools.lru_cache(maxsize=8)
def compiler_version(compiler: str) -> str:
    """The line of ``--version`` that names the release, or ``<compiler> unavailable``."""
    path = shutil.which(compiler)
    if path is None:
        return f"{compiler} unavailable"
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return f"{compiler} unavailable"
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    release = [line for line in lines if "release" in line.lower()]
    return (release or lines or [f"{compiler} unknown"])[-1]


def really_compiles(settings: Settings) -> bool:
    return settings.backend == "cuda" or settings.sim_compile == "nvcc"


def toolchain_id(settings: Settings, manifest: Manifest, dsl: str) -> str:
    if not really_compiles(settings):
        return SIM_TOOLCHAIN
    return compiler_version(manifest.dsl(dsl).build.compiler)


def knob_candidate(
    manifest: Manifest, settings: Settings, dsl: str, shape: Shape, knobs: dict[str, int]
) -> Candidate:
    """The dtype's template rendered with these knobs, headers from this host's include folders."""
    return make_candidate(
        manifest, dsl, shape, knobs, settings.kernels_dir, toolchain_id(settings, manifest, dsl)
    )


def candidate_of(manifest: Manifest, settings: Settings, dsl: str, dtype: str, source: str) -> Candidate:
    """Any logical source, headers from this host's include folders (SourceError if one does not resolve)."""
    return resolve_candidate(
        manifest, dsl, dtype, source, settings.kernels_dir, toolchain_id(settings, manifest, dsl)
    )
