"""The per-shape FSM: every legal transition, every illegal one, and the loop's promises."""

from __future__ import annotations

import pytest

from croqq.domain.decide import decide
from croqq.domain.fsm import (
    ArtifactLost,
    BaselineMeasured,
    BestBuilt,
    Built,
    Decided,
    Loop,
    Measured,
    Phase,
    Profiled,
    Proposed,
    Rejected,
    Reopen,
    Start,
    Stored,
    decide_event,
    transition,
)
from croqq.domain.records import (
    BuildOutcome,
    Confirmation,
    Idea,
    Measurement,
    MeasureResult,
    Profile,
    Rejection,
)
from croqq.errors import IllegalTransitionError

KNOBS = {"TILE_M": 128}


def ok(tflops: float) -> Measurement:
    return Measurement(outcome="ok", tflops=tflops, verified=True)


def idea(tag: str = "x") -> Idea:
    return Idea(summary=f"idea {tag}", tag=tag, knobs={"TILE_M": 64}, content_hash=f"{tag:0<16}")


def measured(tflops: float, best: float | None = None, outcome: str = "ok") -> Measured:
    cand = Measurement(outcome=outcome, tflops=tflops if outcome == "ok" else 0.0)  # type: ignore[arg-type]
    conf = Confirmation(candidate_tflops=tflops, best_tflops=best, rounds=3) if best is not None else None
    return Measured(result=MeasureResult(candidate=cand, confirmation=conf))


EVENTS = {
    "start": Start(),
    "baseline_measured": BaselineMeasured(knobs=KNOBS, measurement=ok(100.0)),
    "profiled": Profiled(profile=Profile(bottleneck="memory")),
    "proposed": Proposed(idea=idea()),
    "rejected": Rejected(rejection=Rejection(proposer="claude", reason="agent claude wrote no candidate")),
    "built": Built(build=BuildOutcome(ok=True, artifact="a")),
    "best_built": BestBuilt(artifact="best-again"),
    "artifact_lost": ArtifactLost(artifact="best"),
    "measured": measured(90.0),
    "decided": Decided(decision="DISCARD"),
    "stored": Stored(iteration=1),
    "reopen": Reopen(max_iter=40),
}


def at(phase: Phase) -> Loop:
    """A loop parked in ``phase`` with whatever it needs there."""
    loop = Loop(
        max_iter=30,
        current_iter=0,
        best_iter=0,
        best_tflops=100.0,
        best_knobs=KNOBS,
        seed_knobs=KNOBS,
        best_artifact="best",
    )
    drive = {
        Phase.INIT: [],
        Phase.BASELINE: [Start()],
        Phase.IDEATE: [],
        Phase.IMPLEMENT: [EVENTS["proposed"]],
        Phase.MEASURE: [EVENTS["proposed"], EVENTS["built"]],
        Phase.DECIDE: [EVENTS["proposed"], EVENTS["built"], EVENTS["measured"]],
        Phase.STORE: [EVENTS["proposed"], EVENTS["built"], EVENTS["measured"], EVENTS["decided"]],
    }
    if phase == Phase.INIT:
        return Loop(max_iter=30)
    if phase == Phase.BASELINE:
        return transition(Loop(max_iter=30), Start())
    if phase in (Phase.PROFILE, Phase.DONE):
        return loop.model_copy(update={"phase": phase, "current_iter": 30 if phase == Phase.DONE else 0})
    loop = loop.model_copy(update={"phase": Phase.IDEATE})
    for ev in drive[phase]:
        loop = transition(loop, ev)
    assert loop.phase == phase
    return loop


LEGAL = {
    (Phase.INIT, "start"): Phase.BASELINE,
    (Phase.BASELINE, "built"): Phase.BASELINE,
    (Phase.BASELINE, "baseline_measured"): Phase.STORE,
    (Phase.PROFILE, "profiled"): Phase.IDEATE,
    (Phase.PROFILE, "best_built"): Phase.PROFILE,
    (Phase.PROFILE, "artifact_lost"): Phase.PROFILE,
    (Phase.MEASURE, "best_built"): Phase.MEASURE,
    (Phase.MEASURE, "artifact_lost"): Phase.MEASURE,
    (Phase.IDEATE, "proposed"): Phase.IMPLEMENT,
    (Phase.IDEATE, "rejected"): Phase.STORE,
    (Phase.IMPLEMENT, "built"): Phase.MEASURE,
    (Phase.MEASURE, "measured"): Phase.DECIDE,
    (Phase.DECIDE, "decided"): Phase.STORE,
    (Phase.STORE, "stored"): Phase.IDEATE,
    (Phase.DONE, "reopen"): Phase.PROFILE,
}


@pytest.mark.parametrize(("phase", "event"), sorted(LEGAL, key=str))
def test_legal_transition_reaches_its_phase(phase: Phase, event: str) -> None:
    assert transition(at(phase), EVENTS[event]).phase == LEGAL[(phase, event)]


ILLEGAL = [(p, e) for p in Phase for e in EVENTS if (p, e) not in LEGAL]


@pytest.mark.parametrize(("phase", "event"), ILLEGAL, ids=[f"{p}-{e}" for p, e in ILLEGAL])
def test_illegal_transition_raises(phase: Phase, event: str) -> None:
    with pytest.raises(IllegalTransitionError):
        transition(at(phase), EVENTS[event])


def test_baseline_is_iteration_zero_and_profile_runs_before_iteration_one() -> None:
    loop = transition(transition(Loop(max_iter=3), Start()), EVENTS["baseline_measured"])
    assert loop.pending is not None and loop.pending.iteration == 0 and loop.pending.decision == "BASELINE"
    loop = transition(loop, Stored(iteration=0))
    assert (loop.phase, loop.current_iter, loop.best_tflops, loop.baseline_tflops) == (
        Phase.PROFILE,
        0,
        100.0,
        100.0,
    )


def test_baseline_builds_the_seed_before_measuring_it_and_a_broken_seed_is_an_error() -> None:
    loop = transition(transition(Loop(max_iter=3), Start()), EVENTS["built"])
    assert loop.phase == Phase.BASELINE and loop.pending is not None and loop.pending.build is not None
    with pytest.raises(IllegalTransitionError):
        transition(loop, EVENTS["built"])  # built once only
    with pytest.raises(IllegalTransitionError, match="seed kernel does not build: ptxas"):
        transition(transition(Loop(max_iter=3), Start()), Built(build=BuildOutcome(ok=False, reason="ptxas")))


def test_compile_failure_is_an_attempt_that_uses_no_iteration_id() -> None:
    loop = transition(
        transition(at(Phase.IDEATE), EVENTS["proposed"]),
        Built(build=BuildOutcome(ok=False, reason="smem overflow")),
    )
    assert loop.phase == Phase.STORE and loop.pending is not None and loop.pending.attempt_no == 1
    with pytest.raises(IllegalTransitionError):
        transition(loop, Stored(iteration=1))
    loop = transition(loop, Stored(iteration=None))
    assert (loop.phase, loop.current_iter, loop.attempts) == (Phase.IDEATE, 0, 1)


def test_a_rejected_ideate_is_an_attempt_that_uses_no_iteration_id_and_the_shape_goes_on() -> None:
    loop = transition(at(Phase.IDEATE), EVENTS["rejected"])
    assert loop.phase == Phase.STORE and loop.pending is not None and loop.pending.attempt_no == 1
    assert loop.pending.rejection is not None and loop.pending.idea is None
    with pytest.raises(IllegalTransitionError):
        transition(loop, Stored(iteration=1))
    loop = transition(loop, Stored(iteration=None))
    assert (loop.phase, loop.current_iter, loop.attempts, loop.consecutive_discards) == (
        Phase.IDEATE,
        0,
        1,
        0,
    )


def test_attempts_in_a_row_count_what_a_stuck_proposer_makes_and_an_iteration_resets_them() -> None:
    def attempt(loop: Loop, event: Rejected | Built) -> Loop:
        if isinstance(event, Built):
            loop = transition(loop, EVENTS["proposed"])
        return transition(transition(loop, event), Stored(iteration=None))

    repeat = Rejected(rejection=Rejection(proposer="p", reason="repeats an earlier candidate", kind="repeat"))
    loop = at(Phase.IDEATE)
    for event in (repeat, Built(build=BuildOutcome(ok=False, reason="error: expected a ;")), repeat):
        loop = attempt(loop, event)
    assert (loop.attempts, loop.attempts_in_a_row) == (3, 3)
    down = Rejected(rejection=Rejection(proposer="p", reason="agent p exited 7", kind="agent"))
    loop = attempt(loop, down)  # the agent's own failure: its back-off handles it, the shape waits
    assert (loop.attempts, loop.attempts_in_a_row) == (4, 3)
    loop = run_iteration(loop, measured(90.0, best=100.0))
    assert (loop.attempts, loop.attempts_in_a_row) == (4, 0)


def test_a_kept_idea_makes_its_source_the_best_source() -> None:
    source = '#define TILE_M 64\n#include "gemm_f16.cuh"\n'
    loop = at(Phase.IDEATE)
    kept = idea("win").model_copy(update={"source": source})
    for step in (Proposed(idea=kept), EVENTS["built"], measured(120.0, best=100.0)):
        loop = transition(loop, step)
    loop = transition(loop, decide_event(loop))
    loop = transition(loop, Stored(iteration=1))
    assert loop.best_iter == 1 and loop.best_source == source


def run_iteration(loop: Loop, ev: Measured) -> Loop:
    for step in (Proposed(idea=idea(f"i{loop.current_iter}")), EVENTS["built"], ev):
        loop = transition(loop, step)
    loop = transition(loop, decide_event(loop))
    assert loop.pending is not None
    return transition(loop, Stored(iteration=loop.pending.iteration))


def test_runtime_failure_is_a_stored_fail_iteration() -> None:
    loop = run_iteration(at(Phase.IDEATE), measured(0.0, outcome="crash"))
    assert loop.current_iter == 1 and loop.fails == 1 and loop.best_tflops == 100.0


def test_keep_needs_the_confirmation_to_agree() -> None:
    unconfirmed = run_iteration(at(Phase.IDEATE), measured(120.0))
    assert unconfirmed.best_iter == 0 and unconfirmed.consecutive_discards == 1
    refuted = run_iteration(at(Phase.IDEATE), measured(120.0, best=119.5))
    assert refuted.best_iter == 0
    kept = run_iteration(at(Phase.IDEATE), measured(120.0, best=100.0))
    assert (kept.best_iter, kept.best_tflops, kept.consecutive_discards, kept.phase) == (
        1,
        120.0,
        0,
        Phase.PROFILE,
    )


def test_discards_escalate_strategy_and_never_stop_the_loop() -> None:
    loop = at(Phase.IDEATE).model_copy(update={"max_iter": 12})
    phases = []
    for _ in range(12):
        if loop.phase == Phase.PROFILE:
            loop = transition(loop, EVENTS["profiled"])
        loop = run_iteration(loop, measured(50.0))
        phases.append((loop.consecutive_discards, loop.strategy, loop.phase))
    assert phases[2] == (3, "refine", Phase.PROFILE)  # a stall profiles again
    assert phases[4][1] == "escalate" and phases[9][1] == "radical"
    assert loop.phase == Phase.DONE and loop.current_iter == 12


def test_done_only_at_max_iter_and_reopen_needs_more() -> None:
    loop = at(Phase.IDEATE).model_copy(update={"max_iter": 1})
    loop = run_iteration(loop, measured(50.0))
    assert loop.phase == Phase.DONE
    with pytest.raises(IllegalTransitionError):
        transition(loop, Reopen(max_iter=1))
    assert transition(loop, Reopen(max_iter=5)).max_iter == 5


def test_decide_discards_wins_inside_the_noise_margin() -> None:
    result = MeasureResult(
        candidate=ok(101.0), confirmation=Confirmation(candidate_tflops=101.0, best_tflops=100.0, rounds=3)
    )
    assert decide(result, 100.0, 0.015) == "DISCARD"
    assert decide(MeasureResult(candidate=Measurement(outcome="hang")), 100.0, 0.015) == "FAIL_hang"


def test_a_best_built_again_gets_its_artifact_and_the_phase_stays() -> None:
    for phase in (Phase.PROFILE, Phase.MEASURE):
        lost = transition(at(phase), ArtifactLost(artifact="best"))
        assert lost.best_artifact == "" and lost.phase == phase
        again = transition(lost, BestBuilt(artifact="best-again"))
        assert again.best_artifact == "best-again" and again.phase == phase and again.pending == lost.pending
    with pytest.raises(IllegalTransitionError):
        transition(Loop(max_iter=3, phase=Phase.PROFILE), BestBuilt(artifact="x"))  # no best yet


def test_a_lost_candidate_is_built_again_and_a_lost_seed_too() -> None:
    lost = transition(at(Phase.MEASURE), ArtifactLost(artifact="a"))
    assert lost.phase == Phase.IMPLEMENT and lost.pending is not None and lost.pending.build is None
    assert lost.pending.idea == idea() and lost.best_artifact == "best"
    assert transition(lost, EVENTS["built"]).phase == Phase.MEASURE
    seeded = transition(at(Phase.BASELINE), EVENTS["built"])
    assert transition(seeded, ArtifactLost(artifact="a")).pending is None


def test_an_artifact_the_loop_does_not_hold_cannot_be_lost() -> None:
    for name in ("elsewhere", ""):
        with pytest.raises(IllegalTransitionError, match="names no artifact"):
            transition(at(Phase.MEASURE), ArtifactLost(artifact=name))
