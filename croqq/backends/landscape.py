"""A recorded tuning landscape: every measured configuration of one kernel on one problem, read from a
cache file in Kernel Tuner's format.

The file is JSON, optionally gzipped: ``tune_params_keys`` (the knob names, in the order of a cache key),
``tune_params`` (each knob's values) and ``cache``, which maps ``"v1,v2,..."`` (the values in key order) to
a record with ``time`` (the mean, in ms) and ``times`` (the repeats). A record whose ``time`` is not a
number (Kernel Tuner writes ``"InvalidConfig"``, ``"CompilationFailedConfig"``, ``"RuntimeFailedConfig"``)
is an invalid configuration, like one absent from the cache. Knob values must be integers (croqq's knobs
are ``#define`` macros).

The replay backend (:mod:`croqq.backends.replay`) measures against it, and the tuning benchmark runs
search strategies on it.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from croqq.errors import ConfigError

Config = tuple[int, ...]


@dataclass(frozen=True)
class Record:
    """One measured configuration: its mean time and the repeats it was measured with (ms)."""

    time_ms: float
    times_ms: tuple[float, ...]


@dataclass(frozen=True)
class Landscape:
    """Every valid configuration's record; ``space`` holds every knob, single-valued ones included."""

    name: str
    keys: tuple[str, ...]
    space: dict[str, list[int]]
    records: dict[Config, Record] = field(repr=False)
    problem: tuple[int, ...] = ()

    def config(self, knobs: dict[str, int]) -> Config:
        """The cache key of a knob set (a knob the set lacks takes its only value, when it has one)."""
        try:
            return tuple(knobs[k] if k in knobs else _only(self.space, k) for k in self.keys)
        except KeyError as exc:
            raise ConfigError(f"landscape {self.name}: knob {exc.args[0]} has no value") from exc

    def knobs(self, config: Config) -> dict[str, int]:
        return dict(zip(self.keys, config, strict=True))

    def record(self, knobs: dict[str, int]) -> Record | None:
        """The record of a knob set, or None when it is invalid (absent, or recorded as a failure)."""
        return self.records.get(self.config(knobs))

    def sample_ms(self, knobs: dict[str, int], rng: random.Random, repeats: int = 1) -> float | None:
        """A measurement: the median of ``repeats`` draws from the recorded repeats (None: invalid)."""
        rec = self.record(knobs)
        if rec is None:
            return None
        return statistics.median(rng.choice(rec.times_ms) for _ in range(max(1, repeats)))

    @cached_property
    def optimum(self) -> tuple[dict[str, int], float]:
        """The fastest recorded configuration and its mean time."""
        config, rec = min(self.records.items(), key=lambda item: item[1].time_ms)
        return self.knobs(config), rec.time_ms

    @cached_property
    def tunable(self) -> dict[str, list[int]]:
        """The knobs that take more than one value."""
        return {k: v for k, v in self.space.items() if len(v) > 1}

    @cached_property
    def first_valid(self) -> dict[str, int]:
        """The valid configuration with the smallest values, knob by knob in key order (a seed that
        knows nothing of the times)."""
        return self.knobs(min(self.records))

    @property
    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.space.values())


def _only(space: dict[str, list[int]], knob: str) -> int:
    values = space[knob]
    if len(values) != 1:
        raise KeyError(knob)
    return values[0]


def _read(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: landscape file not found") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the landscape file ({exc.strerror})") from exc
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return json.loads(data)
    except (OSError, EOFError, ValueError) as exc:
        raise ConfigError(f"{path}: not a Kernel Tuner cache file (JSON, optionally gzipped): {exc}") from exc


def _int_values(path: Path, knob: str, values: Any) -> list[int]:
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{path}: tune_params[{knob!r}] must be a non-empty list of values")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(
            f"{path}: knob {knob} has non-integer values {values[:4]}; croqq knobs are integers"
        )
    return list(values)


def _record(raw: Any) -> Record | None:
    if not isinstance(raw, dict):
        return None
    mean = raw.get("time")
    if not isinstance(mean, int | float) or isinstance(mean, bool) or not math.isfinite(mean) or mean <= 0:
        return None
    times = raw.get("times")
    repeats = tuple(float(t) for t in times if isinstance(t, int | float)) if isinstance(times, list) else ()
    return Record(time_ms=float(mean), times_ms=repeats or (float(mean),))


def load_landscape(path: Path, name: str | None = None) -> Landscape:
    """Read a cache file; any problem is one ConfigError line naming the file and what is wrong."""
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a Kernel Tuner cache file (expected a JSON object)")
    missing = [k for k in ("tune_params_keys", "tune_params", "cache") if k not in raw]
    if missing:
        raise ConfigError(f"{path}: not a Kernel Tuner cache file (missing {', '.join(missing)})")
    keys = raw["tune_params_keys"]
    params = raw["tune_params"]
    if not isinstance(keys, list) or not isinstance(params, dict) or set(keys) != set(params):
        raise ConfigError(f"{path}: tune_params_keys and tune_params must name the same knobs")
    if not isinstance(raw["cache"], dict):
        raise ConfigError(f'{path}: cache must map "v1,v2,..." to a record')
    space = {k: _int_values(path, k, params[k]) for k in keys}
    records: dict[Config, Record] = {}
    for key, value in raw["cache"].items():
        try:
            config = tuple(int(v) for v in str(key).split(","))
        except ValueError as exc:
            raise ConfigError(f"{path}: cache key {key!r} is not a list of integers") from exc
        if len(config) != len(keys):
            raise ConfigError(f"{path}: cache key {key!r} has {len(config)} values for {len(keys)} knobs")
        rec = _record(value)
        if rec is not None:
            records[config] = rec
    if not records:
        raise ConfigError(f"{path}: the cache holds no valid measured configuration")
    problem = raw.get("problem_size")
    dims = tuple(problem) if isinstance(problem, list) and all(isinstance(d, int) for d in problem) else ()
    label = name or path.name.split(".")[0]
    return Landscape(name=label, keys=tuple(keys), space=space, records=records, problem=dims)
