"""A shape's history in Redis, for the agent's workspace: one entry per stored iteration or attempt.

``croqq:history:<sid>`` is a hash (field ``i<NNN>`` for an iteration, ``a<NNN>`` for an attempt) written
by a ledger hook inside the STORE transaction, so a re-run STORE overwrites its own entry instead of
adding one. A cold start rebuilds it from the results repo (:func:`entries_from_repo`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from croqq.delivery import keys
from croqq.delivery.state import ShapeState, split_sid
from croqq.domain.decide import BASELINE, SIBLING
from croqq.domain.fsm import Stored
from croqq.domain.records import HistoryEntry, Idea, Measurement, Rejection
from croqq.store.schema import AttemptRecord, RoundRecord, SiblingRecord

if TYPE_CHECKING:
    from croqq.store.gitrepo import GitRepo

EXCERPT = 400


def on_stored(pipe: Any, before: ShapeState, after: ShapeState, event: Stored) -> None:
    """Ledger hook (pipe in multi mode): remember what was just stored."""
    pending = before.loop.pending
    if pending is None:
        return
    idea, rej = pending.idea, pending.rejection
    if event.iteration is not None:
        cand = pending.measure.candidate if pending.measure else None
        entry = HistoryEntry(
            iteration=event.iteration,
            after_iter=event.iteration,
            summary=idea.summary if idea else "baseline (seed kernel)",
            decision=pending.decision or BASELINE,
            tflops=pending.tflops,
            change=idea.change if idea else "",
            proposer=idea.proposer if idea else "",
            error=(cand.detail if cand and cand.outcome != "ok" else "")[:EXCERPT],
            knobs=idea.knobs if idea else before.loop.seed_knobs,
        )
    else:
        kind = rej.kind if rej else "compile"
        error = rej.reason if rej else (pending.build.reason if pending.build else "")
        entry = HistoryEntry(
            attempt=pending.attempt_no,
            after_iter=before.loop.current_iter,
            summary=(idea.summary if idea else (rej.summary if rej else "")) or "(no candidate)",
            decision=f"ATTEMPT_{kind}",
            change=idea.change if idea else "",
            proposer=idea.proposer if idea else (rej.proposer if rej else ""),
            error=error[:EXCERPT],
            knobs=idea.knobs if idea else {},
        )
    sibs = [
        sibling_entry(
            entry,
            s.candidate,
            s.idea,
            s.rejection,
            s.measurement,
            s.repeat_of,
            s.build.reason if s.build and not s.build.ok else "",
        )
        for s in pending.siblings
    ]
    pipe.hset(keys.history(before.sid), mapping={e.field: e.model_dump_json() for e in (entry, *sibs)})


def sibling_entry(
    own: HistoryEntry,
    candidate: int,
    idea: Idea | None,
    rejection: Rejection | None,
    measurement: Measurement | None,
    repeat_of: int | None,
    build_error: str,
) -> HistoryEntry:
    """The history line of a sibling of ``own`` (its iteration's or attempt's entry): SIBLING with its
    TFLOPS when measured, else how it failed."""
    if repeat_of is not None:
        decision, error = "REPEAT", f"repeats candidate {repeat_of}"
    elif rejection is not None:
        decision, error = f"ATTEMPT_{rejection.kind}", rejection.reason
    elif build_error:
        decision, error = "ATTEMPT_compile", build_error
    elif measurement is not None and measurement.outcome != "ok":
        decision, error = f"SIBLING_FAIL_{measurement.outcome}", measurement.detail
    else:
        decision, error = (SIBLING, "") if measurement is not None else ("ATTEMPT_unmeasured", "")
    ok = measurement is not None and measurement.outcome == "ok"
    return own.model_copy(
        update={
            "candidate": candidate,
            "summary": (idea.summary if idea else (rejection.summary if rejection else ""))
            or "(no candidate)",
            "decision": decision,
            "tflops": measurement.tflops if ok and measurement else 0.0,
            "change": idea.change if idea else "",
            "proposer": idea.proposer if idea else (rejection.proposer if rejection else ""),
            "error": error[:EXCERPT],
            "knobs": idea.knobs if idea else {},
        }
    )


def _stored_siblings(own: HistoryEntry, siblings: list[SiblingRecord]) -> list[HistoryEntry]:
    return [
        sibling_entry(own, s.candidate, s.idea, s.rejection, s.measurement, s.repeat_of, s.build_reason)
        for s in siblings
    ]


def load(client: redis.Redis, sid: str) -> list[HistoryEntry]:
    raw = client.hgetall(keys.history(sid))
    entries = [HistoryEntry.model_validate_json(v) for v in raw.values()]
    return sorted(entries, key=lambda e: e.order)


def entries_from_repo(rounds: list[RoundRecord], attempts: list[AttemptRecord]) -> list[HistoryEntry]:
    """The same entries, rebuilt from the results repo's records (cold start)."""
    out = []
    for r in rounds:
        own = HistoryEntry(
            iteration=r.iteration,
            after_iter=r.iteration,
            summary=r.idea.summary if r.idea else "baseline (seed kernel)",
            decision=r.decision,
            tflops=r.tflops,
            change=r.idea.change if r.idea else "",
            proposer=r.idea.proposer if r.idea else "",
            error=(r.measure.candidate.detail if r.measure.candidate.outcome != "ok" else "")[:EXCERPT],
            knobs=r.knobs,
        )
        out += [own, *_stored_siblings(own, r.siblings)]
    for a in attempts:
        own = HistoryEntry(
            attempt=a.attempt_no,
            after_iter=a.after_iter,
            summary=(a.idea.summary if a.idea else "") or "(no candidate)",
            decision=f"ATTEMPT_{a.kind}",
            change=a.idea.change if a.idea else "",
            proposer=a.idea.proposer if a.idea else a.proposer,
            error=a.reason[:EXCERPT],
            knobs=a.idea.knobs if a.idea else {},
        )
        out += [own, *_stored_siblings(own, a.siblings)]
    return out


def save(client: redis.Redis, sid: str, entries: list[HistoryEntry]) -> None:
    if entries:
        client.hset(keys.history(sid), mapping={e.field: e.model_dump_json() for e in entries})


def rebuild(client: redis.Redis, repo: GitRepo, sid: str) -> None:
    """Replace the shape's history by what the results repo holds (git is the truth)."""
    from croqq.store.load import load_attempts, load_rounds

    gpu_type, dsl, key = split_sid(sid)
    entries = entries_from_repo(
        load_rounds(repo, gpu_type, dsl, key), load_attempts(repo, gpu_type, dsl, key)
    )
    pipe = client.pipeline()
    pipe.delete(keys.history(sid))
    if entries:
        pipe.hset(keys.history(sid), mapping={e.field: e.model_dump_json() for e in entries})
    pipe.execute()
