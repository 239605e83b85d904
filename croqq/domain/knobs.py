"""Candidates: one self-contained source (plus the headers it includes) that IMPLEMENT builds.

A knob candidate is the special case of a source rendered from the dtype's template (shape and knob
macros, then the family's header); an agent's candidate is any source that passes the checks. Either way
the identity is :func:`croqq.domain.source.content_hash` (normalized source, header contents, flags,
compiler version), so the same idea phrased twice is recognized as a repeat.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from croqq.domain import source as src
from croqq.domain.manifest import DslSpec, Manifest
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError


class Candidate(BaseModel):
    """What IMPLEMENT builds and MEASURE times: one source, its header closure, how it is compiled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dsl: str
    dtype: str
    knobs: dict[str, int] = Field(description="The knob macros the source defines.")
    source: str = Field(description="The logical source (quoted includes by plain header name).")
    headers: dict[str, str] = Field(default_factory=dict, description="name -> content, transitively.")
    flags: list[str] = Field(default_factory=list)
    toolchain: str = ""
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


def include_resolver(manifest: Manifest, dsl: str, kernels_dir: Path) -> src.HeaderResolver:
    """The manifest's include folders of a dsl (relative to ``kernels_dir``)."""
    return src.HeaderResolver(tuple(kernels_dir / d for d in manifest.dsl(dsl).build.include_dirs))


def compile_flags(manifest: Manifest, dsl: str, dtype: str) -> list[str]:
    build = manifest.dsl(dsl).build
    return [*build.flags, f"-arch={build.arch}", *build.dtype_flags.get(dtype, [])]


def source_candidate(
    manifest: Manifest,
    dsl: str,
    dtype: str,
    source: str,
    headers: dict[str, str],
    toolchain: str,
) -> Candidate:
    """A candidate from a logical source and its header closure."""
    flags = compile_flags(manifest, dsl, dtype)
    return Candidate(
        dsl=dsl,
        dtype=dtype,
        knobs=src.knob_values(source, manifest.dsl(dsl).knobs),
        source=source,
        headers=headers,
        flags=flags,
        toolchain=toolchain,
        content_hash=src.content_hash(source, headers, flags, toolchain),
    )


def resolve_candidate(
    manifest: Manifest, dsl: str, dtype: str, source: str, kernels_dir: Path, toolchain: str
) -> Candidate:
    """A candidate whose headers come from the manifest's include folders (SourceError if one does not)."""
    headers = src.header_closure(source, src.read_from(include_resolver(manifest, dsl, kernels_dir)))
    return source_candidate(manifest, dsl, dtype, source, headers, toolchain)


def make_candidate(
    manifest: Manifest,
    dsl: str,
    shape: Shape,
    knobs: dict[str, int],
    kernels_dir: Path,
    toolchain: str,
) -> Candidate:
    """The knob candidate: the dtype's template rendered with these knob values."""
    check_knobs(manifest.dsl(dsl), knobs)
    source = render_source(manifest, dsl, shape, knobs)
    return resolve_candidate(manifest, dsl, shape.dtype, source, kernels_dir, toolchain)


def seed_knobs(manifest: Manifest, dsl: str, dtype: str, seed: str) -> dict[str, int]:
    """The reference ('reference') or naive ('naive') knob set of a dtype's kernel."""
    kernel = manifest.dsl(dsl).kernels.get(dtype)
    if kernel is None:
        raise ConfigError(f"dsl {dsl!r} has no kernel for dtype {dtype!r} in the manifest")
    return dict(kernel.reference if seed == "reference" else kernel.naive)


def knobs_summary(knobs: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
