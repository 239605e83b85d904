"""The ``replay`` backend: measures a knob configuration by looking it up in a recorded tuning cache.

A team's recorded Kernel Tuner caches (:mod:`croqq.backends.landscape`) become a GPU-free stand-in for the
GPU they were recorded on, so that search strategies (and the whole control plane) can be compared on a
real landscape before GPU hours are spent.

- **The knob space comes from the file.** :func:`replay_manifest` adds a dsl (``replay``) whose knobs
  are the cache's (single-valued ones included) and whose seeds (``reference`` and ``naive``, every
  dtype) are the landscape's first valid configuration. A candidate is the knob macros and a header that
  declares nothing (``kernels/replay/replay.h``): nothing is compiled.
"""

from __future__ import annotations

import re

from croqq.backends.landscape import Landscape
from croqq.domain.manifest import BuildSpec, DslSpec, KernelSpec, Manifest
from croqq.errors import ConfigError

REPLAY_DSL = "replay"
HEADER = "kernels/replay/replay.h"
MACRO = re.compile(r"^[A-Z_][A-Z0-9_]*$")  # a knob is a #define that croqq.domain.source can read back
RESERVED = frozenset({"GEMM_M", "GEMM_N", "GEMM_K"})  # the shape macros every candidate defines


def _check_names(landscape: Landscape) -> None:
    bad = [k for k in landscape.keys if not MACRO.match(k) or k in RESERVED]
    if bad:
        raise ConfigError(
            f"landscape {landscape.name}: knob name(s) {', '.join(bad)} cannot be croqq knob macros "
            "(upper-case C identifiers other than GEMM_M/N/K)"
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
