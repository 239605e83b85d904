"""GEMM shapes and their keys: ``<dtype>_<M>x<N>x<K>``."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from croqq.domain.manifest import Manifest
from croqq.errors import ConfigError

_SHAPE_RE = re.compile(r"^(\d+)x(\d+)x(\d+)$")
_KEY_RE = re.compile(r"^([a-z0-9]+)_(\d+)x(\d+)x(\d+)$")


class Shape(BaseModel):
    """One GEMM problem of one dtype."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)

    @property
    def key(self) -> str:
        return f"{self.dtype}_{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def parse_dims(text: str) -> tuple[int, int, int]:
    """``"4096x8192x4096"`` -> (4096, 8192, 4096)."""
    match = _SHAPE_RE.match(text.strip().lower())
    if not match:
        raise ConfigError(f"shape {text!r} is not MxNxK with three positive integers, e.g. 4096x8192x4096")
    m, n, k = (int(g) for g in match.groups())
    if min(m, n, k) <= 0:
        raise ConfigError(f"shape {text!r} has a zero dimension")
    return m, n, k


def parse_key(key: str) -> Shape:
    """``"f16_4096x8192x4096"`` -> Shape."""
    match = _KEY_RE.match(key)
    if not match:
        raise ConfigError(f"key {key!r} is not <dtype>_<M>x<N>x<K>, e.g. f16_4096x8192x4096")
    dtype, m, n, k = match.groups()
    return Shape(dtype=dtype, m=int(m), n=int(n), k=int(k))


def check_constraints(manifest: Manifest, m: int, n: int, k: int) -> None:
    """Refuse a shape below the manifest's size constraints, naming the limit."""
    c = manifest.constraints
    for name, value, low in (("M", m, c.min_m), ("N", n, c.min_n), ("K", k, c.min_k)):
        if value < low:
            raise ConfigError(f"shape {m}x{n}x{k}: {name}={value} is below the minimum {name}>={low}")


def check_dtype(manifest: Manifest, dtype: str) -> None:
    if dtype not in manifest.dtypes:
        known = "|".join([*manifest.dtypes, "all"])
        raise ConfigError(f"unknown dtype {dtype!r}; use --dtype {known}")
