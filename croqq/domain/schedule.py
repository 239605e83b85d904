"""The shape schedule: every (dtype, M, N, K) the scenarios name, deduplicated and prioritized.

Priority: shapes already active (being resumed) first, then by Euclidean distance from the manifest's
reference shape in log2 space; ties by dtype (manifest order), then M, N, K.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from croqq.domain.manifest import Manifest
from croqq.domain.shapes import Shape, check_constraints, check_dtype

DONE = "done"


class ScheduledShape(BaseModel):
    """One entry of the schedule; ``rank`` is its position (0 = first to run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    dtype: str
    m: int
    n: int
    k: int
    scenarios: list[str]
    region: str
    rank: int

    @property
    def shape(self) -> Shape:
        return Shape(dtype=self.dtype, m=self.m, n=self.n, k=self.k)


def scenario_dims(manifest: Manifest) -> dict[tuple[int, int, int], list[str]]:
    """All (M, N, K) the scenarios name that pass the size constraints, each with its scenario list."""
    members: dict[tuple[int, int, int], list[str]] = {}
    c = manifest.constraints
    for name, scenario in manifest.scenarios.items():
        for pattern in scenario.shapes:
            names = sorted({d for d in pattern if isinstance(d, str)})
            for values in itertools.product(*(scenario.vars[v] for v in names)):
                env = dict(zip(names, values, strict=True))
                m, n, k = (env[d] if isinstance(d, str) else d for d in pattern)
                if m < c.min_m or n < c.min_n or k < c.min_k:
                    continue
                lst = members.setdefault((m, n, k), [])
                if name not in lst:
                    lst.append(name)
    return members


def region_of(manifest: Manifest, m: int, n: int, k: int) -> str:
    r = manifest.near_region
    near = r.m[0] <= m <= r.m[1] and r.n[0] <= n <= r.n[1] and r.k[0] <= k <= r.k[1]
    return "near" if near else "far"


def log_distance(manifest: Manifest, m: int, n: int, k: int) -> float:
    rm, rn, rk = manifest.reference_shape
    return math.sqrt(
        (math.log2(m) - math.log2(rm)) ** 2
        + (math.log2(n) - math.log2(rn)) ** 2
        + (math.log2(k) - math.log2(rk)) ** 2
    )


def expand_dtypes(manifest: Manifest, dtype: str) -> list[str]:
    if dtype == "all":
        return [name for name, spec in manifest.dtypes.items() if spec.in_all]
    check_dtype(manifest, dtype)
    return [dtype]


def build_schedule(
    manifest: Manifest,
    dtype: str,
    only: tuple[int, int, int] | None = None,
    active: Iterable[str] = (),
) -> list[ScheduledShape]:
    """The ordered schedule for ``dtype`` (a manifest dtype or ``all``).

    ``only`` restricts it to one (M, N, K) (which must pass the constraints; it need not be in a scenario,
    then its scenario list is ``["custom"]``). ``active`` names keys to put first (resume).
    """
    dtypes = expand_dtypes(manifest, dtype)
    dims = scenario_dims(manifest)
    if only is not None:
        check_constraints(manifest, *only)
        dims = {only: dims.get(only, ["custom"])}
    active_keys = set(active)
    order = {d: i for i, d in enumerate(manifest.dtypes)}
    entries = [(dt, mnk, sorted(sc)) for dt in dtypes for mnk, sc in dims.items()]

    def priority(entry: tuple[str, tuple[int, int, int], list[str]]) -> tuple[int, float, int, int, int, int]:
        dt, (m, n, k), _ = entry
        key = f"{dt}_{m}x{n}x{k}"
        return (0 if key in active_keys else 1, round(log_distance(manifest, m, n, k), 9), order[dt], m, n, k)

    entries.sort(key=priority)
    return [
        ScheduledShape(
            key=f"{dt}_{m}x{n}x{k}",
            dtype=dt,
            m=m,
            n=n,
            k=k,
            scenarios=sc,
            region=region_of(manifest, m, n, k),
            rank=rank,
        )
        for rank, (dt, (m, n, k), sc) in enumerate(entries)
    ]


def is_complete(status: str, current_iter: int, max_iter: int) -> bool:
    """Skip a shape only when it is done *and* has all its iterations; a short 'done' is reopened."""
    return status == DONE and current_iter >= max_iter
