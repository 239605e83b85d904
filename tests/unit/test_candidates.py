"""Several candidates per iteration (``--candidates N``): IDEATE gathers N distinct candidates (repeats are
recorded, never built), IMPLEMENT builds each (the same binary counts once), MEASURE measures the built
ones in one batch and the best enters DECIDE, and STORE records every sibling with its TFLOPS; one
iteration id per iteration throughout."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from croqq.backends._base import Backend, GpuContext
from croqq.backends.toolchain import knob_candidate
from croqq.delivery.messages import StepMessage, SubmitMessage
from croqq.delivery.state import ShapeState
from croqq.domain.decide import SIBLING
from croqq.domain.fsm import (
    MAX_CANDIDATES,
    ArtifactLost,
    BaselineMeasured,
    Built,
    Loop,
    Measured,
    Pending,
    Phase,
    Proposed,
    Start,
    Stored,
    decide_event,
    transition,
)
from croqq.domain.knobs import Candidate, seed_knobs
from croqq.domain.records import BuildOutcome, Idea, Measurement, MeasureResult, Profile, Rejection
from croqq.domain.schedule import build_schedule
from croqq.domain.shapes import Shape
from croqq.errors import IllegalTransitionError, InvalidRecordError
from croqq.placement import registry
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.proposers.search import SearchProposer
from croqq.settings import Settings
from croqq.store.gitrepo import GitRepo
from croqq.store.paths import RunPaths
from croqq.store.schema import RoundRecord
from croqq.store.validate import validate_repo
from croqq.store.writer import ResultsWriter
from croqq.work import executors
from croqq.work.history import entries_from_repo
from croqq.work.persist import store_request
from tests.unit.test_search_proposer import context, manifest

GPU_TYPE = "sm90_Simulated_H100_SXM"


def idea(n: int, content_hash: str = "") -> Idea:
    return Idea(
        summary=f"idea {n}", tag=f"idea{n}", knobs={"STAGES": n}, content_hash=content_hash or f"h{n:011d}"
    )


def built(n: int) -> BuildOutcome:
    return BuildOutcome(ok=True, artifact=f"artifact-{n}")


def failed(n: int) -> BuildOutcome:
    return BuildOutcome(ok=False, reason=f"ptxas: candidate {n} uses too many registers")


def run(tflops: float, outcome: str = "ok") -> Measurement:
    return Measurement(outcome=outcome, tflops=tflops)  # type: ignore[arg-type]


def ideating(candidates: int = 3) -> Loop:
    """A loop after its baseline, at IDEATE."""
    return Loop(
        phase=Phase.IDEATE, max_iter=5, candidates=candidates, current_iter=0, best_iter=0, best_tflops=500.0
    )


def proposed(loop: Loop) -> Loop:
    event = executors.candidates_event([idea(1), idea(2), idea(3)])
    return transition(loop, event)


# -- the loop (pure) ------------------------------------------------------------------------------------


def test_the_candidates_setting_is_bounded_by_the_documented_maximum() -> None:
    with pytest.raises(ValueError, match="less than or equal to 8"):
        Loop(max_iter=5, candidates=9)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        Loop(max_iter=5, candidates=0)
    with pytest.raises(ValueError, match="less than or equal to 8"):
        Settings(candidates=MAX_CANDIDATES + 1)
    assert Settings(candidates=MAX_CANDIDATES).candidates == MAX_CANDIDATES


def test_the_first_idea_is_the_primary_and_every_other_candidate_a_sibling() -> None:
    loop = proposed(ideating())
    pending = loop.pending
    assert loop.phase == Phase.IMPLEMENT and pending is not None
    assert pending.idea == idea(1) and pending.candidate == 1
    assert [(s.candidate, s.idea) for s in pending.siblings] == [(2, idea(2)), (3, idea(3))]


def test_an_agent_that_returns_the_same_candidate_n_times_gives_one_idea_and_n_minus_1_repeats() -> None:
    same = idea(1, content_hash="samehash0000")
    event = executors.candidates_event([same, same, same])
    assert isinstance(event, Proposed) and event.idea == same
    assert [(s.candidate, s.repeat_of, s.rejection.kind if s.rejection else "") for s in event.siblings] == [
        (2, 1, "repeat"),
        (3, 1, "repeat"),
    ]
    assert all(not s.buildable and not s.measurable for s in event.siblings)


def test_all_candidates_rejected_is_one_attempt_listing_every_sibling() -> None:
    no = [Rejection(proposer="claude", reason=f"agent exited 1 ({n})", kind="agent") for n in (1, 2, 3)]
    loop = transition(ideating(), executors.candidates_event(no))
    pending = loop.pending
    assert loop.phase == Phase.STORE and pending is not None
    assert pending.attempt_no == 1 and pending.iteration is None and pending.rejection == no[0]
    assert [s.rejection for s in pending.siblings] == no[1:]


def test_a_rejected_first_candidate_leaves_the_first_idea_as_primary() -> None:
    no = Rejection(proposer="claude", reason="wrote no candidate", kind="agent")
    loop = transition(ideating(), executors.candidates_event([no, idea(2), idea(3)]))
    assert loop.pending is not None and loop.pending.candidate == 2
    assert [(s.candidate, s.rejection) for s in loop.pending.siblings] == [(1, no), (3, None)]


def test_builds_are_recorded_and_a_binary_repeat_is_never_measured() -> None:
    loop = transition(
        proposed(ideating()), Built(build=built(1), builds={2: built(2), 3: built(3)}, repeats={3: 1})
    )
    pending = loop.pending
    assert loop.phase == Phase.MEASURE and pending is not None
    assert [s.measurable for s in pending.siblings] == [True, False]
    assert pending.sibling(3).repeat_of == 1


def test_a_primary_that_fails_to_build_gives_way_to_a_sibling_that_built() -> None:
    loop = transition(proposed(ideating()), Built(build=failed(1), builds={2: failed(2), 3: built(3)}))
    pending = loop.pending
    assert loop.phase == Phase.MEASURE and pending is not None
    assert (pending.candidate, pending.idea, pending.build) == (3, idea(3), built(3))
    assert [(s.candidate, s.build) for s in pending.siblings] == [(1, failed(1)), (2, failed(2))]


def test_none_built_is_a_compile_failure_attempt_with_no_iteration_id_carrying_the_siblings() -> None:
    loop = transition(proposed(ideating()), Built(build=failed(1), builds={2: failed(2), 3: failed(3)}))
    pending = loop.pending
    assert loop.phase == Phase.STORE and pending is not None
    assert pending.attempt_no == 1 and pending.iteration is None
    assert [s.build for s in pending.siblings] == [failed(2), failed(3)]
    assert transition(loop, Stored(iteration=None)).current_iter == 0  # no iteration used


def test_the_best_of_the_batch_enters_decide_and_every_sibling_keeps_its_measurement() -> None:
    loop = transition(proposed(ideating()), Built(build=built(1), builds={2: built(2), 3: built(3)}))
    result = MeasureResult(candidate=run(620.0))
    loop = transition(
        loop, Measured(result=result, candidate=2, measurements={1: run(510.0), 3: run(0.0, "crash")})
    )
    pending = loop.pending
    assert loop.phase == Phase.DECIDE and pending is not None
    assert (pending.candidate, pending.idea, pending.build, pending.tflops) == (2, idea(2), built(2), 620.0)
    assert {s.candidate: s.measurement for s in pending.siblings} == {1: run(510.0), 3: run(0.0, "crash")}
    loop = transition(loop, decide_event(loop))
    assert loop.pending is not None and loop.pending.iteration == 1  # one iteration id for the three


def test_a_lost_sibling_artifact_sends_the_iteration_back_to_implement_for_that_sibling_only() -> None:
    loop = transition(proposed(ideating()), Built(build=built(1), builds={2: built(2), 3: built(3)}))
    loop = transition(loop, ArtifactLost(artifact="artifact-3"))
    pending = loop.pending
    assert loop.phase == Phase.IMPLEMENT and pending is not None
    assert pending.build == built(1) and pending.sibling(2).build == built(2)
    assert pending.sibling(3).build is None and pending.sibling(3).buildable
    with pytest.raises(IllegalTransitionError):
        transition(loop, ArtifactLost(artifact="artifact-9"))


def test_a_pending_state_written_before_siblings_existed_still_loads() -> None:
    old = {"iteration": None, "idea": idea(1).model_dump(), "attempt_no": None}
    assert Pending.model_validate(old).siblings == []


# -- IDEATE ---------------------------------------------------------------------------------------------


def test_the_search_proposer_gives_n_distinct_candidates_each_told_its_number() -> None:
    seen: list[tuple[int, int]] = []

    class Recording(SearchProposer):
        def propose(self, ctx):  # type: ignore[no-untyped-def]
            seen.append((ctx.candidate, ctx.candidates))
            return super().propose(ctx)

    rt = SimpleNamespace(proposer=Recording(manifest(), Settings()))
    ctx = context().model_copy(update={"candidates": 3})
    answers = executors.gather(rt, None, ctx)  # type: ignore[arg-type]
    assert seen == [(1, 3), (2, 3), (3, 3)]
    hashes = [a.content_hash for a in answers]
    assert len(set(hashes)) == 3 and not set(hashes) & set(ctx.tried)
    event = executors.candidates_event(answers)
    assert isinstance(event, Proposed) and not any(s.repeat_of for s in event.siblings)


def test_ready_ideas_fill_the_first_slots_before_the_proposer_is_called() -> None:
    calls: list[int] = []

    class Counting(SearchProposer):
        def propose(self, ctx):  # type: ignore[no-untyped-def]
            calls.append(ctx.candidate)
            return super().propose(ctx)

    rt = SimpleNamespace(proposer=Counting(manifest(), Settings()))
    ctx = context().model_copy(update={"candidates": 3})
    answers = executors.gather(rt, None, ctx, ready=[idea(7)])  # type: ignore[arg-type]
    assert answers[0] == idea(7) and calls == [2, 3]


def test_the_agent_context_says_which_candidate_of_how_many() -> None:
    from croqq.proposers.agent import workspace
    from croqq.proposers.agent.contract import CONTEXT, TASK

    ctx = context().model_copy(update={"candidate": 2, "candidates": 4, "best_source": "// best\n"})
    resolver = SimpleNamespace(names=lambda: [], resolve=lambda name: None)
    ws = workspace.build(ctx, manifest(), resolver)  # type: ignore[arg-type]
    try:
        data = json.loads((ws.root / CONTEXT).read_text())
        assert (data["candidate"], data["candidates"]) == (2, 4)
        assert "candidate 2 of 4" in (ws.root / TASK).read_text()
    finally:
        ws.remove()


# -- IMPLEMENT and MEASURE ------------------------------------------------------------------------------


@pytest.fixture
def rt(redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path) -> Runtime:
    settings = Settings(
        broker_url=redis_server.url, run_dir=tmp_path / "run", results_repo=tmp_path / "r", sim_implement_s=0
    )
    return Runtime(settings, publisher=lambda records, pipe: None)


def shape_state(rt: Runtime) -> ShapeState:
    entry = registry.GpuEntry(uuid="GPU-a", host="h", index=0, gpu_type=GPU_TYPE, queue="gpu.h.GPU-a")
    registry.register_gpu(rt.client, entry)
    shapes = build_schedule(rt.manifest, "f16")[:1]
    msg = SubmitMessage(
        submission="s1",
        gpu_type=GPU_TYPE,
        dsl="cuda",
        mode="from_current_best",
        max_iter=3,
        candidates=3,
        shapes=shapes,
    )
    (sid,) = rt.intake.submit(msg).sids
    state = rt.ledger.load_shape(sid)
    assert state is not None and state.loop.candidates == 3
    return state


def test_a_resubmission_with_another_n_sets_it_for_the_iterations_that_follow(rt: Runtime) -> None:
    state = shape_state(rt)
    again = SubmitMessage(
        submission="s2",
        gpu_type=GPU_TYPE,
        dsl="cuda",
        mode="from_current_best",
        max_iter=3,
        candidates=5,
        shapes=build_schedule(rt.manifest, "f16")[:1],
    )
    rt.intake.submit(again)
    after = rt.ledger.load_shape(state.sid)
    assert after is not None and after.loop.candidates == 5 and after.loop.max_iter == 3


def knob_idea(rt: Runtime, shape: Shape, stages: int, comment: str = "") -> Idea:
    knobs = {**seed_knobs(rt.manifest, "cuda", "f16", "reference"), "STAGES": stages}
    cand = knob_candidate(rt.manifest, rt.settings, "cuda", shape, knobs)
    source = cand.source + comment
    return Idea(
        summary=f"stages {stages}{comment}",
        tag=f"stages{stages}",
        knobs=knobs,
        content_hash=f"{cand.content_hash}{len(comment)}",
        source=source,
    )


def test_two_candidates_that_compile_to_the_same_binary_are_measured_once(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = shape_state(rt)
    a, b, c = (
        knob_idea(rt, state.shape, 3),
        knob_idea(rt, state.shape, 3, "// a comment\n"),
        knob_idea(rt, state.shape, 4),
    )
    state.loop = transition(ideating(), executors.candidates_event([a, b, c]))
    backend = rt.backend
    digest = lambda shape, artifact: str(backend.decode(shape, artifact).knobs)  # type: ignore[attr-defined]  # noqa: E731
    monkeypatch.setattr(backend, "binary_digest", digest)  # a comment leaves the binary unchanged
    event = executors.implement(
        rt, state, StepMessage(step_id=f"{state.sid}#1.x", epoch=0, sid=state.sid, kind="implement")
    )
    assert isinstance(event, Built) and event.build.ok and set(event.builds) == {2, 3}
    assert event.repeats == {2: 1}
    state.loop = transition(state.loop, event)
    assert [s.candidate for s in state.loop.pending.siblings if s.measurable] == [3]  # type: ignore[union-attr]


class _Fixed(Backend):
    """Measures each artifact at the TFLOPS its name says (``a-620``; ``a-999-invalid`` is not ok)."""

    name = "fixed"

    def build(self, shape: Shape, candidate: Candidate) -> BuildOutcome:
        raise NotImplementedError

    def measure(self, gpu: GpuContext, shape: Shape, artifacts: Sequence[str]) -> list[Measurement]:
        self.batches.append(list(artifacts))
        out = []
        for art in artifacts:
            _, tflops, *bad = art.split("-")
            out.append(run(0.0 if bad else float(tflops), bad[0] if bad else "ok"))
        return out

    def profile(self, gpu: GpuContext, shape: Shape, artifact: str) -> Profile:
        raise NotImplementedError


def test_measure_picks_the_best_ok_candidate_of_one_interleaved_batch_and_confirms_it() -> None:
    be = _Fixed(manifest(), Settings())
    be.batches = []  # type: ignore[attr-defined]
    shape = context().shape
    batch = be.measure_candidates(
        SimpleNamespace(uuid="GPU-a"), shape, ["a-500", "a-999-invalid", "a-620"], "a-510", 510.0
    )  # type: ignore[arg-type]
    assert batch.chosen == 2 and batch.result.candidate.tflops == 620.0
    assert [r.tflops for r in batch.runs] == [500.0, 0.0, 620.0]
    assert be.batches[0] == ["a-500", "a-999-invalid", "a-620"]  # type: ignore[attr-defined]
    assert batch.result.confirmation is not None and all(b == ["a-620", "a-510"] for b in be.batches[1:])  # type: ignore[attr-defined]


# -- STORE ----------------------------------------------------------------------------------------------


def test_a_stored_iteration_lists_every_sibling_with_its_tflops_and_source(
    rt: Runtime, tmp_path: Path
) -> None:
    state = shape_state(rt)
    writer = ResultsWriter(GitRepo(tmp_path / "results"))
    seed = seed_knobs(rt.manifest, "cuda", "f16", "reference")
    seed_source = knob_candidate(rt.manifest, rt.settings, "cuda", state.shape, seed).source
    loop = transition(Loop(max_iter=3, candidates=3), Start())
    loop = transition(loop, Built(build=built(0)))
    loop = transition(loop, BaselineMeasured(knobs=seed, source=seed_source, measurement=run(500.0)))

    def store(loop: Loop, n: int) -> Loop:
        state.loop = loop
        req = store_request(rt.manifest, rt.settings, state, 0, f"{state.sid}#{n}.s")
        writer.apply(req)
        return transition(loop, Stored(iteration=req.round.iteration if req.round else None))

    loop = store(loop, 0)
    loop = transition(
        loop.model_copy(update={"phase": Phase.IDEATE}),
        executors.candidates_event(
            [knob_idea(rt, state.shape, 3), knob_idea(rt, state.shape, 3), knob_idea(rt, state.shape, 2)]
        ),
    )
    loop = transition(loop, Built(build=built(1), builds={3: built(3)}))
    loop = transition(
        loop, Measured(result=MeasureResult(candidate=run(540.0)), candidate=3, measurements={1: run(520.0)})
    )
    loop = store(transition(loop, decide_event(loop)), 1)
    assert loop.current_iter == 1
    repo = tmp_path / "results"
    paths = RunPaths(GPU_TYPE, "cuda")
    lines = (writer.repo.read(paths.rounds_raw(state.key)) or b"").decode().splitlines()
    rnd = RoundRecord.model_validate_json(lines[-1])
    assert (rnd.iteration, rnd.candidate, rnd.tflops) == (1, 3, 540.0)
    assert [(s.candidate, s.tflops, s.repeat_of) for s in rnd.siblings] == [(1, 520.0, None), (2, 0.0, 1)]
    measured = rnd.siblings[0]
    assert measured.kernel.endswith("iter001_c1-stages3.cu") and writer.repo.exists(measured.kernel)
    md = (writer.repo.read(paths.rounds_md(state.key)) or b"").decode()
    assert "- candidate 1 (beside 3): `stages3`" in md and "520.00 TFLOPS in the same batch" in md
    history = entries_from_repo([rnd], [])
    assert [(e.field, e.decision) for e in history] == [
        ("i001", rnd.decision),
        ("i001c1", SIBLING),
        ("i001c2", "REPEAT"),
    ]
    assert validate_repo(repo, "cuda") == []
    raw = json.loads(lines[-1])
    for sibs, reason in [
        ([{**raw["siblings"][0], "repeat_of": 9}], "sibling 1 repeats candidate 9"),
        ([{**raw["siblings"][0], "tflops": 1.0}], "Extra inputs are not permitted"),
        ([{**raw["siblings"][0], "kernel": raw["siblings"][0]["kernel"] + ".gone"}], "does not exist"),
    ]:
        bad = "\n".join([*lines[:-1], json.dumps({**raw, "siblings": sibs})]) + "\n"
        writer.repo.commit({paths.rounds_raw(state.key): bad.encode()}, "corrupt on purpose")
        assert any(reason in str(p) for p in validate_repo(repo, "cuda")), reason


def test_the_writer_refuses_siblings_that_do_not_fit_together(rt: Runtime, tmp_path: Path) -> None:
    from croqq.store.schema import SiblingRecord
    from croqq.store.writer import check_request

    state = shape_state(rt)
    seed = seed_knobs(rt.manifest, "cuda", "f16", "reference")
    source = knob_candidate(rt.manifest, rt.settings, "cuda", state.shape, seed).source
    loop = transition(Loop(max_iter=3), Start())
    loop = transition(loop, Built(build=built(0)))
    state.loop = transition(loop, BaselineMeasured(knobs=seed, source=source, measurement=run(500.0)))
    req = store_request(rt.manifest, rt.settings, state, 0, f"{state.sid}#0.s")
    assert req.round is not None
    bad = req.round.model_copy(update={"siblings": [SiblingRecord(candidate=2, idea=idea(2), repeat_of=5)]})
    with pytest.raises(InvalidRecordError, match="repeats candidate 5"):
        check_request(req.model_copy(update={"round": bad}))


# -- agents ---------------------------------------------------------------------------------------------


def test_a_comma_list_of_agents_spreads_the_candidates_round_robin() -> None:
    from croqq.proposers import make_proposer

    settings = Settings(proposer="agent", agent="scripted, command", agent_command="./my-agent")
    proposer = make_proposer(settings, manifest())
    assert [proposer.for_candidate(n).name for n in (1, 2, 3)] == ["scripted", "command", "scripted"]
    one = make_proposer(Settings(proposer="agent", agent="scripted"), manifest())
    assert one.for_candidate(2) is one and one.name == "scripted"
    with pytest.raises(ValueError, match="unknown agent 'gpt'"):
        Settings(proposer="agent", agent="claude,gpt")


def test_agents_run_in_parallel_and_every_call_counts_against_the_budget(redis_client: redis.Redis) -> None:
    from croqq.domain.records import AgentUsage
    from croqq.proposers._base import Proposer
    from croqq.work import agents

    class Same(Proposer):  # an agent that returns the same candidate every time
        name, is_agent = "scripted", True

        def propose(self, ctx):  # type: ignore[no-untyped-def]
            usage = AgentUsage(agent=self.name, wall_s=1.0)
            return idea(1, content_hash="samehash0000").model_copy(update={"agent": usage})

    rt = SimpleNamespace(proposer=Same(manifest(), Settings()), client=redis_client, settings=Settings())
    ctx = context().model_copy(update={"candidates": 4})
    answers = executors.gather(rt, SimpleNamespace(key="k"), ctx)  # type: ignore[arg-type]
    assert len(answers) == 4 and agents.budget(redis_client).calls == 4
    event = executors.candidates_event(answers)
    assert isinstance(event, Proposed) and [s.repeat_of for s in event.siblings] == [1, 1, 1]
