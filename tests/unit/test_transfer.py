"""Neighbour transfer: a shape that starts or stalls is offered the best kernels of its nearest advanced
neighbours (same GPU type, family, dtype), re-targeted to it, as ideas measured like any other; an agent
sees them in its workspace whenever they exist."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from croqq.backends.toolchain import knob_candidate
from croqq.delivery.messages import StepMessage
from croqq.delivery.state import ShapeState, ShapeSummary, make_sid
from croqq.domain.fsm import Built, Loop, Phase, Proposed, Rejected, transition
from croqq.domain.knobs import include_resolver, render_source, seed_knobs
from croqq.domain.neighbours import (
    STALL_TRANSFER,
    TRANSFER_NEIGHBOURS,
    log2_distance,
    nearest,
    transfer_due,
)
from croqq.domain.records import Idea, Rejection
from croqq.domain.shapes import Shape, parse_key
from croqq.domain.source import SourceError, retarget_shape
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.proposers.agent import workspace
from croqq.proposers.agent.proposer import AgentProposer
from croqq.settings import Settings
from croqq.work import executors, transfer
from tests.agents import settings as agent_settings

GPU = "sm90_Simulated_H100_SXM"
HERE = "f16_4096x8192x4096"


@pytest.fixture
def rt(redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    settings = Settings(broker_url=redis_server.url, run_dir=tmp_path / "run", results_repo=tmp_path / "r")
    yield Runtime(settings, publisher=lambda records, pipe: None)


def reference(rt: Runtime) -> dict[str, int]:
    return seed_knobs(rt.manifest, "cuda", "f16", "reference")


def shape_state(
    rt: Runtime,
    key: str,
    *,
    best_iter: int = 3,
    knobs: dict[str, int] | None = None,
    source: str | None = None,
    tflops: float = 712.3,
    gpu_type: str = GPU,
    dsl: str = "cuda",
    current_iter: int = 0,
    discards: int = 0,
) -> ShapeState:
    """A shape of the live ledger; its best is a kept knob candidate unless ``source`` says otherwise."""
    shape = parse_key(key)
    knobs = knobs or reference(rt)
    rendered = render_source(rt.manifest, "cuda", shape, knobs)
    loop = Loop(
        phase=Phase.IDEATE,
        max_iter=10,
        current_iter=max(current_iter, best_iter),
        best_iter=best_iter,
        best_tflops=tflops,
        baseline_tflops=400.0,
        best_knobs=knobs,
        best_source=rendered if source is None else source,
        seed_knobs=reference(rt),
        seed_source=render_source(rt.manifest, "cuda", shape, reference(rt)),
        consecutive_discards=discards,
    )
    return ShapeState(
        sid=make_sid(gpu_type, dsl, key),
        gpu_type=gpu_type,
        dsl=dsl,
        key=key,
        dtype=shape.dtype,
        m=shape.m,
        n=shape.n,
        k=shape.k,
        mode="from_current_best",
        scenarios=["square"],
        region="near",
        rank=0,
        loop=loop,
    )


def save(rt: Runtime, *states: ShapeState) -> None:
    pipe = rt.client.pipeline()
    for state in states:
        rt.ledger.save_shape(pipe, state)
    pipe.execute()


def starting(rt: Runtime, key: str = HERE, **kw: object) -> ShapeState:
    """The offered shape: measured its baseline, about to ideate iteration 1."""
    state = shape_state(rt, key, best_iter=0, tflops=400.0, **kw)  # type: ignore[arg-type]
    save(rt, state)
    return state


def ideas(rt: Runtime, state: ShapeState, limit: int = TRANSFER_NEIGHBOURS) -> list[Idea | Rejection]:
    ctx = executors.propose_context(rt, state)
    return transfer.neighbour_ideas(rt, state, ctx, limit)


# -- the domain functions --------------------------------------------------------------------------------


def test_distance_is_euclidean_in_log2_space() -> None:
    assert log2_distance((4096, 8192, 4096), (4096, 8192, 4096)) == 0
    assert log2_distance((4096, 8192, 4096), (2048, 8192, 4096)) == 1
    assert math.isclose(log2_distance((1024, 1024, 1024), (2048, 2048, 2048)), math.sqrt(3))


def test_nearest_ranks_same_dtype_shapes_excluding_itself_with_ties_in_shape_order() -> None:
    here = Shape(dtype="f16", m=4096, n=4096, k=4096)
    others = [
        (Shape(dtype="f16", m=4096, n=4096, k=4096), "self"),
        (Shape(dtype="f16", m=4096, n=4096, k=16384), "far"),
        (Shape(dtype="e4m3", m=4096, n=4096, k=8192), "other dtype"),
        (Shape(dtype="f16", m=8192, n=4096, k=4096), "tie b"),
        (Shape(dtype="f16", m=4096, n=4096, k=8192), "tie a"),
    ]
    assert [p for _, p in nearest(here, others, 5)] == ["tie a", "tie b", "far"]
    assert [p for _, p in nearest(here, others, 1)] == ["tie a"]
    assert [p for _, p in nearest(here, others, 5, max_distance=1.5)] == ["tie a", "tie b"]


def test_transfer_is_due_when_a_shape_starts_and_when_it_stalls() -> None:
    starting = [transfer_due(i, 0) for i in range(TRANSFER_NEIGHBOURS + 2)]
    assert starting == [True] * TRANSFER_NEIGHBOURS + [False, False]
    assert transfer_due(7, STALL_TRANSFER) and not transfer_due(7, STALL_TRANSFER + 1)


def test_a_source_gets_this_shapes_macros_and_nothing_else_changes() -> None:
    text = "// for f16_1x1x1\n#define GEMM_M 1024\n#define GEMM_N (512)\n  #define GEMM_K 256\n#define X 3\n"
    out = retarget_shape(text, (4096, 8192, 128))
    assert (
        out
        == "// for f16_1x1x1\n#define GEMM_M 4096\n#define GEMM_N 8192\n  #define GEMM_K 128\n#define X 3\n"
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("constexpr int M = 1024;\n#define GEMM_N 2\n#define GEMM_K 3\n", "GEMM_M is not defined"),
        (
            "#define GEMM_M 1\n#define GEMM_N 2\n#define GEMM_N 4\n#define GEMM_K 3\n",
            "GEMM_N is defined 2 times",
        ),
        ("#define GEMM_M 1\n#define GEMM_N 2\n// #define GEMM_K 3\n", "GEMM_K is not defined"),
    ],
)
def test_a_source_whose_shape_cannot_be_found_is_refused_with_the_reason(text: str, words: str) -> None:
    with pytest.raises(SourceError, match=words):
        retarget_shape(text, (4096, 8192, 128))


# -- finding neighbours ----------------------------------------------------------------------------------


def test_neighbours_are_the_nearest_advanced_ones_of_the_same_gpu_type_family_and_dtype(rt: Runtime) -> None:
    here = starting(rt)
    save(
        rt,
        shape_state(rt, "f16_4096x8192x8192", tflops=700.0),  # distance 1
        shape_state(rt, "f16_2048x8192x2048", tflops=650.0),  # distance sqrt 2
        shape_state(rt, "f16_4096x8192x16384", tflops=640.0),  # distance 2
        shape_state(rt, "f16_4096x2048x2048", tflops=630.0),  # distance sqrt 5
        shape_state(rt, "f16_16384x8192x16384", tflops=800.0),  # farther: beyond the four nearest
        shape_state(rt, "f16_4096x8192x6144", best_iter=0),  # nearer, but only its baseline
        shape_state(rt, "e4m3_4096x8192x4096"),  # another dtype
        shape_state(rt, "f16_4096x8192x3072", gpu_type="sm90_NVIDIA_H200"),  # another GPU type
        shape_state(rt, "f16_4096x8192x3072", dsl="triton"),  # another family
    )
    found = transfer.advanced_neighbours(rt, here)
    assert [(nb.key, nb.distance) for nb in found] == [
        ("f16_4096x8192x8192", 1.0),
        ("f16_2048x8192x2048", round(math.sqrt(2), 6)),
        ("f16_4096x8192x16384", 2.0),
        ("f16_4096x2048x2048", round(math.sqrt(5), 6)),
    ]
    assert len(found) == TRANSFER_NEIGHBOURS
    first = found[0]
    assert first.best_tflops == 700.0 and first.peak_fraction == round(700.0 / 989.4, 4)
    assert first.knobs == reference(rt) and first.change == "knobs" and first.reason == ""


def test_a_summary_written_before_it_carried_best_iter_is_judged_by_its_figures() -> None:
    old = {"status": "done", "phase": "DONE", "dtype": "f16", "current_iter": 9, "max_iter": 9, "gpu": ""}
    kept = ShapeSummary.model_validate({**old, "best_tflops": 700.0, "baseline_tflops": 400.0})
    flat = ShapeSummary.model_validate({**old, "best_tflops": 400.0, "baseline_tflops": 400.0})
    assert kept.best_iter is None
    assert transfer.summary_advanced(kept, "f16") and not transfer.summary_advanced(kept, "e4m3")
    assert not transfer.summary_advanced(flat, "f16")


def test_a_knob_candidate_is_rendered_again_for_this_shape(rt: Runtime) -> None:
    here = starting(rt)
    knobs = reference(rt) | {"STAGES": 5, "SWIZZLE": 2}
    save(rt, shape_state(rt, "f16_4096x8192x8192", knobs=knobs))
    (idea,) = ideas(rt, here)
    assert isinstance(idea, Idea)
    cand = knob_candidate(rt.manifest, rt.settings, "cuda", here.shape, knobs)
    assert idea.source == cand.source and idea.content_hash == cand.content_hash and idea.knobs == knobs
    assert "#define GEMM_K 4096" in idea.source and "#define GEMM_K 8192" not in idea.source
    assert idea.proposer == "neighbour" and idea.change == "knobs"
    assert idea.summary == "best of f16_4096x8192x8192 (712.3 TFLOPS there)"
    assert idea.tag == "nb-4096x8192x8192"


def test_an_agent_written_source_gets_this_shapes_macros(rt: Runtime) -> None:
    here = starting(rt)
    there = parse_key("f16_4096x8192x8192")
    written = render_source(rt.manifest, "cuda", there, reference(rt)).replace(
        '#include "gemm_f16.cuh"', '#define CROQQ_RASTER_GROUP 8\n#include "gemm_f16.cuh"'
    )
    save(rt, shape_state(rt, there.key, source=written))
    (idea,) = ideas(rt, here)
    assert isinstance(idea, Idea) and idea.change == "structural"
    assert idea.source == written.replace("#define GEMM_K 8192", "#define GEMM_K 4096")


def test_a_source_whose_shape_cannot_be_found_becomes_a_rejection_recorded_once(rt: Runtime) -> None:
    here = starting(rt)
    hard = 'constexpr int kM = 4096;\n#define GEMM_N 8192\n#define GEMM_K 8192\n#include "gemm_f16.cuh"\n'
    save(rt, shape_state(rt, "f16_4096x8192x8192", source=hard))
    (refusal,) = ideas(rt, here)
    assert isinstance(refusal, Rejection) and refusal.proposer == "neighbour" and refusal.content_hash
    assert refusal.reason.startswith("best of f16_4096x8192x8192 (712.3 TFLOPS there): GEMM_M is not defined")
    rt.client.sadd(f"croqq:ideas:{here.sid}", refusal.content_hash)  # what storing the attempt does
    assert ideas(rt, here) == []


def test_knobs_outside_this_manifests_space_become_a_rejection(rt: Runtime) -> None:
    here = starting(rt)
    save(rt, shape_state(rt, "f16_4096x8192x8192", knobs=reference(rt) | {"STAGES": 9}, source=""))
    (refusal,) = ideas(rt, here)
    assert isinstance(refusal, Rejection) and "STAGES=9 is not one of" in refusal.reason


def test_a_kernel_already_tried_or_equal_to_the_best_is_skipped(rt: Runtime) -> None:
    here = starting(rt)
    tried = reference(rt) | {"STAGES": 5}
    save(
        rt,
        shape_state(rt, "f16_4096x8192x8192", knobs=tried),  # nearest: already tried here
        shape_state(rt, "f16_4096x8192x2048"),  # the reference knobs: this shape's own best
    )
    rt.client.sadd(
        f"croqq:ideas:{here.sid}",
        knob_candidate(rt.manifest, rt.settings, "cuda", here.shape, tried).content_hash,
    )
    assert ideas(rt, here) == []
    save(rt, shape_state(rt, "f16_4096x8192x2048", knobs=reference(rt) | {"SWIZZLE": 2}))
    (idea,) = ideas(rt, here)
    assert isinstance(idea, Idea) and idea.summary.startswith("best of f16_4096x8192x2048")


def test_an_agent_sees_neighbours_any_time_but_they_are_offered_only_at_the_start_and_at_a_stall(
    rt: Runtime, redis_server: RedisServer, tmp_path: Path
) -> None:
    save(rt, shape_state(rt, "f16_4096x8192x8192", knobs=reference(rt) | {"STAGES": 5}))
    running = shape_state(rt, HERE, best_iter=0, tflops=400.0, current_iter=4, discards=2)
    save(rt, running)
    # a search strategy reads the neighbours only while transfer is due (a scan of every shape's summary)
    assert executors.propose_context(rt, running).neighbours == []
    agent = Settings(
        broker_url=redis_server.url,
        run_dir=tmp_path / "run",
        results_repo=tmp_path / "r",
        proposer="agent",
        agent="scripted",
    )
    ctx = executors.propose_context(Runtime(agent, publisher=lambda records, pipe: None), running)
    assert [nb.key for nb in ctx.neighbours] == ["f16_4096x8192x8192"]
    assert transfer.neighbour_ideas(rt, running, ctx, 1) == []
    stalled = shape_state(rt, HERE, best_iter=0, tflops=400.0, current_iter=4, discards=STALL_TRANSFER)
    assert len(ideas(rt, stalled)) == 1


def test_ideate_takes_a_neighbours_kernel_without_a_proposer_call_and_off_is_todays_behaviour(
    rt: Runtime, redis_server: RedisServer, tmp_path: Path
) -> None:
    here = starting(rt)
    save(rt, shape_state(rt, "f16_4096x8192x8192", knobs=reference(rt) | {"STAGES": 5}))
    msg = StepMessage(step_id="s#1.0", epoch=0, sid=here.sid, kind="ideate")
    event = executors.ideate(rt, here, msg)
    assert isinstance(event, Proposed) and event.idea.proposer == "neighbour"

    off = Settings(
        broker_url=redis_server.url, run_dir=tmp_path / "run", results_repo=tmp_path / "r", transfer=False
    )
    rt_off = Runtime(off, publisher=lambda records, pipe: None)
    assert executors.propose_context(rt_off, here).neighbours == []
    event = executors.ideate(rt_off, here, msg)
    assert isinstance(event, Proposed) and event.idea.proposer == rt_off.proposer.name != "neighbour"


def test_a_neighbour_kernel_that_does_not_build_here_is_an_attempt_with_its_reason(rt: Runtime) -> None:
    # SPLIT_K=4 with TILE_K=64 slices K=8192 into 2048 (fine there); K=128 into 32, below one k-tile
    knobs = reference(rt) | {"SPLIT_K": 4, "TILE_K": 64}
    save(rt, shape_state(rt, "f16_4096x8192x8192", knobs=knobs))
    here = starting(rt, "f16_4096x8192x128")
    msg = StepMessage(step_id="s#1.0", epoch=0, sid=here.sid, kind="ideate")
    proposed = executors.ideate(rt, here, msg)
    assert isinstance(proposed, Proposed) and proposed.idea.proposer == "neighbour"
    here.loop = transition(here.loop, proposed)
    built = executors.implement(rt, here, msg.model_copy(update={"kind": "implement"}))
    assert isinstance(built, Built) and not built.build.ok
    assert built.build.reason.startswith("knob rule: SPLIT_K exceeds the number of k-tiles")  # no compile
    loop = transition(here.loop, built)
    assert loop.phase == Phase.STORE and loop.pending is not None and loop.pending.attempt_no == 1
    assert loop.current_iter == 0  # no iteration id spent: the shape goes on


def test_a_rejected_neighbour_goes_through_ideate_as_an_attempt(rt: Runtime) -> None:
    here = starting(rt)
    save(rt, shape_state(rt, "f16_4096x8192x8192", source='#define GEMM_M 1\n#include "gemm_f16.cuh"\n'))
    event = executors.ideate(rt, here, StepMessage(step_id="s#1.0", epoch=0, sid=here.sid, kind="ideate"))
    assert isinstance(event, Rejected) and "GEMM_N is not defined" in event.rejection.reason


# -- the agent's view --------------------------------------------------------------------------------------


def test_the_agents_context_json_lists_the_neighbours_and_their_sources(rt: Runtime) -> None:
    here = starting(rt)
    hard = '#define GEMM_N 8192\n#define GEMM_K 2048\n#include "gemm_f16.cuh"\n'
    save(
        rt,
        shape_state(rt, "f16_4096x8192x8192", knobs=reference(rt) | {"STAGES": 5}, tflops=700.0),
        shape_state(rt, "f16_4096x8192x2048", source=hard, tflops=650.0),
    )
    ctx = executors.propose_context(rt, here)
    ws = workspace.build(ctx, rt.manifest, include_resolver(rt.manifest, "cuda", rt.settings.kernels_dir))
    try:
        listed = json.loads((ws.root / "context.json").read_text())["neighbours"]
        assert [(nb["key"], nb["best_tflops"], nb["source"]) for nb in listed] == [  # a tie: by shape
            ("f16_4096x8192x2048", 650.0, ""),
            ("f16_4096x8192x8192", 700.0, "neighbours/f16_4096x8192x8192.cu"),
        ]
        assert listed[1]["knobs"]["STAGES"] == 5 and listed[1]["distance"] == 1.0
        assert listed[1]["peak_fraction"] == round(700.0 / 989.4, 4)
        assert "GEMM_M is not defined" in listed[0]["reason"]
        text = (ws.root / "neighbours" / "f16_4096x8192x8192.cu").read_text()
        assert "#define GEMM_K 4096" in text and "#define STAGES 5" in text
        assert not (ws.root / "neighbours" / "f16_4096x8192x8192.cu").stat().st_mode & 0o222  # read-only
        assert "f16_4096x8192x8192 700.0 TFLOPS): their best kernels" in (ws.root / "TASK.md").read_text()
    finally:
        ws.remove()


def test_an_agent_answers_as_before_with_neighbours_in_its_workspace(rt: Runtime) -> None:
    here = starting(rt)
    save(rt, shape_state(rt, "f16_4096x8192x8192", knobs=reference(rt) | {"STAGES": 5}))
    ctx = executors.propose_context(rt, here)
    assert ctx.neighbours
    idea = AgentProposer(rt.manifest, agent_settings(agent_jail="none")).propose(ctx)
    assert isinstance(idea, Idea), idea
