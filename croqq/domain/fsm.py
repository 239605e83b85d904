"""The per-shape tuning loop as a pure finite state machine: ``transition(loop, event) -> loop``.

    INIT -> BASELINE -> STORE -> [PROFILE] -> IDEATE -> IMPLEMENT -> MEASURE -> DECIDE -> STORE -> ... -> DONE
                                  |                        |  compile failure
                                  +------------------------+-> STORE(attempt) -> IDEATE  (no iteration id)
                                   rejected (the agent failed, or its answer failed a check)

- BASELINE first builds the seed kernel (``Built``, on a build worker), then measures it
  (``BaselineMeasured``, on the GPU); a seed that does not build is an error of the manifest, not a
  candidate outcome.
- PROFILE runs before iteration 1, every ``profile_every`` iterations, after a KEEP and at 3 consecutive
  non-KEEPs (a stall).
- Consecutive non-KEEPs are a strategy signal, never a stop: 5 escalates the proposer, 10 goes radical.
- A shape is DONE only when ``current_iter >= max_iter``.
- Kernels are built on build workers only. A loop whose best kernel has no artifact (rebuilt from a
  checkpoint) builds it before PROFILE or MEASURE (``BestBuilt``, phase unchanged); a GPU step that finds
  an artifact missing from the artifact store (``ArtifactLost``) clears it: the best is built again the
  same way, a lost candidate goes back to IMPLEMENT, a lost seed back to its build.
- An iteration may gather several candidates (``Loop.candidates``): IDEATE proposes them all, IMPLEMENT
  builds them all, MEASURE measures the built, distinct ones in one batch. ``Pending`` holds one of them
  (the primary: the one DECIDE and STORE see, as with one candidate) and the others as ``siblings``; the
  primary is the first proposed, then the first built, then the best measured (:func:`promote`).
- An event that the current phase does not accept raises :class:`IllegalTransitionError`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from croqq.domain.decide import BASELINE, KEEP, counted_tflops, decide
from croqq.domain.records import (
    FAILING_KINDS,
    BuildOutcome,
    Idea,
    Measurement,
    MeasureResult,
    Profile,
    Rejection,
    Sibling,
    Strategy,
)
from croqq.errors import IllegalTransitionError

STALL_PROFILE = 3
STALL_ESCALATE = 5
STALL_RADICAL = 10
MAX_CANDIDATES = 8  # the most candidates one iteration gathers (``croqq submit --candidates``)


class Phase(StrEnum):
    INIT = "INIT"
    BASELINE = "BASELINE"
    PROFILE = "PROFILE"
    IDEATE = "IDEATE"
    IMPLEMENT = "IMPLEMENT"
    MEASURE = "MEASURE"
    DECIDE = "DECIDE"
    STORE = "STORE"
    DONE = "DONE"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Start(_Event):
    type: Literal["start"] = "start"


class BaselineMeasured(_Event):
    type: Literal["baseline_measured"] = "baseline_measured"
    knobs: dict[str, int]
    source: str = ""
    measurement: Measurement
    vendor_tflops: float | None = None
    artifact: str = ""
    gpu_started_at: float | None = None  # the step's GPU interval (MeasureResult's fields of the same name)
    gpu_busy_s: float | None = None


class Profiled(_Event):
    type: Literal["profiled"] = "profiled"
    profile: Profile


class Proposed(_Event):
    """IDEATE's candidates: ``idea`` is candidate number ``candidate``, the others are ``siblings``."""

    type: Literal["proposed"] = "proposed"
    idea: Idea
    candidate: int = Field(1, ge=1)
    siblings: list[Sibling] = []


class Rejected(_Event):
    """IDEATE produced no buildable candidate: stored as an attempt, then IDEATE again."""

    type: Literal["rejected"] = "rejected"
    rejection: Rejection
    siblings: list[Sibling] = []  # the iteration's other candidates, each rejected too


class Built(_Event):
    """IMPLEMENT's builds: the primary's, and the siblings' by candidate number (``repeats``: a sibling
    whose binary is the same as an earlier candidate's -> that candidate's number)."""

    type: Literal["built"] = "built"
    build: BuildOutcome
    builds: dict[int, BuildOutcome] = {}
    repeats: dict[int, int] = {}


class BestBuilt(_Event):
    """The best kernel built again on a build worker (its artifact was missing), before PROFILE or MEASURE."""

    type: Literal["best_built"] = "best_built"
    artifact: str = Field(min_length=1)


class ArtifactLost(_Event):
    """A GPU step found this artifact missing or corrupt in the artifact store; it has to be built again."""

    type: Literal["artifact_lost"] = "artifact_lost"
    artifact: str


class Measured(_Event):
    """MEASURE's result for candidate ``candidate`` (None: the primary), the best of the batch; the other
    candidates measured in the batch by number in ``measurements``."""

    type: Literal["measured"] = "measured"
    result: MeasureResult
    candidate: int | None = None
    measurements: dict[int, Measurement] = {}


class Decided(_Event):
    type: Literal["decided"] = "decided"
    decision: str


class Stored(_Event):
    type: Literal["stored"] = "stored"
    iteration: int | None = Field(
        None, description="The stored iteration id; None for a compile-failed attempt."
    )


class Reopen(_Event):
    type: Literal["reopen"] = "reopen"
    max_iter: int = Field(gt=0)


class Pending(BaseModel):
    """The iteration (or attempt) under construction, from IDEATE (or BASELINE) to STORE."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration: int | None = None
    idea: Idea | None = None
    rejection: Rejection | None = None
    build: BuildOutcome | None = None
    measure: MeasureResult | None = None
    decision: str | None = None
    tflops: float = 0.0
    best_before: float = 0.0
    attempt_no: int | None = None
    candidate: int = Field(1, ge=1, description="The primary's number among the iteration's candidates.")
    siblings: list[Sibling] = Field(default_factory=list, description="The iteration's other candidates.")

    def sibling(self, candidate: int) -> Sibling:
        for sib in self.siblings:
            if sib.candidate == candidate:
                return sib
        raise IllegalTransitionError(f"candidate {candidate} is not a sibling of candidate {self.candidate}")

    def with_siblings(self, update: dict[int, dict[str, object]]) -> Pending:
        """The siblings named in ``update`` (by number) with those fields changed."""
        sibs = [
            s.model_copy(update=update[s.candidate]) if s.candidate in update else s for s in self.siblings
        ]
        return self.model_copy(update={"siblings": sibs})


def promote(pending: Pending, candidate: int, measurement: Measurement | None = None) -> Pending:
    """Make sibling ``candidate`` the primary; the former primary becomes a sibling (with ``measurement``,
    its own in the batch, if it had one)."""
    if candidate == pending.candidate:
        return pending
    chosen = pending.sibling(candidate)
    former = Sibling(
        candidate=pending.candidate, idea=pending.idea, build=pending.build, measurement=measurement
    )
    rest = [s for s in pending.siblings if s.candidate != candidate] + [former]
    return pending.model_copy(
        update={
            "idea": chosen.idea,
            "build": chosen.build,
            "candidate": candidate,
            "siblings": sorted(rest, key=lambda s: s.candidate),
        }
    )


class Loop(BaseModel):
    """A shape's persisted loop state; everything transitions need and nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    phase: Phase = Phase.INIT
    max_iter: int = Field(gt=0)
    candidates: int = Field(1, ge=1, le=MAX_CANDIDATES, description="Candidates gathered per iteration.")
    profile_every: int = Field(10, ge=1)
    noise_margin: float = Field(0.015, ge=0)
    current_iter: int = -1
    best_iter: int = -1
    best_tflops: float = 0.0
    baseline_tflops: float = 0.0
    vendor_tflops: float | None = None
    best_knobs: dict[str, int] = {}
    best_source: str = Field("", description="The best kernel's logical source ('' before the baseline).")
    best_tag: str = ""
    best_artifact: str = Field("", description="The best kernel's built artifact (empty: build it again).")
    seed_knobs: dict[str, int] = {}
    seed_source: str = ""
    consecutive_discards: int = 0
    attempts: int = 0
    attempts_in_a_row: int = Field(
        0,
        description="Attempts since the last iteration with a candidate repeated, refused or unbuildable: "
        "a proposer stuck on them parks the shape.",
    )
    profile_due: bool = False
    last_profile: Profile | None = None
    profile_fresh: bool = False
    pending: Pending | None = None
    keeps: int = 0
    fails: int = 0

    @property
    def strategy(self) -> Strategy:
        if self.consecutive_discards >= STALL_RADICAL:
            return "radical"
        if self.consecutive_discards >= STALL_ESCALATE:
            return "escalate"
        return "refine"

    @property
    def complete(self) -> bool:
        return self.current_iter >= self.max_iter


class Resynced(_Event):
    """STORE found the results repo disagreeing with the live loop: its iteration (or attempt) already
    committed by another step (Redis lost its tail and the loop re-ran, or a cold start raced an
    in-flight STORE), or a gap (the repo lost commits the loop counted). The repo wins: the loop is
    replaced by the one its checkpoint holds."""

    type: Literal["resynced"] = "resynced"
    loop: Loop


Event = Annotated[
    Start
    | BaselineMeasured
    | Profiled
    | Proposed
    | Rejected
    | Built
    | BestBuilt
    | ArtifactLost
    | Measured
    | Decided
    | Stored
    | Reopen
    | Resynced,
    Field(discriminator="type"),
]


def _illegal(loop: Loop, event: _Event) -> IllegalTransitionError:
    return IllegalTransitionError(
        f"event {getattr(event, 'type', event)!r} is not accepted in phase {loop.phase}"
    )


def _profile_due_after(loop: Loop, decision: str) -> bool:
    nxt = loop.current_iter + 1
    return (
        nxt == 1
        or nxt % loop.profile_every == 0
        or decision == KEEP
        or loop.consecutive_discards == STALL_PROFILE
    )


def _after_store(loop: Loop) -> Loop:
    if loop.complete:
        return loop.model_copy(update={"phase": Phase.DONE, "pending": None})
    phase = Phase.PROFILE if loop.profile_due else Phase.IDEATE
    return loop.model_copy(update={"phase": phase, "pending": None})


def _baseline(loop: Loop, ev: BaselineMeasured) -> Loop:
    ok = ev.measurement.outcome == "ok"
    decision = BASELINE if ok else f"FAIL_{ev.measurement.outcome}"
    tflops = ev.measurement.tflops if ok else 0.0
    pending = Pending(
        iteration=0,
        measure=MeasureResult(
            candidate=ev.measurement,
            vendor_tflops=ev.vendor_tflops,
            gpu_started_at=ev.gpu_started_at,
            gpu_busy_s=ev.gpu_busy_s,
        ),
        decision=decision,
        tflops=tflops,
    )
    return loop.model_copy(
        update={
            "phase": Phase.STORE,
            "pending": pending,
            "seed_knobs": ev.knobs,
            "seed_source": ev.source,
            "vendor_tflops": ev.vendor_tflops,
            "best_artifact": ev.artifact,
        }
    )


def _counts_as_stuck(pending: Pending) -> bool:
    """A repeated, refused or unbuildable candidate; not the agent's own failure (its back-off handles
    that, and the shape waits)."""
    return pending.rejection is None or pending.rejection.kind not in FAILING_KINDS


def _stored(loop: Loop, ev: Stored) -> Loop:
    pending = loop.pending
    if pending is None:
        raise IllegalTransitionError("STORE finished but no iteration was pending")
    if pending.attempt_no is not None:  # a compile failure: no iteration id consumed
        if ev.iteration is not None:
            raise IllegalTransitionError(f"an attempt was stored as iteration {ev.iteration}")
        return loop.model_copy(
            update={
                "phase": Phase.IDEATE,
                "pending": None,
                "attempts": pending.attempt_no,
                "attempts_in_a_row": loop.attempts_in_a_row + int(_counts_as_stuck(pending)),
            }
        )
    if ev.iteration != pending.iteration:
        raise IllegalTransitionError(
            f"stored iteration {ev.iteration} but iteration {pending.iteration} was pending"
        )
    if pending.iteration == 0:
        updated = loop.model_copy(
            update={
                "current_iter": 0,
                "best_iter": 0,
                "best_tflops": pending.tflops,
                "baseline_tflops": pending.tflops,
                "best_knobs": loop.seed_knobs,
                "best_source": loop.seed_source,
                "best_tag": "baseline",
                "profile_due": True,
                "attempts_in_a_row": 0,
            }
        )
        return _after_store(updated)
    decision = pending.decision or ""
    keep = decision == KEEP
    idea = pending.idea
    update: dict[str, object] = {
        "current_iter": pending.iteration,
        "profile_fresh": False,
        "attempts_in_a_row": 0,
        "consecutive_discards": 0 if keep else loop.consecutive_discards + 1,
        "keeps": loop.keeps + int(keep),
        "fails": loop.fails + int(decision.startswith("FAIL_")),
    }
    if keep and idea is not None:
        update |= {
            "best_iter": pending.iteration,
            "best_tflops": pending.tflops,
            "best_knobs": idea.knobs,
            "best_source": idea.source,
            "best_tag": idea.tag,
            "best_artifact": pending.build.artifact if pending.build else "",
        }
    elif pending.measure is not None and pending.measure.rebased_best_tflops is not None:
        update["best_tflops"] = pending.measure.rebased_best_tflops
    updated = loop.model_copy(update=update)
    return _after_store(updated.model_copy(update={"profile_due": _profile_due_after(updated, decision)}))


def _built(loop: Loop, pending: Pending, ev: Built) -> Loop:
    """The builds recorded; a primary that failed gives way to the first sibling that built; none built:
    a compile-failure attempt (no iteration id) that lists every sibling."""
    fields: dict[int, dict[str, object]] = {n: {"build": b} for n, b in ev.builds.items()}
    for n, earlier in ev.repeats.items():
        fields.setdefault(n, {})["repeat_of"] = earlier
    built = pending.with_siblings(fields).model_copy(update={"build": ev.build})
    if not ev.build.ok:
        first = next((s for s in built.siblings if s.measurable), None)
        if first is None:
            attempt = built.model_copy(update={"attempt_no": loop.attempts + 1})
            return loop.model_copy(update={"phase": Phase.STORE, "pending": attempt})
        built = promote(built, first.candidate)
    return loop.model_copy(update={"phase": Phase.MEASURE, "pending": built})


def _artifact_lost(loop: Loop, ev: ArtifactLost) -> Loop:
    """Forget a lost artifact: the best's (built again before the next GPU step), a candidate's, the
    primary's or a sibling's (MEASURE goes back to IMPLEMENT, which builds what has no build) or the
    seed's (BASELINE builds it again). An artifact the loop does not hold is an error: nothing would
    change and the same step would run again."""
    pending, lost = loop.pending, ev.artifact
    update: dict[str, object] = {}
    if lost and loop.best_artifact == lost:
        update["best_artifact"] = ""
    if lost and pending is not None and loop.phase in (Phase.BASELINE, Phase.MEASURE):
        gone = [s.candidate for s in pending.siblings if s.build and s.build.artifact == lost]
        primary = pending.build is not None and pending.build.artifact == lost
        if primary and loop.phase == Phase.BASELINE:
            update["pending"] = None
        elif (primary or gone) and loop.phase == Phase.MEASURE:
            rebuilt = pending.with_siblings({n: {"build": None} for n in gone})
            if primary:
                rebuilt = rebuilt.model_copy(update={"build": None})
            update |= {"phase": Phase.IMPLEMENT, "pending": rebuilt}
    if not update:
        raise IllegalTransitionError(f"artifact_lost names no artifact this loop holds in phase {loop.phase}")
    return loop.model_copy(update=update)


def transition(loop: Loop, event: _Event) -> Loop:
    """Apply one event; raise IllegalTransitionError if the phase does not accept it."""
    phase = loop.phase
    if isinstance(event, Start) and phase == Phase.INIT:
        return loop.model_copy(update={"phase": Phase.BASELINE})
    if isinstance(event, Built) and phase == Phase.BASELINE and loop.pending is None:
        if not event.build.ok:
            raise IllegalTransitionError(
                f"the seed kernel does not build: {event.build.reason or 'compile error'}"
            )
        return loop.model_copy(update={"pending": Pending(build=event.build)})
    if isinstance(event, BaselineMeasured) and phase == Phase.BASELINE:
        return _baseline(loop, event)
    if isinstance(event, Profiled) and phase == Phase.PROFILE:
        return loop.model_copy(
            update={
                "phase": Phase.IDEATE,
                "profile_due": False,
                "last_profile": event.profile,
                "profile_fresh": True,
            }
        )
    if isinstance(event, Proposed) and phase == Phase.IDEATE:
        proposed = Pending(idea=event.idea, candidate=event.candidate, siblings=event.siblings)
        return loop.model_copy(update={"phase": Phase.IMPLEMENT, "pending": proposed})
    if isinstance(event, Rejected) and phase == Phase.IDEATE:
        attempt = Pending(rejection=event.rejection, attempt_no=loop.attempts + 1, siblings=event.siblings)
        return loop.model_copy(update={"phase": Phase.STORE, "pending": attempt})
    if isinstance(event, Built) and phase == Phase.IMPLEMENT and loop.pending is not None:
        return _built(loop, loop.pending, event)
    if isinstance(event, BestBuilt) and phase in (Phase.PROFILE, Phase.MEASURE) and loop.best_iter >= 0:
        return loop.model_copy(update={"best_artifact": event.artifact})
    if isinstance(event, ArtifactLost) and phase in (Phase.BASELINE, Phase.PROFILE, Phase.MEASURE):
        return _artifact_lost(loop, event)
    if isinstance(event, Measured) and phase == Phase.MEASURE and loop.pending is not None:
        best = (
            event.result.rebased_best_tflops
            if event.result.rebased_best_tflops is not None
            else loop.best_tflops
        )
        pending = loop.pending.with_siblings(
            {n: {"measurement": m} for n, m in event.measurements.items() if n != loop.pending.candidate}
        )
        if event.candidate is not None:
            pending = promote(pending, event.candidate, event.measurements.get(loop.pending.candidate))
        pending = pending.model_copy(
            update={"measure": event.result, "tflops": counted_tflops(event.result), "best_before": best}
        )
        return loop.model_copy(update={"phase": Phase.DECIDE, "pending": pending})
    if isinstance(event, Decided) and phase == Phase.DECIDE and loop.pending is not None:
        pending = loop.pending.model_copy(
            update={"decision": event.decision, "iteration": loop.current_iter + 1}
        )
        return loop.model_copy(update={"phase": Phase.STORE, "pending": pending})
    if isinstance(event, Stored) and phase == Phase.STORE:
        return _stored(loop, event)
    if isinstance(event, Resynced) and phase == Phase.STORE and loop.pending is not None:
        return event.loop  # git is the truth: ahead of the live loop, or behind it (Redis forgot, or git did)
    if isinstance(event, Reopen) and phase == Phase.DONE:
        if event.max_iter <= loop.current_iter:
            raise IllegalTransitionError(f"reopen needs max_iter > {loop.current_iter}, got {event.max_iter}")
        return loop.model_copy(
            update={"phase": Phase.PROFILE, "max_iter": event.max_iter, "profile_due": False}
        )
    raise _illegal(loop, event)


def decide_event(loop: Loop) -> Decided:
    """DECIDE is computed, not dispatched: the decision for the pending measurement."""
    pending = loop.pending
    if loop.phase != Phase.DECIDE or pending is None or pending.measure is None:
        raise IllegalTransitionError(f"nothing to decide in phase {loop.phase}")
    return Decided(decision=decide(pending.measure, pending.best_before, loop.noise_margin))
