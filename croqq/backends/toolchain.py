"""The compiler's identity and the candidates built from this host's manifest include folders.

The compiler version is part of every candidate's content hash (a new nvcc never reuses a stale build
or counts as "already tried"). It is read once per process from ``<compiler> --version``; the simulated
backend, unless it really compiles (``CROQQ_SIM_COMPILE=nvcc``), names itself ``sim``. A family whose
headers come from an installed package (``build.packages``: CUTLASS's from ``nvidia-cutlass``) adds the
package and its pinned version to that identity, and its include folders to the compile command; a build
host without that exact version refuses with one line (a :class:`HostError`): a build worker finds that at
start-up and does not consume that family's queue (``Backend.build_problems``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import shutil
import subprocess
from pathlib import Path

from croqq.domain.knobs import Candidate, make_candidate, resolve_candidate
from croqq.domain.manifest import BuildSpec, Manifest
from croqq.domain.shapes import Shape
from croqq.errors import HostError
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
    build = manifest.dsl(dsl).build
    packages = [f"{name} {pkg.version}" for name, pkg in sorted(build.packages.items())]
    return " + ".join([compiler_version(build.compiler), *packages])


def require_package(name: str, version: str, who: str) -> importlib.metadata.Distribution:
    """The installed distribution ``name`` if it is exactly ``version``; else one HostError line saying
    what ``who`` needs, what this host has, and the pip command that fixes it."""
    fix = f"pip install '{name}=={version}'"
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise HostError(f"{who} needs {name} {version}, not installed on this host: {fix}") from None
    if dist.version != version:
        raise HostError(f"{who} needs {name} {version}, this host has {dist.version}: {fix}")
    return dist


def package_includes(build: BuildSpec, dsl: str) -> list[str]:
    """``-I`` flags for the include folders of the dsl's packages, each at the version the manifest pins."""
    flags = []
    for name, pkg in sorted(build.packages.items()):
        dist = require_package(name, pkg.version, f"dsl {dsl!r}")
        for folder in pkg.include:
            path = Path(str(dist.locate_file(folder)))
            if not path.is_dir():
                raise HostError(
                    f"{name} {dist.version} on this host lacks {folder}: "
                    f"reinstall it (pip install '{name}=={pkg.version}')"
                )
            flags.append(f"-I{path}")
    return flags


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
