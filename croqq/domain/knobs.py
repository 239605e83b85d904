"""Candidates: a kernel family plus values for its tunable knobs, rendered as a small source file.

A candidate's identity is the content hash of its rendered source, so the same idea phrased twice is
recognized as a repeat (the proposer never proposes a hash it has seen for that shape).
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field

from croqq.domain.manifest import DslSpec, Manifest
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError


class Candidate(BaseModel):
    """What IMPLEMENT builds and MEASURE times: the knob values for one shape's kernel."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dsl: str
    dtype: str
    knobs: dict[str, int]
    source: str = Field(description="The rendered source text (what is stored under srcs/).")
    content_hash: str

    @property
    def short_hash(self) -> str:
        return self.content_hash[:12]


def check_knobs(spec: DslSpec, knobs: dict[str, int]) -> None:
    unknown = sorted(set(knobs) - set(spec.knobs))
    missing = sorted(set(spec.knobs) - set(knobs))
    if unknown or missing:
        raise ConfigError(
            f"knobs must be exactly {sorted(spec.knobs)} (unknown {unknown}, missing {missing})"
        )
    for name, value in knobs.items():
        if value not in spec.knobs[name]:
            raise ConfigError(f"knob {name}={value} is not one of {spec.knobs[name]}")


def render_source(manifest: Manifest, dsl: str, shape: Shape, knobs: dict[str, int]) -> str:
    """The candidate's translation unit: shape and knob macros, then the family's kernel header."""
    spec = manifest.dsl(dsl)
    kernel = spec.kernels.get(shape.dtype)
    if kernel is None:
        raise ConfigError(f"dsl {dsl!r} has no kernel for dtype {shape.dtype!r} in the manifest")
    lines = [
        f"// croqq candidate for {shape.key} ({dsl})",
        f"#define GEMM_M {shape.m}",
        f"#define GEMM_N {shape.n}",
        f"#define GEMM_K {shape.k}",
    ]
    lines += [f"#define {name} {knobs[name]}" for name in sorted(knobs)]
    header = kernel.source.rsplit("/", 1)[-1]
    lines.append(f'#include "{header}"')
    return "\n".join(lines) + "\n"


def make_candidate(manifest: Manifest, dsl: str, shape: Shape, knobs: dict[str, int]) -> Candidate:
    spec = manifest.dsl(dsl)
    check_knobs(spec, knobs)
    source = render_source(manifest, dsl, shape, knobs)
    digest = hashlib.sha256(source.encode()).hexdigest()
    return Candidate(
        dsl=dsl, dtype=shape.dtype, knobs=dict(sorted(knobs.items())), source=source, content_hash=digest
    )


def seed_knobs(manifest: Manifest, dsl: str, dtype: str, seed: str) -> dict[str, int]:
    """The reference ('reference') or naive ('naive') knob set of a dtype's kernel."""
    kernel = manifest.dsl(dsl).kernels.get(dtype)
    if kernel is None:
        raise ConfigError(f"dsl {dsl!r} has no kernel for dtype {dtype!r} in the manifest")
    return dict(kernel.reference if seed == "reference" else kernel.naive)


def knobs_summary(knobs: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
