"""Neighbour transfer: a shape that starts or stalls is offered the best kernels of its nearest already
advanced neighbours, re-targeted to it, before its proposer is asked.

A neighbour is another shape of the live ledger with the same GPU type, family (dsl) and dtype whose best
is a kept iteration beyond its baseline; the nearest come first, in the schedule's log2 space
(:mod:`croqq.domain.neighbours`). They are found from ``croqq:summary`` (one small JSON line per shape);
only the nearest few full states are loaded. Re-targeting: a knob candidate (the template rendered with
the neighbour's knobs) is rendered again for this shape; an agent-written source gets its shape macros
rewritten. A neighbour's kernel is an idea like any other: built and measured on this shape before it
counts, a build or verification failure recorded as usual.
"""

from __future__ import annotations

import logging

from croqq.backends.toolchain import candidate_of, knob_candidate
from croqq.delivery import keys
from croqq.delivery.state import ShapeState, ShapeSummary, split_sid
from croqq.domain import source as src
from croqq.domain.knobs import render_source
from croqq.domain.neighbours import TRANSFER_NEIGHBOURS, dims, log2_distance, nearest, transfer_due
from croqq.domain.records import Idea, NeighbourKernel, Rejection
from croqq.domain.shapes import Shape, parse_key
from croqq.errors import ConfigError
from croqq.proposers._base import ProposeContext, slug
from croqq.work.context import Runtime

log = logging.getLogger(__name__)
PROPOSER = "neighbour"


def advanced_neighbours(rt: Runtime, state: ShapeState) -> list[NeighbourKernel]:
    """The best kernels of the shape's nearest advanced neighbours (at most ``TRANSFER_NEIGHBOURS``),
    nearest first, re-targeted to it; none when transfer is off."""
    if not rt.settings.transfer:
        return []
    prefix = f"{state.gpu_type}/{state.dsl}/"
    candidates: list[tuple[Shape, str]] = []
    for field, raw in rt.client.hgetall(keys.SUMMARY).items():
        sid = str(field)
        if not sid.startswith(prefix) or sid == state.sid:
            continue
        if summary_advanced(ShapeSummary.model_validate_json(raw), state.dtype):
            candidates.append((parse_key(split_sid(sid)[2]), sid))
    found = []
    for _, sid in nearest(state.shape, candidates, TRANSFER_NEIGHBOURS):
        there = rt.ledger.load_shape(sid)
        if there is not None and there.loop.best_iter > 0:
            found.append(retarget(rt, state, there))
    return found


def summary_advanced(summary: ShapeSummary, dtype: str) -> bool:
    """Whether a summary names an advanced shape of this dtype (one written before summaries carried
    ``best_iter``: when its best beats its baseline; its full state decides)."""
    if summary.dtype != dtype:
        return False
    if summary.best_iter is None:
        return summary.best_tflops > summary.baseline_tflops > 0
    return summary.best_iter > 0


def retarget(rt: Runtime, state: ShapeState, there: ShapeState) -> NeighbourKernel:
    """The neighbour's best kernel for this shape: a knob candidate rendered again, an agent-written
    source with its shape macros rewritten (or the reason it cannot be)."""
    loop = there.loop
    peak = rt.manifest.gpu(state.gpu_type).peak_tflops[state.dtype]
    source, reason = "", ""
    knob_made = not loop.best_source or src.normalize(loop.best_source) == _rendered(rt, there)
    try:
        if knob_made:
            source = render_source(rt.manifest, state.dsl, state.shape, loop.best_knobs)
        else:
            source = src.retarget_shape(loop.best_source, dims(state.shape))
    except (ConfigError, src.SourceError) as exc:
        reason = str(exc)
    return NeighbourKernel(
        key=there.key,
        distance=round(log2_distance(dims(state.shape), dims(there.shape)), 6),
        best_tflops=round(loop.best_tflops, 3),
        peak_fraction=round(loop.best_tflops / peak, 4) if peak else 0.0,
        knobs=loop.best_knobs,
        change="knobs" if knob_made else "structural",
        source=source,
        reason=reason,
    )


def _rendered(rt: Runtime, there: ShapeState) -> str:
    """The neighbour's best knobs rendered on the template at its own shape ('' if they cannot be)."""
    try:
        return src.normalize(render_source(rt.manifest, there.dsl, there.shape, there.loop.best_knobs))
    except ConfigError:
        return ""


def neighbour_ideas(
    rt: Runtime, state: ShapeState, ctx: ProposeContext, limit: int
) -> list[Idea | Rejection]:
    """Up to ``limit`` candidates from ``ctx.neighbours`` when transfer is due (the shape starts or stalls):
    an :class:`Idea` per new re-targeted kernel, a :class:`Rejection` for one that cannot be re-targeted or
    fails the knob check. Kernels the shape has tried, or equal to its own best, are skipped."""
    loop = state.loop
    if not rt.settings.transfer or not transfer_due(loop.current_iter, loop.consecutive_discards):
        return []
    tried = set(ctx.tried)
    best = src.normalize(ctx.best_source)
    found: list[Idea | Rejection] = []
    for nb in ctx.neighbours:
        answer = _offer(rt, ctx, nb)
        if answer.content_hash in tried:
            continue
        if isinstance(answer, Idea) and src.normalize(answer.source) == best:
            continue
        found.append(answer)
        if len(found) >= limit:
            break
    return found


def _offer(rt: Runtime, ctx: ProposeContext, nb: NeighbourKernel) -> Idea | Rejection:
    summary = f"best of {nb.key} ({nb.best_tflops:.1f} TFLOPS there)"
    try:
        if nb.reason:
            raise ConfigError(nb.reason)
        if nb.change == "knobs":
            cand = knob_candidate(rt.manifest, rt.settings, ctx.dsl, ctx.shape, nb.knobs)
        else:
            cand = candidate_of(rt.manifest, rt.settings, ctx.dsl, ctx.shape.dtype, nb.source)
    except (ConfigError, src.SourceError) as exc:
        # the same refusal is recorded once: its hash joins the shape's tried ones
        refused = src.sha256(f"{PROPOSER}|{nb.key}|{src.normalize(nb.source)}|{nb.knobs}")
        return Rejection(
            proposer=PROPOSER,
            reason=f"{summary}: {exc}"[:500],
            kind="check",
            summary=summary,
            content_hash=refused,
        )
    knob_names = rt.manifest.dsl(ctx.dsl).knobs
    same_structure = src.structure(cand.source, knob_names) == src.structure(ctx.best_source, knob_names)
    return Idea(
        summary=summary,
        tag=slug(f"nb-{nb.key.split('_', 1)[-1]}"),
        knobs=cand.knobs,
        content_hash=cand.content_hash,
        strategy=ctx.strategy,
        proposer=PROPOSER,
        source=cand.source,
        change="knobs" if same_structure else "structural",
        phase=ctx.phase,
    )
