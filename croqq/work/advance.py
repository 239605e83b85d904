"""What a finished step's result does to its shape, inside the ledger's transaction.

The FSM moves (DECIDE is applied at once: it needs no worker), the proposal's content hash joins the
shape's tried set, a STORE updates the statistics and the shape's history, the step's seconds join its
GPU's step times (what the pipeline depth follows: :mod:`croqq.placement.depth`), and a shape that is done
leaves its GPU slot; after the commit its GPU is filled again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from croqq.delivery import keys
from croqq.delivery.ledger import StepRecord, Write
from croqq.delivery.state import ShapeState
from croqq.domain.fsm import Measured, Phase, Proposed, Rejected, Stored, decide_event, transition
from croqq.placement import depth
from croqq.placement.assign import leave_if_finished

StoredHook = Callable[
    [Any, ShapeState, ShapeState, Stored], None
]  # (pipe in multi mode, before, after, event)


class Advance:
    def __init__(
        self, on_stored: list[StoredHook] | None = None, refill: Callable[[str], object] | None = None
    ) -> None:
        self.on_stored = list(on_stored or [])
        self.refill = refill

    def apply(self, record: StepRecord, state: ShapeState, event: Any, now: float) -> Write:
        # the STORE hooks read the state before the step: its loop (frozen: transition returns a new one)
        # and its scalar fields, so a shallow copy is enough (a deep one was 8% of the writer's CPU)
        before = state.model_copy() if isinstance(event, Stored) else None
        phase_before = state.loop.phase
        state.iter_exec_s += max(0.0, now - record.started_at)
        state.loop = transition(state.loop, event)
        if state.loop.phase == Phase.DECIDE:
            state.loop = transition(state.loop, decide_event(state.loop))
        if isinstance(event, Measured):
            state.needs_rebase = False
        tried: list[str] = []
        if isinstance(event, Proposed | Rejected):  # every candidate's hash: none is proposed again
            first = event.idea.content_hash if isinstance(event, Proposed) else event.rejection.content_hash
            others = [
                s.idea.content_hash if s.idea else (s.rejection.content_hash if s.rejection else "")
                for s in event.siblings
            ]
            tried = [h for h in (first, *others) if h]

        def write(pipe: Any) -> None:
            if state.gpu_uuid and phase_before != Phase.BASELINE:  # once a life: not its cycle
                depth.observe(pipe, state.gpu_uuid, record, now)
            if tried:
                pipe.sadd(keys.ideas(state.sid), *tried)
            if isinstance(event, Stored):
                assert before is not None
                for hook in self.on_stored:
                    hook(pipe, before, state, event)
                state.iter_t0, state.iter_exec_s = now, 0.0
            leave_if_finished(pipe, state)

        return write

    def after(self, state: ShapeState) -> None:
        if state.loop.phase == Phase.DONE and state.gpu_uuid and self.refill is not None:
            self.refill(state.gpu_uuid)
