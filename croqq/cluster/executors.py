"""What each step kind does: read the shape's live state, call the backend / proposer / writer, and
return the FSM event that ``Ledger.complete`` applies. Failing candidates come back as events (a
compile failure is ``Built(ok=False)``, a crash is a FAIL measurement); only infrastructure faults raise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from croqq.cluster import gpu as guard
from croqq.cluster import keys
from croqq.cluster.messages import StepMessage
from croqq.cluster.persist import loop_from_checkpoint, store_request
from croqq.cluster.runtime import Runtime
from croqq.cluster.state import ShapeState
from croqq.domain.fsm import BaselineMeasured, Built, Measured, Phase, Profiled, Proposed, Resynced, Stored
from croqq.domain.knobs import Candidate, make_candidate, seed_knobs
from croqq.errors import IllegalTransitionError, TerminalError
from croqq.proposers._base import ProposeContext

log = logging.getLogger(__name__)
Executor = Callable[[Runtime, ShapeState, StepMessage], object]


def _candidate(rt: Runtime, state: ShapeState, knobs: dict[str, int]) -> Candidate:
    return make_candidate(rt.manifest, state.dsl, state.shape, knobs)


_BUILT: dict[str, str] = {}  # content hash -> artifact, for kernels this process had to build itself
_BUILT_MAX = 512


def _artifact(rt: Runtime, state: ShapeState, cand: Candidate, what: str) -> str:
    """Build a kernel this step needs but was not handed (the seed; the best after a cold start)."""
    cached = _BUILT.get(cand.content_hash)
    if cached is not None:
        return cached
    build = rt.backend.build(state.shape, cand)
    if not build.ok:
        raise TerminalError(f"{state.key}: the {what} kernel does not build: {build.reason}")
    if len(_BUILT) >= _BUILT_MAX:
        _BUILT.pop(next(iter(_BUILT)))
    _BUILT[cand.content_hash] = build.artifact
    return build.artifact


def _best_artifact(rt: Runtime, state: ShapeState) -> str:
    loop = state.loop
    return loop.best_artifact or _artifact(rt, state, _candidate(rt, state, loop.best_knobs), "best")


def _seed(rt: Runtime, state: ShapeState) -> Candidate:
    knobs = seed_knobs(rt.manifest, state.dsl, state.dtype, rt.manifest.mode(state.mode).seed)
    return _candidate(rt, state, knobs)


def baseline(rt: Runtime, state: ShapeState, msg: StepMessage) -> BaselineMeasured:
    cand = _seed(rt, state)
    knobs = cand.knobs
    pending = state.loop.pending
    artifact = pending.build.artifact if pending and pending.build else _artifact(rt, state, cand, "seed")
    gpu = rt.gpu
    guard.gate(rt, gpu, f"baseline {state.key}")
    with guard.busy(rt, gpu):
        (measurement,) = rt.backend.measure(gpu, state.shape, [artifact])
        vendor = rt.backend.vendor_tflops(gpu, state.shape)
    guard.after_run(gpu, measurement)
    return BaselineMeasured(
        knobs=knobs,
        measurement=measurement,
        vendor_tflops=vendor,
        run_command=rt.backend.run_command(state.shape, cand),
        artifact=artifact,
    )


def profile(rt: Runtime, state: ShapeState, msg: StepMessage) -> Profiled:
    artifact = _best_artifact(rt, state)
    gpu = rt.gpu
    guard.gate(rt, gpu, f"profile {state.key}")
    with guard.busy(rt, gpu):
        result = rt.backend.profile(gpu, state.shape, artifact)
    return Profiled(profile=result)


def ideate(rt: Runtime, state: ShapeState, msg: StepMessage) -> Proposed:
    loop = state.loop
    spec = rt.manifest.dsl(state.dsl)
    ctx = ProposeContext(
        shape=state.shape,
        dsl=state.dsl,
        gpu_type=state.gpu_type,
        iteration=loop.current_iter + 1,
        knob_space=spec.knobs,
        best_knobs=loop.best_knobs or loop.seed_knobs,
        best_tflops=loop.best_tflops,
        peak_tflops=rt.manifest.gpu(state.gpu_type).peak_tflops[state.dtype],
        strategy=loop.strategy,
        consecutive_discards=loop.consecutive_discards,
        bottleneck=loop.last_profile.bottleneck if loop.last_profile else "unknown",
        tried=sorted(rt.client.smembers(keys.ideas(state.sid))),
    )
    idea = rt.proposer.propose(ctx)
    if rt.settings.backend == "sim" and rt.settings.time_scale > 0:
        time.sleep(rt.settings.sim_ideate_s * rt.settings.time_scale)  # the simulated agent's think time
    return Proposed(idea=idea)


def implement(rt: Runtime, state: ShapeState, msg: StepMessage) -> Built:
    pending = state.loop.pending
    if state.loop.phase == Phase.BASELINE:
        cand = _seed(rt, state)
    elif pending is None or pending.idea is None:
        raise IllegalTransitionError(f"{state.key}: IMPLEMENT without an idea")
    else:
        cand = _candidate(rt, state, pending.idea.knobs)
    return Built(
        build=rt.backend.build(state.shape, cand), run_command=rt.backend.run_command(state.shape, cand)
    )


def measure(rt: Runtime, state: ShapeState, msg: StepMessage) -> Measured:
    pending, loop = state.loop.pending, state.loop
    if pending is None or pending.build is None:
        raise IllegalTransitionError(f"{state.key}: MEASURE without a built candidate")
    best_artifact = _best_artifact(rt, state) if loop.best_knobs else None
    gpu = rt.gpu
    guard.gate(rt, gpu, f"measure {state.key} iter{loop.current_iter + 1:03d}")
    with guard.busy(rt, gpu):
        result = rt.backend.measure_candidate(
            gpu,
            state.shape,
            pending.build.artifact,
            best_artifact,
            loop.best_tflops,
            rebase=state.needs_rebase,
        )
    guard.after_run(gpu, result.candidate)
    return Measured(result=result)


def store(rt: Runtime, state: ShapeState, msg: StepMessage) -> Stored | Resynced:
    req = store_request(rt.manifest, rt.settings, state, msg.epoch, msg.step_id)
    receipt = rt.writer.apply(req)
    if receipt.duplicate and req.round is not None:
        resync = _resync_if_diverged(rt, state, req.round.iteration, msg.step_id)
        if resync is not None:
            return resync
    what = (
        f"iter{req.round.iteration:03d}"
        if req.round
        else f"attempt{req.attempt.attempt_no if req.attempt else 0}"
    )
    log.info(
        "%s %s %s as %s",
        state.key,
        what,
        "already stored" if receipt.duplicate else "stored",
        receipt.commit[:10],
    )
    return Stored(iteration=req.round.iteration if req.round else None)


def _resync_if_diverged(rt: Runtime, state: ShapeState, iteration: int, step_id: str) -> Resynced | None:
    """The repo already holds this iteration from another step (live state was rebuilt from a checkpoint
    that an in-flight STORE then overtook): the repo wins, the loop is reloaded from its checkpoint."""
    from croqq.store.load import load_checkpoint, load_rounds

    repo = rt.writer.repo
    stored = [r for r in load_rounds(repo, state.gpu_type, state.dsl, state.key) if r.iteration == iteration]
    if not stored or stored[0].step_id == step_id:
        return None
    ckpt = load_checkpoint(repo, state.gpu_type, state.dsl, state.key)
    if ckpt is None:
        return None
    log.warning(
        "%s iter%03d was already stored by %s; reloading the loop from the checkpoint",
        state.key,
        iteration,
        stored[0].step_id,
    )
    return Resynced(loop=loop_from_checkpoint(ckpt, rt.settings, state.loop.max_iter))


EXECUTORS: dict[str, Executor] = {
    "baseline": baseline,
    "profile": profile,
    "ideate": ideate,
    "implement": implement,
    "measure": measure,
    "store": store,
}
