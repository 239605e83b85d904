"""The serialized writer: one StoreRequest in, one commit out (or none, if it was already stored).

``ResultsWriter.apply`` reads the shape's checkpoint at the branch tip: a STORE already there (iteration
<= ``current_iter``, attempt <= ``attempts``) is acknowledged with ``duplicate=True`` and nothing written,
one that would leave a gap is refused, anything else goes into ONE commit with every file it touches
(``croqq.store.paths``): the appended logs, the source with its headers (compilable from the repo alone),
perf/ files, checkpoint, state.json entry, and the best-kernel registry file when it completes the shape.
rounds.raw.jsonl leaves the raw timing and profile text to perf/ and srcs/, so appends stay small.
state.json is kept parsed in memory, keyed by its blob id, and a file whose bytes are unchanged is not
rewritten. All reads come from the branch tip, never the working tree.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from croqq.domain import source
from croqq.domain.decide import SIBLING
from croqq.errors import InvalidRecordError, StoreGapError
from croqq.store import paths, render
from croqq.store.gitrepo import GitRepo, blob_id_of
from croqq.store.integrity import RepoGuard
from croqq.store.load import load_checkpoint, load_state, parse_json, parse_jsonl
from croqq.store.schema import (
    AttemptRecord,
    Checkpoint,
    IdeaEntry,
    RoundRecord,
    SiblingRecord,
    StateFile,
    StoreReceipt,
    StoreRequest,
    SubmissionRecord,
    sibling_problem,
)

log = logging.getLogger(__name__)

COMPILE_FAIL = "COMPILE_FAIL"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


# -- request checks -----------------------------------------------------------------------------


def _refuse(req: StoreRequest, reason: str) -> InvalidRecordError:
    return InvalidRecordError(f"store request {req.step_id} ({req.key}): {reason}")


def _check_names(req: StoreRequest) -> None:
    names = {"gpu": req.gpu, "dsl": req.dsl, "key": req.key, "family": req.family, "ext": req.ext}
    names["dtype"] = req.checkpoint.dtype
    for what, value in names.items():
        if not _NAME.match(value) or ".." in value:
            raise _refuse(req, f"{what} {value!r} is not a safe path component")
    ck = req.checkpoint
    if req.key != f"{ck.dtype}_{ck.m}x{ck.n}x{ck.k}":
        raise _refuse(req, f"key does not match the checkpoint's shape {ck.dtype} {ck.m}x{ck.n}x{ck.k}")
    for what, path in (
        ("checkpoint best_kernel", ck.best_kernel),
        ("state best_kernel", req.state.best_kernel),
    ):
        if path and not paths.is_inside_repo(path):
            raise _refuse(req, f"{what} {path!r} leaves the repo")


def _check_iteration(req: StoreRequest, rnd: RoundRecord) -> None:
    ck = req.checkpoint
    if rnd.key != req.key or rnd.epoch != req.epoch or rnd.step_id != req.step_id:
        raise _refuse(req, "round key/epoch/step_id differ from the request's")
    if ck.current_iter != rnd.iteration:
        raise _refuse(req, f"checkpoint current_iter {ck.current_iter} != round iteration {rnd.iteration}")
    expected = src_path(req, rnd)
    if rnd.kernel != expected:
        raise _refuse(req, f"round kernel {rnd.kernel!r} is not its source path {expected!r}")
    if not req.source:
        raise _refuse(req, "an iteration needs its source")
    if req.complete and (not req.best_source or ck.status != "done"):
        raise _refuse(req, "complete needs best_source and a checkpoint with status done")
    problem = sibling_problem(rnd.candidate, rnd.siblings)
    if problem:
        raise _refuse(req, problem)
    kernels = {s.kernel for s in rnd.siblings if s.kernel}
    if set(req.sibling_sources) != kernels:
        raise _refuse(req, "sibling sources are not the siblings' kernels")
    folder = paths.RunPaths(req.gpu, req.dsl).srcs_dir(req.key) + "/"
    if any(not k.startswith(folder) or not paths.is_inside_repo(k) for k in kernels):
        raise _refuse(req, f"a sibling kernel is not under {folder}")


def _check_attempt(req: StoreRequest, att: AttemptRecord) -> None:
    if att.key != req.key or att.epoch != req.epoch or att.step_id != req.step_id:
        raise _refuse(req, "attempt key/epoch/step_id differ from the request's")
    if req.checkpoint.attempts != att.attempt_no:
        raise _refuse(req, f"checkpoint attempts {req.checkpoint.attempts} != attempt_no {att.attempt_no}")
    if req.complete:
        raise _refuse(req, "a compile-failed attempt cannot complete a shape")
    problem = sibling_problem(att.candidate, att.siblings)
    if problem:
        raise _refuse(req, problem)


def check_request(req: StoreRequest) -> None:
    """Refuse (InvalidRecordError) a request whose paths leave the repo or whose fields disagree."""
    if req.checkpoint.key != req.key:
        raise _refuse(req, f"checkpoint is for {req.checkpoint.key!r}")
    ck, st = req.checkpoint, req.state
    if (ck.status, ck.best_iter, ck.best_kernel) != (st.status, st.best_iter, st.best_kernel):
        raise _refuse(req, "state entry disagrees with the checkpoint")
    _check_names(req)
    if req.kind == "iteration":
        if req.round is None or req.attempt is not None:
            raise _refuse(req, "kind iteration needs a round and no attempt")
        _check_iteration(req, req.round)
    else:
        if req.attempt is None or req.round is not None:
            raise _refuse(req, "kind attempt needs an attempt and no round")
        _check_attempt(req, req.attempt)


def src_path(req: StoreRequest, rnd: RoundRecord) -> str:
    tag = rnd.idea.tag if rnd.idea else "baseline"
    return paths.RunPaths(req.gpu, req.dsl).src(req.key, rnd.iteration, tag, req.ext)


# -- the draft of one commit ----------------------------------------------------------------------


class TipReader(Protocol):
    """Where a draft reads the current files from: a GitRepo (its branch tip), or anything alike."""

    def read(self, path: str) -> bytes | None: ...

    def blob_id(self, path: str) -> str | None: ...


StateCache = dict[str, tuple[str, dict[str, str]]]  # state.json path -> (blob id, key -> its line)


class _Draft:
    """The changes one commit will make, on top of the branch tip (reads see earlier staged changes)."""

    def __init__(self, repo: TipReader, state_cache: StateCache) -> None:
        self.repo = repo
        self.changes: dict[str, bytes | None] = {}
        self._cache = state_cache
        self._states: dict[str, tuple[paths.RunPaths, dict[str, str]]] = {}
        self._loaded: dict[str, dict[str, str] | None] = {}  # state.json entries as read (None: no file)
        self._checkpoints: dict[str, Checkpoint] = {}

    def read(self, path: str) -> bytes | None:
        return self.changes[path] if path in self.changes else self.repo.read(path)

    def put(self, path: str, text: str) -> None:
        self.changes[path] = text.encode()

    def put_source(self, root: str, path: str, text: str, headers: dict[str, str]) -> None:
        """A source and its headers (:func:`croqq.domain.source.stored_files`); a header path names its
        content, so one already in the draft or at the tip is not written again."""
        for file, body in source.stored_files(root, path, text, headers).items():
            if file == path or (file not in self.changes and self.repo.blob_id(file) is None):
                self.put(file, body)

    def append(self, path: str, text: str, header: str = "") -> None:
        old = self.read(path)
        self.changes[path] = (old if old is not None else header.encode()) + text.encode()

    def checkpoint(self, run: paths.RunPaths, key: str) -> Checkpoint | None:
        path = run.checkpoint(key)
        if path in self._checkpoints:
            return self._checkpoints[path]
        data = self.repo.read(path)
        return parse_json(data, Checkpoint, path) if data is not None else None

    def set_checkpoint(self, run: paths.RunPaths, ckpt: Checkpoint) -> None:
        path = run.checkpoint(ckpt.key)
        self._checkpoints[path] = ckpt
        self.put(path, ckpt.model_dump_json(indent=2) + "\n")

    def state(self, run: paths.RunPaths) -> dict[str, str]:
        """The run's state.json lines (key -> rendered line), parsed once per blob id."""
        path = run.state_json
        if path not in self._states:
            blob = self.repo.blob_id(path)
            cached = self._cache.get(path)
            if blob is None:
                entries: dict[str, str] = {}
            elif cached is not None and cached[0] == blob:
                entries = dict(cached[1])
            else:
                state = parse_json(self.repo.read(path) or b"", StateFile, path)
                entries = {key: render.state_line(key, e) for key, e in state.shapes.items()}
            self._states[path] = (run, entries)
            self._loaded[path] = dict(entries) if blob is not None else None
        return self._states[path][1]

    def finish(self) -> dict[str, bytes | None]:
        """The changes; a state.json whose entries did not change is not rewritten."""
        for path, (run, entries) in self._states.items():
            if entries != self._loaded[path]:
                self.put(path, render.state_text(run.gpu, run.dsl, entries))
        return self.changes

    def remember_states(self, committed: bool = True) -> None:
        """After the commit landed: the staged state.json files are the tip's now (their ids are read
        from the tip, or hashed when the caller writes the files elsewhere)."""
        for path, (_, entries) in self._states.items():
            data = self.changes.get(path)
            blob = self.repo.blob_id(path) if committed or data is None else None
            if blob is not None or data is not None:
                self._cache[path] = (blob or blob_id_of(data or b""), entries)


# -- staging one request ------------------------------------------------------------------------


def _lean(rnd: RoundRecord) -> RoundRecord:
    """The round without the raw texts that perf/ already holds."""
    cand = rnd.measure.candidate.model_copy(update={"raw": ""})
    update: dict[str, object] = {"measure": rnd.measure.model_copy(update={"candidate": cand})}
    if rnd.profile is not None:
        update["profile"] = rnd.profile.model_copy(update={"raw": ""})
    if rnd.idea is not None and rnd.idea.source:
        update["idea"] = rnd.idea.model_copy(update={"source": ""})  # srcs/ holds it
    return rnd.model_copy(update=update)


def _idea_entry(req: StoreRequest, rnd: RoundRecord) -> IdeaEntry:
    idea = rnd.idea
    if idea is None:
        digest = hashlib.sha256(req.source.encode()).hexdigest()
        return IdeaEntry(
            content_hash=digest,
            tag="baseline",
            summary="baseline",
            strategy=rnd.strategy,
            iteration=rnd.iteration,
            decision=rnd.decision,
            tflops=rnd.tflops,
        )
    return IdeaEntry(
        content_hash=idea.content_hash,
        tag=idea.tag,
        summary=idea.summary,
        strategy=idea.strategy,
        iteration=rnd.iteration,
        decision=rnd.decision,
        tflops=rnd.tflops,
    )


def _sibling_idea(sib: SiblingRecord) -> dict[str, object]:
    """A sibling's ideas.jsonl fields (its decision: SIBLING, or how it failed)."""
    assert sib.idea is not None
    m = sib.measurement
    if sib.repeat_of is not None:
        decision = "REJECTED_repeat"
    elif sib.built is False:
        decision = COMPILE_FAIL
    elif m is not None and m.outcome != "ok":
        decision = f"{SIBLING}_FAIL_{m.outcome}"
    else:
        decision = SIBLING
    return {
        "content_hash": sib.idea.content_hash,
        "tag": sib.idea.tag,
        "summary": sib.idea.summary,
        "strategy": sib.idea.strategy,
        "decision": decision,
        "tflops": sib.tflops,
    }


def _stage_iteration(draft: _Draft, req: StoreRequest, rnd: RoundRecord) -> None:
    run, key = paths.RunPaths(req.gpu, req.dsl), req.key
    draft.append(run.results_tsv(key), render.tsv_line(render.results_row(rnd)), render.tsv_header())
    draft.append(run.rounds_raw(key), _lean(rnd).model_dump_json() + "\n")
    draft.append(run.rounds_md(key), render.round_markdown(rnd), render.rounds_md_header(key))
    draft.append(run.ideas(key), _idea_entry(req, rnd).model_dump_json() + "\n")
    draft.put_source(run.root, src_path(req, rnd), req.source, req.headers)
    for path, text in req.sibling_sources.items():
        draft.put_source(run.root, path, text, req.sibling_headers)
    for sib in rnd.siblings:
        if sib.idea is not None:
            entry = _idea_entry(req, rnd).model_copy(update=_sibling_idea(sib))
            draft.append(run.ideas(key), entry.model_dump_json() + "\n")
    draft.put(run.timing(key, rnd.iteration), render.timing_text(rnd))
    if rnd.profile is not None:
        draft.put(run.profile(key, rnd.iteration), render.profile_text(rnd))
    if req.complete:
        best = paths.best_kernel(req.family, req.checkpoint.dtype, key, req.ext)
        draft.put_source(run.root, best, req.best_source, req.best_headers)


def _stage_attempt(draft: _Draft, req: StoreRequest, att: AttemptRecord) -> None:
    run, key = paths.RunPaths(req.gpu, req.dsl), req.key
    draft.append(run.attempts(key), att.model_dump_json() + "\n")
    for sib in att.siblings:
        if sib.idea is not None:
            entry = IdeaEntry(iteration=None, **_sibling_idea(sib))
            draft.append(run.ideas(key), entry.model_dump_json() + "\n")
    if att.idea is None:
        return
    entry = IdeaEntry(
        content_hash=att.idea.content_hash,
        tag=att.idea.tag,
        summary=att.idea.summary,
        strategy=att.idea.strategy,
        iteration=None,
        decision=COMPILE_FAIL if att.kind == "compile" else f"REJECTED_{att.kind}",
        tflops=0.0,
    )
    draft.append(run.ideas(key), entry.model_dump_json() + "\n")


def _is_stored(draft: _Draft, req: StoreRequest) -> bool:
    """True if the tip already holds this STORE; refuses an iteration that would leave a gap."""
    run = paths.RunPaths(req.gpu, req.dsl)
    ckpt = draft.checkpoint(run, req.key)
    if req.attempt is not None:
        return req.attempt.attempt_no <= (ckpt.attempts if ckpt else 0)
    assert req.round is not None
    done = ckpt.current_iter if ckpt else -1
    if req.round.iteration <= done:
        return True
    if req.round.iteration != done + 1:
        raise StoreGapError(
            f"store request {req.step_id} ({req.key}): iteration {req.round.iteration} would leave a gap "
            f"after stored iteration {done}"
        )
    return False


def _stage(draft: _Draft, req: StoreRequest) -> bool:
    """Stage every file of one request; False when it is already stored."""
    check_request(req)
    if _is_stored(draft, req):
        return False
    if req.round is not None:
        _stage_iteration(draft, req, req.round)
    elif req.attempt is not None:
        _stage_attempt(draft, req, req.attempt)
    run = paths.RunPaths(req.gpu, req.dsl)
    draft.set_checkpoint(run, req.checkpoint)
    draft.state(run)[req.key] = render.state_line(req.key, req.state)
    return True


def plan_changes(
    req: StoreRequest, tip: TipReader, state_cache: StateCache | None = None
) -> dict[str, bytes | None] | None:
    """Every file change one request makes on top of ``tip``; None when it is already stored there.
    (What :meth:`ResultsWriter.apply` commits; benchmarks use it to write the same files another way.)"""
    draft = _Draft(tip, state_cache if state_cache is not None else {})
    if not _stage(draft, req):
        return None
    changes = draft.finish()
    draft.remember_states(committed=False)
    return changes


# -- the writer ---------------------------------------------------------------------------------


class ResultsWriter:
    """Commits STOREs to the results repo; the only writer of that repo (the caller holds the lease)."""

    def __init__(self, repo: GitRepo) -> None:
        self.repo = repo
        self._state_cache: StateCache = {}
        self.on_commit: Callable[[float], None] | None = None  # seconds of each commit (of 1+ STOREs)
        self.guard: RepoGuard | None = None  # damage in the repo: nothing is committed on top of it

    def _require_intact(self) -> None:
        """Raise RepoCorruptError while the guard says the repo is damaged (it re-checks when due)."""
        if self.guard is not None:
            self.guard.require()

    def _committed(self, started: float) -> None:
        if self.on_commit is None:
            return
        try:
            self.on_commit(time.perf_counter() - started)
        except Exception as exc:  # a metric never fails a STORE that is already committed
            log.warning("could not record the commit time: %s", exc)

    def apply(self, req: StoreRequest) -> StoreReceipt:
        """Store one iteration or attempt in one commit; a repeat is acknowledged and changes nothing."""
        self._require_intact()
        started = time.perf_counter()
        iteration = req.round.iteration if req.round is not None else None
        draft = _Draft(self.repo, self._state_cache)
        if not _stage(draft, req):
            log.info("%s %s already stored; acknowledged", req.key, _label(req))
            return StoreReceipt(commit=self.repo.head() or "", duplicate=True, iteration=iteration)
        commit = self.repo.commit(draft.finish(), render.commit_message(req))
        draft.remember_states()
        self._committed(started)
        log.info("stored %s %s as %s", req.key, _label(req), commit[:12])
        return StoreReceipt(commit=commit, duplicate=False, iteration=iteration)

    def apply_group(
        self, reqs: Sequence[StoreRequest], appends: Mapping[str, str] | None = None
    ) -> list[StoreReceipt]:
        """Group commit: store several requests in ONE commit (duplicates acknowledged as in apply).
        ``appends``: text appended to further files in the same commit (an import's idea notes)."""
        self._require_intact()
        started = time.perf_counter()
        draft = _Draft(self.repo, self._state_cache)
        fresh = [_stage(draft, req) for req in reqs]
        for path, text in (appends or {}).items():
            if not paths.is_inside_repo(path):
                raise InvalidRecordError(f"{path}: an append that leaves the repo")
            draft.append(path, text)
        commit = self.repo.head() or ""
        if any(fresh) or appends:
            stored = [r for r, new in zip(reqs, fresh, strict=True) if new]
            appended = f"store: {len(appends or {})} file(s)"
            message = render.group_commit_message(stored) if stored else appended
            commit = self.repo.commit(draft.finish(), message)
            draft.remember_states()
            self._committed(started)
            log.info("stored %d record(s) in one commit %s", len(stored), commit[:12])
        return [
            StoreReceipt(commit=commit, duplicate=not new, iteration=r.round.iteration if r.round else None)
            for r, new in zip(reqs, fresh, strict=True)
        ]

    def record_submissions(self, records: Sequence[SubmissionRecord]) -> str | None:
        """Append the submissions not yet in their run's submissions.jsonl, in one commit (None: all of
        them were there already)."""
        self._require_intact()
        draft = _Draft(self.repo, self._state_cache)
        new: list[SubmissionRecord] = []
        for rec in records:
            path = paths.RunPaths(rec.gpu_type, rec.dsl).submissions
            _check_names_of(rec)
            known = {r.submission for r in parse_jsonl(draft.read(path) or b"", SubmissionRecord, path)}
            if rec.submission not in known:
                draft.append(path, rec.model_dump_json() + "\n")
                new.append(rec)
        if not new:
            return None
        shapes = sum(len(r.shapes) for r in new)
        subject = f"submit: {', '.join(r.submission for r in new)} ({shapes} shape(s))"
        commit = self.repo.commit(draft.finish(), subject)
        log.info("recorded %s as %s", subject, commit[:12])
        return commit

    def put_files(self, files: Mapping[str, str], subject: str) -> str | None:
        """Write whole files in one commit (an import's read-only history); None when every file already
        holds these bytes."""
        self._require_intact()
        changed: dict[str, bytes | None] = {
            p: t.encode() for p, t in files.items() if self.repo.read(p) != t.encode()
        }
        for path in changed:
            if not paths.is_inside_repo(path):
                raise InvalidRecordError(f"{path}: a file that leaves the repo")
        if not changed:
            return None
        commit = self.repo.commit(changed, subject)
        log.info("%s as %s", subject, commit[:12])
        return commit

    def close(self) -> None:
        """Flush the index and run the last repack (see GitRepo.close)."""
        self.repo.close()

    def refresh_summary(self, gpu: str, dsl: str) -> str | None:
        """Rewrite the run's compaction-summary.md from state.json and the checkpoints; returns the new
        commit, or None when there is no state or the text did not change. Also flushes the index."""
        self._require_intact()
        run = paths.RunPaths(gpu, dsl)
        state = load_state(self.repo, gpu, dsl)
        commit = None
        if state is not None:
            checkpoints: dict[str, Checkpoint] = {}
            for key in state.shapes:
                try:
                    ckpt = load_checkpoint(self.repo, gpu, dsl, key)
                except InvalidRecordError as exc:
                    log.warning("summary skips a checkpoint: %s", exc)
                    continue
                if ckpt is not None:
                    checkpoints[key] = ckpt
            text = render.compaction_summary(state, checkpoints).encode()
            if self.repo.read(run.summary_md) != text:
                commit = self.repo.commit(
                    {run.summary_md: text}, f"summary: {gpu}/{dsl} ({len(state.shapes)} shapes)"
                )
        self.repo.sync_index()
        return commit


def _check_names_of(rec: SubmissionRecord) -> None:
    for what, value in {"gpu": rec.gpu_type, "dsl": rec.dsl}.items():
        if not _NAME.match(value) or ".." in value:
            raise InvalidRecordError(
                f"submission {rec.submission}: {what} {value!r} is not a safe path component"
            )


def _label(req: StoreRequest) -> str:
    if req.round is not None:
        return paths.iter_name(req.round.iteration)
    return f"attempt{req.attempt.attempt_no if req.attempt else '?'}"
