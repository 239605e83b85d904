"""Conversions between a shape's live state and its stored records.

``store_request`` turns a shape in phase STORE into what the writer commits; ``loop_from_checkpoint``
is the way back on a cold start (Redis lost): the loop resumes after the last stored iteration.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from croqq.delivery.state import ShapeState
from croqq.domain import source as src
from croqq.domain.decide import BASELINE
from croqq.domain.fsm import Loop, Phase, Start, transition
from croqq.domain.knobs import include_resolver
from croqq.domain.manifest import Manifest
from croqq.domain.records import Measurement, MeasureResult, Sibling
from croqq.errors import IllegalTransitionError
from croqq.settings import Settings
from croqq.store import paths
from croqq.store.schema import (
    AttemptKind,
    AttemptRecord,
    Checkpoint,
    RoundRecord,
    SiblingRecord,
    StoreRequest,
    state_entry,
)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _src_path(manifest: Manifest, state: ShapeState, iteration: int, tag: str) -> str:
    ext = manifest.dsl(state.dsl).ext
    return paths.RunPaths(state.gpu_type, state.dsl).src(state.key, iteration, tag, ext)


def run_command(state: ShapeState, kernel: str, pins: Sequence[str] = ()) -> str:
    """What reproduces a stored measurement: `croqq measure` on the stored source, run in the results
    repo (results.tsv's run_command), with the exact version of each package whose headers it was built
    with (``pins``: ``name==version``; measure refuses another version in one line)."""
    requires = "".join(f" --requires {pin}" for pin in pins)
    where = f"--gpu {state.gpu_type} --key {state.key} --dsl {state.dsl}"
    return f"croqq measure {where} --source {kernel}{requires}"


# What a checkpoint keeps of the shape and of its loop, field for field (the loop's counters and best so far).
_SHAPE_FIELDS = {"key", "dtype", "m", "n", "k", "mode", "scenarios", "region"}
_LOOP_FIELDS = {
    "current_iter",
    "best_iter",
    "best_tflops",
    "baseline_tflops",
    "best_knobs",
    "seed_knobs",
    "consecutive_discards",
    "attempts",
    "candidates",
    "keeps",
    "fails",
}


def _checkpoint(manifest: Manifest, state: ShapeState, loop: Loop, status: str) -> Checkpoint:
    best_kernel = _src_path(manifest, state, loop.best_iter, loop.best_tag) if loop.best_iter >= 0 else ""
    return Checkpoint(
        **state.model_dump(include=_SHAPE_FIELDS),
        **loop.model_dump(include=_LOOP_FIELDS),
        max_iter=loop.max_iter,
        best_kernel=best_kernel,
        status=status,
        last_updated=now_iso(),
    )


def _after(state: ShapeState) -> Loop:
    """The loop as it will be once this STORE is acknowledged (what the checkpoint must say)."""
    from croqq.domain.fsm import Stored, transition

    pending = state.loop.pending
    assert pending is not None
    return transition(state.loop, Stored(iteration=pending.iteration))


def _siblings(
    manifest: Manifest,
    state: ShapeState,
    iteration: int | None,
    siblings: list[Sibling],
    read: Callable[[str], str | None],
) -> tuple[list[SiblingRecord], dict[str, str], dict[str, str]]:
    """The siblings' records, and (for an iteration) the source of each that built, by its srcs/ path,
    with their header closures: a sibling can be measured again from the repo (`croqq measure`)."""
    records: list[SiblingRecord] = []
    sources: dict[str, str] = {}
    headers: dict[str, str] = {}
    for s in siblings:
        kernel = ""
        if iteration is not None and s.idea is not None and s.build is not None and s.build.ok:
            kernel = _src_path(manifest, state, iteration, f"c{s.candidate}-{s.idea.tag}")
            sources[kernel] = s.idea.source
            headers |= src.header_closure(s.idea.source, read)
        records.append(
            SiblingRecord(
                candidate=s.candidate,
                idea=s.idea.model_copy(update={"source": ""}) if s.idea else None,
                rejection=s.rejection,
                built=s.build.ok if s.build else None,
                build_reason=s.build.reason if s.build and not s.build.ok else "",
                measurement=s.measurement.model_copy(update={"raw": ""}) if s.measurement else None,
                repeat_of=s.repeat_of,
                kernel=kernel,
            )
        )
    return records, sources, headers


def store_request(
    manifest: Manifest,
    settings: Settings,
    state: ShapeState,
    epoch: int,
    step_id: str,
    best_source_of: Callable[[], str] | None = None,
) -> StoreRequest:
    """What the writer commits for the shape's pending iteration or attempt. ``best_source_of`` gives
    the best source when the loop has none (a loop rebuilt from a checkpoint) and the shape completes."""
    loop, pending = state.loop, state.loop.pending
    if loop.phase != Phase.STORE or pending is None:
        raise IllegalTransitionError(f"{state.sid}: nothing to store in phase {loop.phase}")
    after = _after(state)
    status = "done" if after.phase == Phase.DONE else "active"
    ckpt = _checkpoint(manifest, state, after, status)
    spec = manifest.dsl(state.dsl)
    common = {
        "gpu": state.gpu_type,
        "dsl": state.dsl,
        "key": state.key,
        "family": manifest.dtypes[state.dtype].family,
        "ext": spec.ext,
        "epoch": epoch,
        "step_id": step_id,
        "checkpoint": ckpt,
        "state": state_entry(ckpt),
    }
    read = src.read_from(include_resolver(manifest, state.dsl, settings.kernels_dir))
    iteration = pending.iteration if pending.attempt_no is None else None
    siblings, sibling_sources, sibling_headers = _siblings(manifest, state, iteration, pending.siblings, read)
    if pending.attempt_no is not None:
        rej, build = pending.rejection, pending.build
        kind: AttemptKind
        if rej is not None:
            kind, reason, log = rej.kind, rej.reason, ""
        else:
            assert build is not None
            kind, reason, log = "compile", build.reason or "compile failed", build.log[-4000:]
        idea = pending.idea.model_copy(update={"source": ""}) if pending.idea else None
        attempt = AttemptRecord(
            key=state.key,
            attempt_no=pending.attempt_no,
            after_iter=loop.current_iter,
            kind=kind,
            proposer=rej.proposer if rej else (idea.proposer if idea else ""),
            idea=idea,
            agent=rej.agent if rej else (idea.agent if idea else None),
            reason=reason,
            log=log,
            epoch=epoch,
            step_id=step_id,
            timestamp=now_iso(),
            candidate=pending.candidate,
            siblings=siblings,
        )
        return StoreRequest(kind="attempt", attempt=attempt, **common)
    iteration = pending.iteration
    assert iteration is not None
    knobs = pending.idea.knobs if pending.idea else loop.seed_knobs
    tag = pending.idea.tag if pending.idea else "baseline"
    source = pending.idea.source if pending.idea else loop.seed_source
    kernel = _src_path(manifest, state, iteration, tag)
    measure = pending.measure or MeasureResult(
        candidate=Measurement(outcome="crash", detail="no measurement")
    )
    profile = loop.last_profile if loop.profile_fresh else None
    best_source = ""
    if status == "done" and after.best_iter >= 0:
        best_source = after.best_source or (best_source_of() if best_source_of else "")
    round_ = RoundRecord(
        key=state.key,
        iteration=iteration,
        decision=pending.decision or BASELINE,
        tflops=pending.tflops,
        hw_eff_pct=round(100.0 * pending.tflops / manifest.gpu(state.gpu_type).peak_tflops[state.dtype], 3),
        best_before=pending.best_before,
        best_after=after.best_tflops,
        kernel=kernel,
        knobs=knobs,
        idea=pending.idea,
        strategy=loop.strategy,
        consecutive_discards=after.consecutive_discards,
        bottleneck=loop.last_profile.bottleneck if loop.last_profile else "unknown",
        profile=profile,
        measure=measure,
        run_command=run_command(state, kernel, manifest.dsl(state.dsl).build.pins),
        gpu_uuid=measure.gpu_uuid or (state.gpu_uuid or ""),
        epoch=epoch,
        step_id=step_id,
        timestamp=now_iso(),
        candidate=pending.candidate,
        siblings=siblings,
    )
    return StoreRequest(
        kind="iteration",
        round=round_,
        source=source,
        headers=src.header_closure(source, read),
        complete=status == "done",
        best_source=best_source,
        best_headers=src.header_closure(best_source, read) if best_source else {},
        sibling_sources=sibling_sources,
        sibling_headers=sibling_headers,
        **common,
    )


def loop_from_checkpoint(
    ckpt: Checkpoint, settings: Settings, max_iter: int | None = None, best_source: str = ""
) -> Loop:
    """Resume a loop after its last stored iteration (PROFILE first: the GPU may be a different one).
    ``best_source``: the best kernel's source read back by the writer (``store.load.load_best_source``)."""
    limit = max(max_iter or ckpt.max_iter, ckpt.max_iter)
    base = Loop(
        **ckpt.model_dump(include=_LOOP_FIELDS),
        best_source=best_source,
        best_tag=_tag_of(ckpt.best_kernel),
        max_iter=limit,
        profile_every=settings.profile_every,
        noise_margin=settings.noise_margin,
    )
    if ckpt.current_iter < 0:
        return base
    if ckpt.current_iter >= limit:
        return base.model_copy(update={"phase": Phase.DONE})
    return base.model_copy(update={"phase": Phase.PROFILE})


def new_loop(settings: Settings, max_iter: int) -> Loop:
    """A new shape's loop (INIT)."""
    return Loop(max_iter=max_iter, profile_every=settings.profile_every, noise_margin=settings.noise_margin)


def resumable_loop(ckpt: Checkpoint | None, settings: Settings, max_iter: int, best_source: str = "") -> Loop:
    """The loop the repo says a shape is at, ready to be stepped: after its last stored iteration, or
    from its baseline when the repo holds nothing of it."""
    loop = (
        loop_from_checkpoint(ckpt, settings, max_iter, best_source)
        if ckpt is not None
        else new_loop(settings, max_iter)
    )
    return transition(loop, Start()) if loop.phase == Phase.INIT else loop


def _tag_of(kernel_path: str) -> str:
    """``.../iter007_raise-stages.cu`` -> ``raise-stages``."""
    name = kernel_path.rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0]
    return stem.split("_", 1)[1] if "_" in stem else ""
