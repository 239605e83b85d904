"""Value objects that cross layer boundaries: ideas, builds, measurements, profiles.

A failing candidate is one of these values with a reason, never an exception.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["ok", "wrong_answer", "crash", "hang", "invalid"]  # invalid: faster than the GPU's peak
Bottleneck = Literal["memory", "compute", "latency", "launch", "unknown"]
Strategy = Literal["refine", "escalate", "radical"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Idea(_Record):
    """A proposal: which knobs to set, why, and the content hash of the resulting source."""

    summary: str = Field(min_length=1, max_length=300)
    tag: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    knobs: dict[str, int]
    content_hash: str = Field(min_length=12)
    strategy: Strategy = "refine"
    proposer: str = "search"


class BuildOutcome(_Record):
    """IMPLEMENT's result: an artifact reference, or a compile failure with its log."""

    ok: bool
    artifact: str = Field("", description="Backend-specific reference to the built kernel.")
    reason: str = ""
    log: str = ""
    seconds: float = 0.0


class GpuSnapshot(_Record):
    """Clocks, temperature and clock-event (throttle) reasons at one instant."""

    sm_clock_mhz: int = 0
    mem_clock_mhz: int = 0
    temp_c: int = 0
    power_w: float = 0.0
    throttle_reasons: list[str] = []


class Measurement(_Record):
    """One timed run of one kernel (after verification)."""

    outcome: Outcome
    tflops: float = Field(0.0, ge=0)
    hw_eff_pct: float = Field(0.0, ge=0)
    median_ms: float = Field(0.0, ge=0)
    min_ms: float = Field(0.0, ge=0)
    max_ms: float = Field(0.0, ge=0)
    repeats: int = Field(0, ge=0)
    verified: bool = False
    detail: str = ""
    start: GpuSnapshot | None = None
    end: GpuSnapshot | None = None
    raw: str = Field("", description="Raw timing output, stored under perf/.")

    @property
    def spread_pct(self) -> float:
        return 100.0 * (self.max_ms / self.min_ms - 1.0) if self.min_ms > 0 else 0.0


class Confirmation(_Record):
    """Candidate and best re-measured interleaved on the same GPU."""

    candidate_tflops: float
    best_tflops: float
    rounds: int


class MeasureResult(_Record):
    """MEASURE's result: the candidate, an optional confirmation, the best re-measured after a migration."""

    candidate: Measurement
    confirmation: Confirmation | None = None
    rebased_best_tflops: float | None = None
    vendor_tflops: float | None = None
    gpu_uuid: str = ""


class Profile(_Record):
    bottleneck: Bottleneck
    metrics: dict[str, float] = {}
    raw: str = ""
