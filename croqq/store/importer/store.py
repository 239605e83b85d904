"""Storing what the importer read, through croqq's one writer (one commit per imported log).

A **resumable** log (a GEMM croqq has a dtype and a seed kernel for) becomes the records of its shape
under ``tuning/<gpu>/<dsl>/shapes/<key>/``, as if croqq had tuned it, so that a later ``croqq submit``
resumes it after the imported iterations:

- every row with a TFLOPS number (0 included) becomes an iteration, numbered 0, 1, 2, ... in file order
  (ids repeat in such logs, so croqq numbers its own; each record keeps the original id, token, TFLOPS,
  kernel, file and line in ``imported``); a repeated id keeps every measurement, each its own iteration;
- a row whose build or run failed (``failure``: COMPILE_FAIL, SEGFAULT, HANG, ...) becomes an attempt
  (a 0 written as its TFLOPS is a placeholder, kept in ``imported``): kind ``compile`` for a compile
  failure, ``run`` for the others, the token kept;
- a row with neither is not stored (the reader names it as a problem);
- croqq's decision: ``BASELINE`` for a reference row (its TFLOPS is the round's ``vendor_tflops``, never
  the best), ``KEEP`` for a row that beats every earlier one among the non-reference rows whose source
  is in the tree, compiles from it and is a kernel of croqq's family of the dsl (so the best is the
  first such row with the highest TFLOPS), ``DISCARD`` otherwise;
- values croqq requires that no log has get their neutral value: ``hw_eff_pct`` 0, ``epoch`` 0,
  ``gpu_uuid`` '', ``strategy`` refine, ``mode`` from_current_best, ``timestamp`` the row's or '',
  knobs those the source defines, ``seed_knobs`` croqq's reference seed for the dtype, ``baseline_tflops``
  the highest vendor reference (0 when the log has none), ``max_iter`` the imported iterations plus the mode's
  iteration count (a later submit may ask for more);
- sources the rows name and the tree holds are stored self-contained (headers/<hash16>/ for the headers
  croqq's include folders offer by name, the others inlined: :mod:`.sources`); a row whose source is not
  in the tree gets a one-line placeholder source that says so.

A log that croqq cannot tune (``history``, or a resumable one whose dtype, size or seed croqq lacks, or
with no kernel of croqq's family to resume from) is kept whole as read-only history in
``tuning/<gpu>/<dsl>/imported/<name>.json``.

Idempotent: rows whose file, line and content hash are stored already are skipped, so importing the same
tree again adds nothing and a log that grew adds only its new rows, as iterations after the stored ones.
A shape croqq holds records of that are not from this log is refused (a problem), and nothing of that
log is written. Never reads the tree except through the importer's model and the sources it names.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from croqq.domain import source as src
from croqq.domain.decide import BASELINE, DISCARD, KEEP
from croqq.domain.knobs import check_knobs
from croqq.domain.manifest import Manifest
from croqq.domain.records import Idea, Measurement, MeasureResult
from croqq.domain.schedule import ScheduledShape, build_schedule, region_of
from croqq.errors import ConfigError, CroqqError
from croqq.store import paths
from croqq.store.gitrepo import GitRepo
from croqq.store.importer.model import Problem, Row, SourceLog
from croqq.store.importer.sources import SourceReader, TreeSource
from croqq.store.load import load_attempts, load_checkpoint, load_ideas, load_rounds
from croqq.store.schema import (
    AttemptRecord,
    Checkpoint,
    IdeaEntry,
    Imported,
    ImportedLog,
    RoundRecord,
    StoreRequest,
    state_entry,
)
from croqq.store.writer import ResultsWriter

MODE = "from_current_best"
PROPOSER = "imported"
_TAG = re.compile(r"[^a-z0-9_-]+")


@dataclass
class Written:
    """What one log became: ``imported_as`` as stored (a resumable log with nothing to resume from is
    kept as history), the counts of records written (or, with dry_run, that would be), the commit."""

    source: str
    key: str | None
    imported_as: str
    iterations: int = 0
    attempts: int = 0
    ideas: int = 0
    history_rows: int = 0  # rows kept as read-only history
    best_tflops: float | None = None  # the stored best (a resumable log): its TFLOPS and id as written
    best_id: str | None = None
    history: str | None = None  # the repo path of the history file
    commit: str | None = None
    why: str = ""
    problems: list[Problem] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "imported_as": self.imported_as,
            "iterations": self.iterations,
            "attempts": self.attempts,
            "ideas": self.ideas,
            "history_rows": self.history_rows,
            "best_tflops": self.best_tflops,
            "best_id": self.best_id,
            "history": self.history,
            "commit": self.commit,
            "why": self.why,
            "store_problems": [p.model_dump() for p in self.problems],
        }


def row_hash(row: Row) -> str:
    """The identity of a row's content (not its line number)."""
    body = row.model_dump(exclude={"line"})
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _tag(row: Row) -> str:
    stem = row.kernel.rsplit("/", 1)[-1].rsplit(".", 1)[0].lower()
    tag = _TAG.sub("-", stem).strip("-_")[:40].strip("-_")
    return tag or "imported"


def _summary(row: Row) -> str:
    text = " ".join((row.idea or row.kernel or f"imported {row.original_id}").split())
    return text[:300]


def _placeholder(row: Row) -> str:
    what = row.kernel or f"row {row.original_id}"
    return f"// croqq import: the source of {what} is not in the imported tree\n"


def _storable(row: Row, problems: list[Problem]) -> bool:
    """A row becomes a record when it failed or has a TFLOPS croqq can hold (finite, not negative)."""
    if row.failure is not None:
        return True
    if row.tflops is None:
        return False
    if not math.isfinite(row.tflops) or row.tflops < 0:
        problems.append(
            Problem(line=row.line, reason=f"TFLOPS {row.tflops} is not a measurement; not stored")
        )
        return False
    return True


def _original_id(rounds: list[RoundRecord], iteration: int) -> str | None:
    """The id as written of a stored imported round (None for croqq's own)."""
    found = next((r for r in rounds if r.iteration == iteration), None)
    return found.imported.original_id if found and found.imported else None


def _history_name(source: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", source.replace("/", "__"))[:200]


class _Shape:
    """The plan of one resumable log: requests, in order, after what the repo already holds."""

    def __init__(self, importer: Importer, log: SourceLog, key: str, ckpt: Checkpoint | None) -> None:
        self.imp, self.log, self.key = importer, log, key
        manifest, dtype = importer.manifest, log.key.dtype
        assert dtype is not None and log.key.m and log.key.n and log.key.k
        self.dtype, self.m, self.n, self.k = dtype, log.key.m, log.key.n, log.key.k
        spec = manifest.dsl(importer.dsl)
        self.ext, self.knob_names = spec.ext, list(spec.knobs)
        self.family = manifest.dtypes[dtype].family
        self.seed = dict(spec.kernels[dtype].reference)
        sched = importer.scheduled(dtype).get(key)
        self.scenarios = sched.scenarios if sched else ["imported"]
        self.region = region_of(manifest, self.m, self.n, self.k)
        self.ckpt = ckpt or self._empty()
        self.requests: list[StoreRequest] = []
        self.best_id: str | None = None  # the original id of a best this plan stores

    def _empty(self) -> Checkpoint:
        return Checkpoint(
            key=self.key,
            dtype=self.dtype,
            m=self.m,
            n=self.n,
            k=self.k,
            mode=MODE,
            max_iter=1,
            current_iter=-1,
            best_iter=-1,
            best_tflops=0.0,
            baseline_tflops=self.log.reference_tflops or 0.0,
            best_kernel="",
            best_knobs={},
            seed_knobs=self.seed,
            consecutive_discards=0,
            attempts=0,
            status="active",
            scenarios=self.scenarios,
            region=self.region,
            last_updated=_now(),
        )

    def _request(self, kind: str, ckpt: Checkpoint, **record: object) -> StoreRequest:
        step = f"import-{len(self.requests)}"
        return StoreRequest(
            gpu=self.imp.gpu,
            dsl=self.imp.dsl,
            key=self.key,
            family=self.family,
            ext=self.ext,
            epoch=0,
            step_id=step,
            kind=kind,
            checkpoint=ckpt,
            state=state_entry(ckpt),
            **record,
        )

    def _provenance(self, row: Row) -> Imported:
        return Imported(
            file=self.log.source,
            line=row.line,
            original_id=row.original_id,
            decision=row.decision,
            tflops=row.tflops,
            kernel=row.kernel,
            row_hash=row_hash(row),
        )

    def _idea(self, row: Row, tree: TreeSource | None, knobs: dict[str, int]) -> Idea:
        text = tree.text if tree is not None else ""
        digest = src.sha256(src.normalize(text)) if text else row_hash(row)
        return Idea(
            summary=_summary(row) or "imported",
            tag=_tag(row),
            knobs=knobs,
            content_hash=digest,
            proposer=PROPOSER,
            source=text,
        )

    def add_attempt(self, row: Row) -> None:
        ck = self.ckpt
        tree = self.imp.source_of(self.log, row)
        ck = ck.model_copy(update={"attempts": ck.attempts + 1, "last_updated": _now()})
        failure = row.failure or row.decision or "FAIL"
        reason = " ".join(f"{failure}: {row.bottleneck}".split()).strip(": ")[:500] or failure
        attempt = AttemptRecord(
            key=self.key,
            attempt_no=ck.attempts,
            after_iter=ck.current_iter,
            kind="compile" if "COMPILE" in failure.upper() else "run",
            proposer=PROPOSER,
            idea=self._idea(row, tree, {}).model_copy(update={"source": ""}),
            reason=reason,
            log="",
            epoch=0,
            step_id=f"import-{len(self.requests)}",
            timestamp=row.timestamp,
            imported=self._provenance(row),
        )
        self.requests.append(self._request("attempt", ck, attempt=attempt))
        self.ckpt = ck

    def add_iteration(self, row: Row) -> None:
        assert row.tflops is not None
        ck, run = self.ckpt, paths.RunPaths(self.imp.gpu, self.imp.dsl)
        tree = self.imp.source_of(self.log, row)
        usable = tree is not None and tree.compilable and not row.reference
        knobs = src.knob_values(tree.text, self.knob_names) if tree is not None else {}
        idea = self._idea(row, tree, knobs)
        iteration = ck.current_iter + 1
        kernel = run.src(self.key, iteration, idea.tag, self.ext)
        keep = usable and row.tflops > ck.best_tflops
        decision = BASELINE if row.reference else (KEEP if keep else DISCARD)
        update: dict[str, object] = {
            "current_iter": iteration,
            "max_iter": iteration + 1 + self.imp.manifest.mode(MODE).max_iter,
            "consecutive_discards": 0 if keep else ck.consecutive_discards + (decision == DISCARD),
            "last_updated": _now(),
        }
        if keep:
            update |= {
                "best_iter": iteration,
                "best_tflops": row.tflops,
                "best_kernel": kernel,
                "best_knobs": knobs,
                "keeps": ck.keeps + 1,
            }
            self.best_id = row.original_id
        if row.reference:
            update["baseline_tflops"] = max(ck.baseline_tflops, row.tflops)  # the best reference
        after = ck.model_copy(update=update)
        measure = MeasureResult(
            candidate=Measurement(outcome="ok", tflops=row.tflops, detail="imported"),
            vendor_tflops=row.tflops if row.reference else None,
        )
        rnd = RoundRecord(
            key=self.key,
            iteration=iteration,
            decision=decision,
            tflops=row.tflops,
            hw_eff_pct=0.0,
            best_before=ck.best_tflops,
            best_after=after.best_tflops,
            kernel=kernel,
            knobs=knobs,
            idea=idea,
            strategy="refine",
            consecutive_discards=after.consecutive_discards,
            bottleneck=row.bottleneck,
            profile=None,
            measure=measure,
            run_command=row.run_command,
            gpu_uuid="",
            epoch=0,
            step_id=f"import-{len(self.requests)}",
            timestamp=row.timestamp,
            imported=self._provenance(row),
        )
        text = tree.text if tree is not None else _placeholder(row)
        headers = tree.headers if tree is not None else {}
        self.requests.append(self._request("iteration", after, round=rnd, source=text, headers=headers))
        self.ckpt = after


class Importer:
    """Stores the logs of one tree into one run (``gpu``/``dsl``) of a results repo."""

    def __init__(
        self,
        repo: GitRepo,
        root: Path,
        gpu: str,
        dsl: str,
        manifest: Manifest,
        offered: Callable[[str], str | None],
    ) -> None:
        self.repo, self.root, self.gpu, self.dsl, self.manifest = repo, root, gpu, dsl, manifest
        self.writer = ResultsWriter(repo)
        self.reader = SourceReader(root, offered)
        self._sources: dict[str, TreeSource | None] = {}
        self._schedules: dict[str, dict[str, ScheduledShape]] = {}
        self.problems: list[Problem] = []  # of the log being stored

    def scheduled(self, dtype: str) -> dict[str, ScheduledShape]:
        """croqq's schedule of a dtype by key (built once per import)."""
        if dtype not in self._schedules:
            self._schedules[dtype] = {s.key: s for s in build_schedule(self.manifest, dtype)}
        return self._schedules[dtype]

    def source_of(self, log: SourceLog, row: Row) -> TreeSource | None:
        """The row's kernel source from the tree (None when the tree does not hold it or it cannot be
        read: a problem, once per source)."""
        rel = log.sources.get(row.kernel)
        if rel is None:
            return None
        if rel not in self._sources:
            tree = self.reader.read(rel)
            if tree is None:
                self.problems.append(Problem(line=row.line, reason=f"{rel}: cannot be read as a source"))
            else:
                try:
                    src.stored_files("x", "x/a.cu", tree.text, tree.headers)
                except src.SourceError as exc:
                    self.problems.append(Problem(line=row.line, reason=f"{rel}: {exc}"))
                    tree = None
            if tree is not None and tree.unresolved:
                reason = f"{tree.unresolved[0]}; stored as not compilable"
                self.problems.append(Problem(line=row.line, reason=reason))
            elif tree is not None and (foreign := self._foreign(tree.text)):
                tree = replace(tree, foreign=foreign)
                self.problems.append(Problem(line=row.line, reason=f"{rel}: {foreign}"))
            self._sources[rel] = tree
        return self._sources[rel]

    def _foreign(self, text: str) -> str:
        """Why croqq's kernel family of the dsl cannot build ``text`` ('' when it can): a kernel of that
        family defines every knob macro, each with a value of the knob space."""
        spec = self.manifest.dsl(self.dsl)
        try:
            check_knobs(spec, src.knob_values(text, spec.knobs))
        except ConfigError as exc:
            return f"not a kernel of croqq's {self.dsl} family ({exc}); stored, never a best to resume from"
        return ""

    # -- why a log cannot resume --------------------------------------------------------------------

    def _not_tunable(self, log: SourceLog) -> str:
        """Why croqq cannot tune this log's shape ('' when it can)."""
        key, dtype = log.key, log.key.dtype
        if dtype is None or dtype not in self.manifest.dtypes:
            return f"croqq has no dtype {key.dtypes or dtype!r}"
        if dtype not in self.manifest.dsl(self.dsl).kernels:
            return f"dsl {self.dsl} has no kernel for dtype {dtype}"
        c = self.manifest.constraints
        if (key.m or 0) < c.min_m or (key.n or 0) < c.min_n or (key.k or 0) < c.min_k:
            return f"{key.m}x{key.n}x{key.k} is below croqq's minimum {c.min_m}x{c.min_n}x{c.min_k}"
        return ""

    def _usable_row(self, log: SourceLog, row: Row) -> bool:
        if row.reference or row.failure is not None or row.tflops is None:
            return False
        tree = self.source_of(log, row)
        return tree is not None and tree.compilable

    # -- one log --------------------------------------------------------------------------------------

    def store(self, log: SourceLog, dry_run: bool) -> Written:
        self.problems = []
        if log.imported_as == "skipped":
            return Written(log.source, log.key.croqq_key, "skipped", why=log.why)
        key = log.key.croqq_key if log.imported_as == "resumable" else None
        why = self._not_tunable(log) if key is not None else log.why
        if key is not None and not why and not any(self._usable_row(log, r) for r in log.rows):
            why = f"no measured kernel of croqq's {self.dsl} family in the tree to resume from"
        if key is None or why:
            out = self._history(log, why or log.why, dry_run)
        else:
            out = self._resumable(log, key, dry_run)
        out.problems = self.problems + out.problems
        return out

    def _stored_rows(
        self, rounds: list[RoundRecord], attempts: list[AttemptRecord]
    ) -> tuple[set[tuple[str, int, str]], set[str], bool]:
        """What the repo holds for a shape: the (file, line, hash) of imported rows, the files they came
        from, and whether croqq itself stored anything."""
        done: set[tuple[str, int, str]] = set()
        files: set[str] = set()
        own = False
        for prov in [r.imported for r in rounds] + [a.imported for a in attempts]:
            if prov is None:
                own = True
            else:
                done.add((prov.file, prov.line, prov.row_hash))
                files.add(prov.file)
        return done, files, own

    def _resumable(self, log: SourceLog, key: str, dry_run: bool) -> Written:
        out = Written(log.source, key, "resumable")
        ckpt = load_checkpoint(self.repo, self.gpu, self.dsl, key)
        rounds = load_rounds(self.repo, self.gpu, self.dsl, key)
        done, files, own = self._stored_rows(rounds, load_attempts(self.repo, self.gpu, self.dsl, key))
        new = [r for r in log.rows if (log.source, r.line, row_hash(r)) not in done]
        new = [r for r in new if _storable(r, out.problems)]
        if ckpt is not None and new and (own or files - {log.source}):
            whose = "croqq's own iterations" if own else f"rows imported from {sorted(files)[0]}"
            reason = f"{self.gpu}/{self.dsl} already has {key} ({whose}); nothing imported from this log"
            out.imported_as, out.why = "skipped", reason
            out.problems.append(Problem(reason=reason))
            return out
        plan = _Shape(self, log, key, ckpt)
        for row in new:
            if row.failure is not None:
                plan.add_attempt(row)
            else:
                plan.add_iteration(row)
        notes = self._notes(log, key)
        if plan.ckpt.best_iter >= 0:
            out.best_tflops = plan.ckpt.best_tflops
            out.best_id = plan.best_id or _original_id(rounds, plan.ckpt.best_iter)
        out.iterations = sum(r.kind == "iteration" for r in plan.requests)
        out.attempts = len(plan.requests) - out.iterations
        out.ideas = len(notes)
        if dry_run or not (plan.requests or notes):
            return out
        appends = {paths.RunPaths(self.gpu, self.dsl).ideas(key): "".join(notes)} if notes else None
        receipts = self.writer.apply_group(plan.requests, appends)
        out.commit = receipts[-1].commit if receipts else self.repo.head()
        return out

    def _notes(self, log: SourceLog, key: str) -> list[str]:
        """ideas.jsonl lines for the tree's idea notes not stored yet (the shape's dedup set)."""
        known = {e.content_hash for e in load_ideas(self.repo, self.gpu, self.dsl, key)}
        lines: list[str] = []
        for note in log.ideas:
            summary = " ".join(note.summary.split())
            digest = src.sha256(f"{note.source}\n{summary}")
            if not summary or digest in known:
                continue
            known.add(digest)
            entry = IdeaEntry(
                content_hash=digest,
                tag=PROPOSER,
                summary=summary,
                strategy="refine",
                iteration=None,
                decision=note.decision or "IMPORTED",
                tflops=0.0,
            )
            lines.append(entry.model_dump_json() + "\n")
        return lines

    def _history(self, log: SourceLog, why: str, dry_run: bool) -> Written:
        run = paths.RunPaths(self.gpu, self.dsl)
        path = run.imported(_history_name(log.source))
        out = Written(log.source, log.key.croqq_key, "history", why=why, history=path)
        record = ImportedLog(
            source=log.source,
            key=log.key.raw,
            croqq_key=log.key.croqq_key,
            model=log.model,
            why=why,
            header=log.header,
            reference_tflops=log.reference_tflops,
            checkpoint=log.checkpoint,
            rows=[r.model_dump() for r in log.rows],
            ideas=[i.model_dump() for i in log.ideas],
            problems=[p.model_dump() for p in log.problems],
        )
        text = record.model_dump_json(indent=1) + "\n"
        if self.repo.read(path) == text.encode():
            return out
        out.history_rows, out.ideas = len(log.rows), len(log.ideas)
        if not dry_run:
            out.commit = self.writer.put_files({path: text}, f"import: {log.source} as history ({why})")
        return out


def import_logs(
    repo: GitRepo,
    logs: list[SourceLog],
    src_root: Path,
    gpu: str,
    dsl: str,
    dry_run: bool,
    manifest: Manifest,
    offered: Callable[[str], str | None] = lambda name: None,
) -> list[Written]:
    """Store every log (one commit each; none with ``dry_run``); returns what each became.
    ``offered``: a header of croqq's include folders by name, None when it has none (the tree's other
    headers are inlined)."""
    if dsl not in manifest.dsls:
        raise ConfigError(f"unknown dsl {dsl!r}; the manifest has {', '.join(manifest.dsls)}")
    importer = Importer(repo, src_root, gpu, dsl, manifest, offered)
    out = []
    for log in logs:
        try:
            out.append(importer.store(log, dry_run))
        except (CroqqError, ValueError) as exc:  # one log's bad data never stops the others
            reason = f"not stored: {' '.join(str(exc).split())[:300]}"
            out.append(
                Written(
                    log.source, log.key.croqq_key, "skipped", why=reason, problems=[Problem(reason=reason)]
                )
            )
    return out
