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


Change = Literal["knobs", "structural"]  # what a candidate changed against the best it started from
TuningPhase = Literal["knobs", "structural", "regenerate", "micro"]


class AgentUsage(_Record):
    """What one agent call cost (None where the agent does not report it)."""

    agent: str
    wall_s: float = Field(ge=0)
    exit_code: int | None = None
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None


class Idea(_Record):
    """A proposal: the candidate source, why, and its content hash."""

    summary: str = Field(min_length=1, max_length=300)
    tag: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    knobs: dict[str, int] = Field(description="The knob macros the source defines.")
    content_hash: str = Field(min_length=12)
    strategy: Strategy = "refine"
    proposer: str = "search"
    source: str = Field("", description="The logical candidate source ('' in stored records: see srcs/).")
    change: Change = "knobs"
    phase: TuningPhase = "knobs"
    agent: AgentUsage | None = None


class NeighbourKernel(_Record):
    """The best kernel of a nearest advanced neighbour (same GPU type, family and dtype), re-targeted to the
    shape that is offered it: what an agent reads as "what won next door" and what transfer proposes."""

    key: str
    distance: float = Field(ge=0, description="log2-space distance to the offered shape.")
    best_tflops: float = Field(ge=0, description="The neighbour's best, measured there.")
    peak_fraction: float = Field(ge=0, description="That best as a fraction of the GPU type's dense peak.")
    knobs: dict[str, int]
    change: Change = Field("knobs", description="knobs: the template rendered; structural: agent-written.")
    source: str = Field("", description="The kernel re-targeted to the offered shape ('' if it cannot be).")
    reason: str = Field("", description="Why it cannot be re-targeted ('' when it can).")


RejectionKind = Literal["agent", "check", "repeat"]  # the agent failed / its answer broke a rule / repeat
FAILING_KINDS: tuple[RejectionKind, ...] = ("agent", "check")  # the agent's health: backed off, never parked


class Rejection(_Record):
    """An IDEATE that produced no buildable candidate: the agent failed, or its answer failed a check.
    Stored as an attempt (no iteration id); the shape goes on."""

    proposer: str
    reason: str = Field(min_length=1, max_length=500)
    kind: RejectionKind = "check"
    agent: AgentUsage | None = None
    summary: str = ""
    content_hash: str = ""


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
    timing: Literal["harness", "self-reported"] = Field(
        "harness", description="Who timed it: croqq's harness, or the kernel's own main (self-timed family)."
    )
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
    # the GPU step that produced it (the interval the GPU was busy, on Redis's clock): for `croqq report`'s
    # duty plot; None in records written before these fields existed
    gpu_started_at: float | None = Field(None, description="Start of the GPU step, Redis clock, Unix s.")
    gpu_busy_s: float | None = Field(None, ge=0, description="How long the GPU step held the GPU, s.")


class Sibling(_Record):
    """One of an iteration's other candidates (``--candidates N``): its idea, or why it has none, its build,
    its measurement in the iteration's batch; ``repeat_of`` names the candidate it repeats (same content
    hash, or the same compiled binary), which is never built again or measured."""

    candidate: int = Field(ge=1, description="Its number among the iteration's candidates (1..N).")
    idea: Idea | None = None
    rejection: Rejection | None = None
    build: BuildOutcome | None = None
    measurement: Measurement | None = None
    repeat_of: int | None = Field(None, ge=1)

    @property
    def buildable(self) -> bool:
        """Has an idea of its own to build (not rejected, not a repeat, not built yet)."""
        return self.idea is not None and self.repeat_of is None and self.build is None

    @property
    def measurable(self) -> bool:
        """Built, and not a repeat of another candidate's binary."""
        return self.build is not None and self.build.ok and self.repeat_of is None


class Profile(_Record):
    bottleneck: Bottleneck
    metrics: dict[str, float] = {}
    raw: str = ""
    gpu_started_at: float | None = None  # the PROFILE step's GPU interval, as on MeasureResult
    gpu_busy_s: float | None = Field(None, ge=0)


class HistoryEntry(_Record):
    """One stored iteration or attempt of a shape, as an agent reads it in history.md."""

    iteration: int | None = None
    attempt: int | None = None
    after_iter: int = -1
    summary: str
    decision: str  # KEEP, DISCARD, FAIL_<reason>, BASELINE, or ATTEMPT_<reason>
    tflops: float = 0.0
    change: str = ""
    proposer: str = ""
    error: str = ""
    knobs: dict[str, int] = Field(default_factory=dict, description="The knob values measured or tried.")
    candidate: int | None = Field(None, ge=1, description="Set on a sibling: its number in the iteration.")

    @property
    def field(self) -> str:
        own = f"i{self.iteration:03d}" if self.iteration is not None else f"a{self.attempt:03d}"
        return own if self.candidate is None else f"{own}c{self.candidate}"

    @property
    def order(self) -> tuple[int, int, int]:
        where = self.after_iter if self.iteration is None else self.iteration
        return (where, self.iteration is None, self.candidate or 0)
