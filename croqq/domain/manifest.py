"""``kernels/manifest.json`` loaded into validated models (unknown fields are refused)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from croqq.domain import rules
from croqq.errors import ConfigError

Dim = int | str  # a literal size or the name of one of the scenario's variables


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Constraints(_Strict):
    min_m: int = Field(gt=0)
    min_n: int = Field(gt=0)
    min_k: int = Field(gt=0)


class Region(_Strict):
    m: tuple[int, int]
    n: tuple[int, int]
    k: tuple[int, int]


class Mode(_Strict):
    max_iter: int = Field(gt=0)
    seed: Literal["reference", "naive"]
    dsl: str = Field(
        description="The kernel family a submission of this mode tunes unless it names one (--dsl, CROQQ_DSL)"
    )


DEFAULT_MODE = "from_current_best"  # `croqq submit`'s and `croqq up`'s; `croqq measure` seeds from its family


SPARSE_FAMILY = "gemm_sparse24"  # a dtype of this family has a 2:4 structured-sparse A


class DtypeSpec(_Strict):
    family: str
    atol: float = Field(gt=0)
    rtol: float = Field(gt=0)
    a_bytes: int = Field(gt=0)
    c_bytes: int = Field(gt=0)
    in_all: bool = Field(
        True, description="Part of `--dtype all` (the 2:4 sparse dtype is asked for by name)."
    )


class Scenario(_Strict):
    vars: dict[str, list[int]]
    shapes: list[tuple[Dim, Dim, Dim]] = Field(min_length=1)

    @model_validator(mode="after")
    def _vars_used(self) -> Scenario:
        for pattern in self.shapes:
            for dim in pattern:
                if isinstance(dim, str) and dim not in self.vars:
                    raise ValueError(f"shape pattern {list(pattern)} uses undefined variable {dim!r}")
        return self


class GpuSpec(_Strict):
    peak_tflops: dict[str, float]
    mem_gbps: float = Field(gt=0)
    l2_mib: float = Field(gt=0)


class KernelSpec(_Strict):
    source: str
    reference: dict[str, int]
    naive: dict[str, int]


class PackageSpec(_Strict):
    """Headers that come from an installed Python package (CUTLASS's from ``nvidia-cutlass``): toolchain
    headers like CUDA's own, never copied into a candidate; the version is part of its content hash."""

    version: str = Field(description="The exact version the family needs (pin it in pyproject.toml too).")
    include: list[str] = Field(description="Include folders, relative to the installed package's root.")


class BuildSpec(_Strict):
    compiler: str
    arch: str
    flags: list[str]
    dtype_flags: dict[str, list[str]]
    include_dirs: list[str]
    libs: list[str]
    packages: dict[str, PackageSpec] = Field(default_factory=dict)
    compile_timeout_s: float | None = Field(
        None,
        gt=0,
        le=1800,  # half an hour: a longer compile is a mistake in the manifest
        description="This family's compiles may run this long when CROQQ_COMPILE_TIMEOUT_S is shorter "
        "(one CUTLASS collective-builder instantiation takes minutes on a loaded 2-core host).",
    )

    @property
    def pins(self) -> list[str]:
        """``name==version`` of each package the headers come from (sorted): what a stored kernel needs."""
        return [f"{name}=={pkg.version}" for name, pkg in sorted(self.packages.items())]


class Rule(_Strict):
    """A knob combination the hardware cannot run: ``require`` must hold (see croqq.domain.rules)."""

    require: str
    why: str


class RunSpec(_Strict):
    """How a family's binary is run and its output read. ``harness``: croqq's harness owns ``main``,
    verification and timing (one JSON line). ``self-timed``: the kernel file brings its own ``main`` and
    timer (as CroqTile/choreo-generated CUDA does): croqq sets its warm-up and repeat counts in the
    variables named here, reads its TFLOPS (and time per run) from stdout with these patterns, and
    records the timing as self-reported and the result as not verified by croqq."""

    kind: Literal["harness", "self-timed"] = "harness"
    warmup_env: str = ""
    repeats_env: str = ""
    warmup: int = Field(10, ge=0)
    repeats: int = Field(50, ge=1)
    tflops: str = Field("", description="A regex; its first group is TFLOPS (the last match on stdout).")
    time_ms: str = Field("", description="Optional regex; its first group is the time of one run in ms.")
    verified: str = Field("", description="Optional regex: stdout matching it says the kernel checked C.")

    @model_validator(mode="after")
    def _readable(self) -> RunSpec:
        if self.kind == "harness":
            return self
        if not (self.tflops and self.warmup_env and self.repeats_env):
            raise ValueError("a self-timed family names tflops, warmup_env and repeats_env")
        for field in ("tflops", "time_ms", "verified"):
            pattern = getattr(self, field)
            try:
                groups = re.compile(pattern).groups if pattern else 1
            except re.error as exc:
                raise ValueError(f"run.{field} {pattern!r} is no regex: {exc}") from None
            if field != "verified" and groups < 1:
                raise ValueError(f"run.{field} {pattern!r} needs a group around the number")
        return self


def rule_env(shape: tuple[int, int, int], dtype: DtypeSpec) -> dict[str, int]:
    """What a rule reads besides the knobs (croqq.domain.rules.SHAPE_NAMES), for this shape and dtype."""
    m, n, k = shape
    sparse = int(dtype.family == SPARSE_FAMILY)
    return {"M": m, "N": n, "K": k, "A_BYTES": dtype.a_bytes, "C_BYTES": dtype.c_bytes, "SPARSE": sparse}


class DslSpec(_Strict):
    ext: str
    knobs: dict[str, list[int]]
    kernels: dict[str, KernelSpec]
    build: BuildSpec
    rules: list[Rule] = Field(default_factory=list)
    run: RunSpec = Field(default_factory=RunSpec)

    @model_validator(mode="after")
    def _rules_readable(self) -> DslSpec:
        known = set(self.knobs) | set(rules.SHAPE_NAMES)
        for rule in self.rules:
            unknown = sorted(rules.names(rule.require) - known)  # ValueError for what is not allowed
            if unknown:
                raise ValueError(
                    f"rule {rule.require!r} reads {unknown}: use knobs or {list(rules.SHAPE_NAMES)}"
                )
        return self

    def broken_rule(self, knobs: dict[str, int], shape: tuple[int, int, int], dtype: DtypeSpec) -> str | None:
        """Why these knobs cannot run on this shape (the first rule they break), None when they can."""
        env = {**knobs, **rule_env(shape, dtype)}
        return rules.first_broken(((r.require, r.why) for r in self.rules), env)

    @model_validator(mode="after")
    def _seeds_in_space(self) -> DslSpec:
        for dtype, kernel in self.kernels.items():
            for seed_name in ("reference", "naive"):
                seed = getattr(kernel, seed_name)
                if set(seed) != set(self.knobs):
                    raise ValueError(
                        f"{dtype} {seed_name} kernel must set exactly the knobs {sorted(self.knobs)}"
                    )
                for knob, value in seed.items():
                    if value not in self.knobs[knob]:
                        raise ValueError(
                            f"{dtype} {seed_name} kernel: {knob}={value} is not one of {self.knobs[knob]}"
                        )
        return self


REQUIRED_SCENARIOS = ("square", "sweep_m", "sweep_n", "sweep_k", "sweep_mn", "sweep_mk", "sweep_nk")


class Manifest(_Strict):
    schema_version: Literal[1]
    reference_shape: tuple[int, int, int]
    constraints: Constraints
    near_region: Region
    modes: dict[str, Mode]
    dtypes: dict[str, DtypeSpec]
    scenarios: dict[str, Scenario]
    gpus: dict[str, GpuSpec]
    dsls: dict[str, DslSpec]

    @model_validator(mode="after")
    def _complete(self) -> Manifest:
        missing = [name for name in REQUIRED_SCENARIOS if name not in self.scenarios]
        if missing:
            raise ValueError(f"missing scenario(s) {', '.join(missing)}")
        for dsl, spec in self.dsls.items():
            unknown = sorted(set(spec.kernels) - set(self.dtypes))
            if unknown:
                raise ValueError(f"dsl {dsl!r} has kernels for unknown dtype(s) {unknown}")
            for dtype, kernel in spec.kernels.items():
                for seed in ("reference", "naive"):
                    why = spec.broken_rule(getattr(kernel, seed), self.reference_shape, self.dtypes[dtype])
                    if why:
                        raise ValueError(f"dsl {dsl!r}: the {dtype} {seed} knobs break a rule: {why}")
        for mode, mspec in self.modes.items():
            if mspec.dsl not in self.dsls:
                raise ValueError(f"mode {mode!r} names dsl {mspec.dsl!r}, which 'dsls' does not define")
        for gpu, gspec in self.gpus.items():
            absent = sorted(set(self.dtypes) - set(gspec.peak_tflops))
            if absent:
                raise ValueError(f"gpu {gpu!r} has no peak_tflops for dtype(s) {absent}")
        return self

    def dsl(self, name: str) -> DslSpec:
        if name not in self.dsls:
            raise ConfigError(f"unknown dsl {name!r}; the manifest defines {', '.join(sorted(self.dsls))}")
        return self.dsls[name]

    def family(self, chosen: str | None, mode: str = DEFAULT_MODE) -> str:
        """The dsl a submission tunes: the one chosen (--dsl, CROQQ_DSL), else its mode's."""
        return chosen or self.mode(mode).dsl

    def gpu(self, name: str) -> GpuSpec:
        if name not in self.gpus:
            raise ConfigError(
                f"GPU type {name!r} has no entry in the manifest's 'gpus' (peak TFLOPS); "
                "add one to kernels/manifest.json"
            )
        return self.gpus[name]

    def mode(self, name: str) -> Mode:
        if name not in self.modes:
            raise ConfigError(f"unknown mode {name!r}; use one of {', '.join(sorted(self.modes))}")
        return self.modes[name]


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest; any problem becomes one ConfigError line naming the file."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: manifest not found (set CROQQ_MANIFEST)") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {where}: {err['msg']}") from exc


@lru_cache(maxsize=4)
def cached_manifest(path: str) -> Manifest:
    return load_manifest(Path(path))
