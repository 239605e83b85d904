"""What each step kind does: read the shape's live state, call the backend / proposer / writer, and
return the FSM event that ``Ledger.complete`` applies. Failing candidates come back as events (a
compile failure is ``Built(ok=False)``, a crash is a FAIL measurement); only infrastructure faults raise.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from croqq import diskspace
from croqq.backends.toolchain import candidate_of, knob_candidate
from croqq.delivery import keys
from croqq.delivery.messages import StepMessage
from croqq.delivery.state import ShapeState
from croqq.domain.fsm import (
    BaselineMeasured,
    BestBuilt,
    Built,
    Measured,
    Phase,
    Profiled,
    Proposed,
    Rejected,
    Resynced,
    Stored,
)
from croqq.domain.knobs import Candidate, seed_knobs
from croqq.domain.neighbours import transfer_due
from croqq.domain.phases import next_phase
from croqq.domain.records import BuildOutcome, Idea, Rejection, Sibling
from croqq.domain.source import SourceError
from croqq.errors import IllegalTransitionError, StoreGapError, TerminalError
from croqq.proposers._base import ProposeContext
from croqq.settings import Settings
from croqq.store.schema import StoreReceipt, StoreRequest
from croqq.work import agents, stats, transfer
from croqq.work import gpu as guard
from croqq.work import history as hist
from croqq.work.context import Runtime
from croqq.work.persist import resumable_loop, store_request

log = logging.getLogger(__name__)
Executor = Callable[[Runtime, ShapeState, StepMessage], object]


_BUILT_MAX = 512


def _best_source(rt: Runtime, state: ShapeState) -> str:
    """The best kernel's logical source: the loop's (a loop the writer rebuilt from a checkpoint carries
    the stored one), else the template rendered with the best knobs. Never read from the results repo,
    which only the writer's host has."""
    loop = state.loop
    if loop.best_source:
        return loop.best_source
    knobs = loop.best_knobs or loop.seed_knobs
    return knob_candidate(rt.manifest, rt.settings, state.dsl, state.shape, knobs).source


def _candidate(rt: Runtime, state: ShapeState, source: str) -> Candidate:
    return candidate_of(rt.manifest, rt.settings, state.dsl, state.dtype, source)


def _best_artifact(state: ShapeState) -> str:
    """The best kernel's artifact. A GPU step never builds it: a loop without one (rebuilt from a
    checkpoint, or its artifact was lost) gets an IMPLEMENT step on a build worker first (``step_kind``)."""
    if not state.loop.best_artifact:
        raise IllegalTransitionError(f"{state.key}: a GPU step without the best kernel's artifact")
    return state.loop.best_artifact


def _seed(rt: Runtime, state: ShapeState) -> Candidate:
    knobs = seed_knobs(rt.manifest, state.dsl, state.dtype, rt.manifest.mode(state.mode).seed)
    return knob_candidate(rt.manifest, rt.settings, state.dsl, state.shape, knobs)


def baseline(rt: Runtime, state: ShapeState, msg: StepMessage) -> BaselineMeasured:
    cand = _seed(rt, state)
    knobs = cand.knobs
    pending = state.loop.pending
    if pending is None or pending.build is None:
        raise IllegalTransitionError(f"{state.key}: BASELINE without a built seed")
    artifact = pending.build.artifact
    gpu = rt.gpu
    guard.gate(rt, gpu, f"baseline {state.key}")
    with guard.busy(rt, gpu) as span:
        (measurement,) = rt.backend.measure(gpu, state.shape, [artifact])
        vendor = rt.backend.vendor_tflops(gpu, state.shape)
    guard.after_run(gpu, measurement)
    return BaselineMeasured(
        knobs=knobs,
        source=cand.source,
        measurement=measurement,
        vendor_tflops=vendor,
        artifact=artifact,
        **span.fields(),
    )


def profile(rt: Runtime, state: ShapeState, msg: StepMessage) -> Profiled:
    artifact = _best_artifact(state)
    gpu = rt.gpu
    guard.gate(rt, gpu, f"profile {state.key}")
    with guard.busy(rt, gpu) as span:
        result = rt.backend.profile(gpu, state.shape, artifact)
    return Profiled(profile=result.model_copy(update=span.fields()))


def ideate(rt: Runtime, state: ShapeState, msg: StepMessage) -> Proposed | Rejected:
    """Gather the iteration's ``loop.candidates`` candidates: while transfer is due, the nearest advanced
    neighbours' best kernels fill the first slots (no proposer call for them), the proposer the slots left
    (:func:`gather`); one event names them all (:func:`candidates_event`). A simulated think time applies
    when the proposer was called. A proposer that has produced only attempts for
    ``max_attempts_in_a_row`` calls parks the shape (TerminalError) instead of looping on."""
    stuck = state.loop.attempts_in_a_row
    if stuck >= rt.settings.max_attempts_in_a_row:
        raise TerminalError(
            f"{stuck} attempts in a row and nothing measured (attempts.jsonl says why): its proposer "
            "is stuck; fix it or raise CROQQ_MAX_ATTEMPTS_IN_A_ROW, then `croqq retry`"
        )
    proposer = rt.proposer
    ctx = propose_context(rt, state)
    ready = transfer.neighbour_ideas(rt, state, ctx, limit=ctx.candidates)
    calls = range(len(ready) + 1, ctx.candidates + 1)
    if proposer.is_agent:  # DeferredError: the shape waits
        for name in dict.fromkeys(proposer.for_candidate(n).name for n in calls):
            agents.wait_until_allowed(rt.client, name, state.key)
    answers = gather(rt, state, ctx, ready)
    if calls and rt.settings.backend == "sim" and rt.settings.time_scale > 0 and not proposer.is_agent:
        time.sleep(think_s(rt.settings, msg.step_id) * rt.settings.time_scale)
    event = candidates_event(answers)
    if isinstance(event, Rejected):
        log.info(
            "%s iter%03d: %s rejected: %s",
            state.key,
            ctx.iteration,
            event.rejection.proposer,
            event.rejection.reason,
        )
    return event


def propose_context(rt: Runtime, state: ShapeState) -> ProposeContext:
    """Everything an IDEATE step knows about its shape, its nearest advanced neighbours included."""
    loop = state.loop
    history = hist.load(rt.client, state.sid)
    phase, reason = next_phase(loop.strategy, history, loop.profile_fresh)
    profile = loop.last_profile
    return ProposeContext(
        shape=state.shape,
        dsl=state.dsl,
        gpu_type=state.gpu_type,
        iteration=loop.current_iter + 1,
        candidates=loop.candidates,
        knob_space=rt.manifest.dsl(state.dsl).knobs,
        best_knobs=loop.best_knobs or loop.seed_knobs,
        best_source=_best_source(rt, state),
        best_iter=max(loop.best_iter, 0),
        best_tflops=loop.best_tflops,
        baseline_tflops=loop.baseline_tflops,
        vendor_tflops=loop.vendor_tflops,
        peak_tflops=rt.manifest.gpu(state.gpu_type).peak_tflops[state.dtype],
        strategy=loop.strategy,
        consecutive_discards=loop.consecutive_discards,
        phase=phase,
        phase_reason=reason,
        bottleneck=profile.bottleneck if profile else "unknown",
        profile_metrics=profile.metrics if profile else {},
        tried=sorted(rt.client.smembers(keys.ideas(state.sid))),
        history=history,
        neighbours=transfer.advanced_neighbours(rt, state) if _wants_neighbours(rt, state) else [],
    )


def _wants_neighbours(rt: Runtime, state: ShapeState) -> bool:
    """Whether this IDEATE reads the neighbours (one scan of the shape summaries): an agent sees them at
    every IDEATE; a search strategy only uses them while transfer is due."""
    loop = state.loop
    return rt.proposer.is_agent or transfer_due(loop.current_iter, loop.consecutive_discards)


def gather(
    rt: Runtime, state: ShapeState, ctx: ProposeContext, ready: Sequence[Idea | Rejection] = ()
) -> list[Idea | Rejection]:
    """The answers for candidates 1..N in order: ``ready`` first, then one proposer call per slot left,
    each with its own ``candidate`` number. A search strategy (milliseconds) is called slot after slot,
    each call with the earlier answers' hashes added to ``tried`` so that it never repeats them; agents run
    in parallel threads, spread round-robin over the configured agents. Every agent call is recorded."""
    answers: list[Idea | Rejection] = list(ready[: ctx.candidates])
    slots = range(len(answers) + 1, ctx.candidates + 1)
    if not rt.proposer.is_agent:
        for n in slots:
            tried = [*ctx.tried, *(a.content_hash for a in answers if a.content_hash)]
            answers.append(rt.proposer.propose(ctx.model_copy(update={"candidate": n, "tried": tried})))
        return answers

    def call(n: int) -> Idea | Rejection:
        proposer = rt.proposer.for_candidate(n)
        answer = proposer.propose(ctx.model_copy(update={"candidate": n}))
        agents.record_call(rt.client, proposer.name, answer, rt.settings)
        return answer

    if len(slots) <= 1:
        return answers + [call(n) for n in slots]
    with ThreadPoolExecutor(len(slots), thread_name_prefix=f"ideate-{state.key}") as pool:
        return answers + list(pool.map(call, slots))


def candidates_event(answers: Sequence[Idea | Rejection]) -> Proposed | Rejected:
    """One event for candidates 1..N: the first idea is the primary, the others siblings; an idea whose
    content hash an earlier candidate has is a repeat of it (never built); none: the first rejection,
    with every other candidate as a sibling."""
    first: dict[str, int] = {}
    sibs: list[Sibling] = []
    for n, answer in enumerate(answers, start=1):
        if isinstance(answer, Rejection):
            sibs.append(Sibling(candidate=n, rejection=answer))
        elif answer.content_hash in first:
            earlier = first[answer.content_hash]
            why = Rejection(
                proposer=answer.proposer,
                reason=f"candidate {n} repeats candidate {earlier} (content hash {answer.content_hash[:12]})",
                kind="repeat",
                agent=answer.agent,
                summary=answer.summary,
                content_hash=answer.content_hash,
            )
            sibs.append(Sibling(candidate=n, rejection=why, repeat_of=earlier))
        else:
            first[answer.content_hash] = n
            sibs.append(Sibling(candidate=n, idea=answer))
    primary = next((s for s in sibs if s.idea is not None), None)
    if primary is None or primary.idea is None:  # every candidate a rejection (a repeat needs an idea)
        assert sibs[0].rejection is not None
        return Rejected(rejection=sibs[0].rejection, siblings=sibs[1:])
    others = [s for s in sibs if s.candidate != primary.candidate]
    return Proposed(idea=primary.idea, candidate=primary.candidate, siblings=others)


def think_s(settings: Settings, step_id: str) -> float:
    """The simulated agent's think time for one IDEATE step (before time scaling): ``sim_ideate_s``, or
    with ``sim_ideate_sigma`` a lognormal draw of that median seeded by the step id (a redelivered step
    thinks as long again), cut at ``agent_timeout_s`` as a real agent would be."""
    seconds = settings.sim_ideate_s
    if settings.sim_ideate_sigma > 0:
        seconds *= math.exp(settings.sim_ideate_sigma * random.Random(step_id).gauss(0.0, 1.0))
    return min(seconds, settings.agent_timeout_s)


def implement(rt: Runtime, state: ShapeState, msg: StepMessage) -> Built | BestBuilt:
    s = rt.settings  # a build folder's full disk is this host's problem: the step waits (DiskFullError)
    diskspace.require(s.resolved_build_dir(), s.disk_reserve_bytes, "the build folder", s.disk_retry_s)
    pending = state.loop.pending
    if state.loop.phase == Phase.BASELINE:
        return Built(build=_build(rt, state, _seed(rt, state)))
    if state.loop.phase in (Phase.PROFILE, Phase.MEASURE):  # the best has no artifact (see step_kind)
        return BestBuilt(artifact=_build_best(rt, state))
    if pending is None or pending.idea is None:
        raise IllegalTransitionError(f"{state.key}: IMPLEMENT without an idea")
    build = pending.build or _build_idea(rt, state, pending.idea)
    builds: dict[int, BuildOutcome] = {}
    repeats: dict[int, int] = {}
    binaries = {rt.backend.binary_digest(state.shape, build.artifact): pending.candidate} if build.ok else {}
    for sib in pending.siblings:  # built one after another: a build host compiles one kernel at a time
        if sib.buildable:
            assert sib.idea is not None
            builds[sib.candidate] = _build_idea(rt, state, sib.idea)
        sib_build = builds.get(sib.candidate) or (sib.build if sib.measurable else None)
        if sib_build is None or not sib_build.ok:
            continue
        digest = rt.backend.binary_digest(state.shape, sib_build.artifact)
        if digest in binaries and sib.candidate in builds:  # the same bytes: measured once
            repeats[sib.candidate] = binaries[digest]
        binaries.setdefault(digest, sib.candidate)
    return Built(build=build, builds=builds, repeats=repeats)


def _build(rt: Runtime, state: ShapeState, cand: Candidate) -> BuildOutcome:
    """Build one candidate; a real compile's time goes to its family's histogram (the exporter's
    croqq_compile_seconds; a cached binary or a knob rule took none)."""
    outcome = rt.backend.build(state.shape, cand)
    if outcome.seconds > 0:
        stats.record_compile(rt.client, cand.dsl, outcome.seconds)
    return outcome


def _build_idea(rt: Runtime, state: ShapeState, idea: Idea) -> BuildOutcome:
    try:
        cand = _candidate(rt, state, idea.source)
    except SourceError as exc:  # a header this build host does not have: the build fails, like nvcc's
        return BuildOutcome(ok=False, reason=str(exc)[:300], log=str(exc))
    return _build(rt, state, cand)


def _build_best(rt: Runtime, state: ShapeState) -> str:
    """The best kernel built again here, on a build worker; a best that does not build parks the shape."""
    build = _build(rt, state, _candidate(rt, state, _best_source(rt, state)))
    if not build.ok:
        raise TerminalError(f"{state.key}: the best kernel does not build: {build.reason}")
    return build.artifact


def measure(rt: Runtime, state: ShapeState, msg: StepMessage) -> Measured:
    pending, loop = state.loop.pending, state.loop
    if pending is None or pending.build is None:
        raise IllegalTransitionError(f"{state.key}: MEASURE without a built candidate")
    best_artifact = _best_artifact(state) if loop.best_iter >= 0 else None
    gpu = rt.gpu
    guard.gate(rt, gpu, f"measure {state.key} iter{loop.current_iter + 1:03d}")
    batch = [(s.candidate, s.build.artifact) for s in pending.siblings if s.measurable and s.build]
    numbers, artifacts = zip(*[(pending.candidate, pending.build.artifact), *batch], strict=True)
    with guard.busy(rt, gpu, measurements=len(artifacts)) as span:
        measured = rt.backend.measure_candidates(
            gpu, state.shape, artifacts, best_artifact, loop.best_tflops, rebase=state.needs_rebase
        )
    result = measured.result
    for run in measured.runs:
        guard.after_run(gpu, run)
    chosen = numbers[measured.chosen]
    return Measured(
        result=result.model_copy(update=span.fields()),
        candidate=chosen if chosen != pending.candidate else None,
        measurements={n: run for n, run in zip(numbers, measured.runs, strict=True) if n != chosen},
    )


def store_request_for(rt: Runtime, state: ShapeState, msg: StepMessage) -> StoreRequest:
    """What the writer commits for this STORE step."""
    return store_request(
        rt.manifest, rt.settings, state, msg.epoch, msg.step_id, lambda: _best_source(rt, state)
    )


def store(
    rt: Runtime, state: ShapeState, msg: StepMessage, req: StoreRequest | None = None
) -> Stored | Resynced:
    """Commit this STORE alone (``req``: its request, if already built)."""
    req = req or store_request_for(rt, state, msg)
    try:
        receipt = rt.writer.apply(req)
    except StoreGapError as exc:  # git lost commits the loop counted (or never had them): git wins
        return _resync(rt, state, str(exc))
    return stored(rt, state, msg, req, receipt)


def stored(
    rt: Runtime, state: ShapeState, msg: StepMessage, req: StoreRequest, receipt: StoreReceipt
) -> Stored | Resynced:
    """The event of a STORE the writer answered: a repeat of this step's own STORE is stored; one that
    another step stored first means the loop and the repo disagree (the repo wins)."""
    if receipt.duplicate:
        other = _stored_by(rt, state, req)
        if other != msg.step_id:
            return _resync(rt, state, f"{_label(req)} was already stored by step {other or '?'}")
    log.info(
        "%s %s %s as %s",
        state.key,
        _label(req),
        "already stored" if receipt.duplicate else "stored",
        receipt.commit[:10],
    )
    return Stored(iteration=req.round.iteration if req.round else None)


def _label(req: StoreRequest) -> str:
    if req.round is not None:
        return f"iter{req.round.iteration:03d}"
    return f"attempt{req.attempt.attempt_no if req.attempt else 0}"


def _stored_by(rt: Runtime, state: ShapeState, req: StoreRequest) -> str:
    """The step id the repo recorded for this request's iteration or attempt ('' if none)."""
    from croqq.store.load import load_attempts, load_rounds

    repo, run = rt.writer.repo, (state.gpu_type, state.dsl, state.key)
    if req.round is not None:
        rounds = [r for r in load_rounds(repo, *run) if r.iteration == req.round.iteration]
        return rounds[0].step_id if rounds else ""
    assert req.attempt is not None
    attempts = [a for a in load_attempts(repo, *run) if a.attempt_no == req.attempt.attempt_no]
    return attempts[0].step_id if attempts else ""


def _resync(rt: Runtime, state: ShapeState, why: str) -> Resynced:
    """The repo and the live loop disagree: reload the loop (and the shape's history) from the repo."""
    from croqq.store.load import load_best_source, load_checkpoint

    repo = rt.writer.repo
    ckpt = load_checkpoint(repo, state.gpu_type, state.dsl, state.key)
    best = load_best_source(repo, ckpt) if ckpt else ""
    loop = resumable_loop(ckpt, rt.settings, state.loop.max_iter, best)
    hist.rebuild(rt.client, repo, state.sid)
    log.warning(
        "%s: %s; the repo wins, the loop resumes after iteration %d", state.key, why, loop.current_iter
    )
    return Resynced(loop=loop)


EXECUTORS: dict[str, Executor] = {
    "baseline": baseline,
    "profile": profile,
    "ideate": ideate,
    "implement": implement,
    "measure": measure,
    "store": store,
}
