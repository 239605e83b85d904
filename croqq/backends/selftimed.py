"""Self-timed kernel families: the kernel file brings its own ``main`` and timer (as CroqTile/choreo-
generated CUDA does), and croqq only runs it and reads what it printed.

The family's ``run`` entry of the manifest (:class:`~croqq.domain.manifest.RunSpec`) names the variables
that set the binary's warm-up and repeat counts, and the patterns of its TFLOPS line (the last match on
stdout counts), of its time per run (optional: else derived from the TFLOPS) and of a line saying the
kernel checked its own result (optional). croqq does not verify such a result: every measurement says its
timing is self-reported and ``verified`` is false; its detail says whether the kernel claims a check. A
TFLOPS above the GPU's dense peak is ``invalid``, as the harness's would be.
"""

from __future__ import annotations

import re

from croqq.domain.manifest import RunSpec
from croqq.domain.records import GpuSnapshot, Measurement
from croqq.errors import InvalidRecordError


def env(spec: RunSpec, warmup: int | None = None, repeats: int | None = None) -> dict[str, str]:
    """The variables that set the binary's counts (the family's, unless given)."""
    return {
        spec.warmup_env: str(spec.warmup if warmup is None else warmup),
        spec.repeats_env: str(spec.repeats if repeats is None else repeats),
    }


def _last(pattern: str, text: str) -> float | None:
    found = re.findall(pattern, text)
    if not found:
        return None
    last = found[-1]
    return float(last[0] if isinstance(last, tuple) else last)


def read(stdout: str, spec: RunSpec) -> tuple[float, float | None, bool]:
    """(TFLOPS, time of one run in ms or None, whether the kernel says it checked its result);
    InvalidRecordError, in one line, when stdout has no TFLOPS line."""
    try:
        tflops = _last(spec.tflops, stdout)
        time_ms = _last(spec.time_ms, stdout) if spec.time_ms else None
    except ValueError as exc:  # the group took something that is no number
        raise InvalidRecordError(f"the self-timed kernel printed an unreadable figure: {exc}") from None
    if tflops is None:
        raise InvalidRecordError(f"the self-timed kernel printed no line matching {spec.tflops!r}")
    return tflops, time_ms, bool(spec.verified and re.search(spec.verified, stdout))


def measurement(
    stdout: str,
    spec: RunSpec,
    flops: float,
    peak_tflops: float,
    snapshots: tuple[GpuSnapshot, GpuSnapshot],
    raw: str,
) -> Measurement:
    """The measurement of one self-timed run that exited 0."""
    start, end = snapshots
    tflops, time_ms, claims = read(stdout, spec)
    checked = (
        "the kernel says it checked its result" if claims else "the kernel reports no check of its result"
    )
    detail = f"self-reported timing; croqq did not verify the result ({checked})"
    if not 0 < tflops <= peak_tflops:
        why = f"self-reported {tflops:g} TFLOPS is not within (0, {peak_tflops:g}], the GPU's dense peak"
        return Measurement(
            outcome="invalid", timing="self-reported", detail=why, start=start, end=end, raw=raw
        )
    ms = time_ms if time_ms else flops / (tflops * 1e12) * 1e3
    return Measurement(
        outcome="ok",
        tflops=tflops,
        hw_eff_pct=round(100.0 * tflops / peak_tflops, 3),
        median_ms=ms,
        min_ms=ms,
        max_ms=ms,
        repeats=spec.repeats,
        verified=False,
        timing="self-reported",
        detail=detail,
        start=start,
        end=end,
        raw=raw,
    )
