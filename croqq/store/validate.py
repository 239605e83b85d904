"""``croqq validate``: check the results repo against the schemas and its own invariants.

What is validated is the branch tip (what is committed), not the working tree: the tip is the durable
record that a cold start rebuilds from and that is pushed; the working tree is a convenience copy
(see ``croqq.store.gitrepo``) and may lag it by design.

Per run (``tuning/<gpu>/<dsl>``): state.json, every checkpoint, results.tsv, rounds.raw.jsonl, rounds.md,
ideas.jsonl and attempts.jsonl parse with a known schema version; per shape the iteration ids agree
across results.tsv, rounds.raw.jsonl and rounds.md and run 000, 001, ... with no gap or duplicate;
``current_iter`` is the last one; ``best_iter`` is the last KEEP (else the baseline) and ``best_tflops``
the last round's ``best_after``; state.json's entry agrees with the checkpoint; every state entry has a
checkpoint and vice versa; attempt records carry no iteration id; every path inside a record stays in
the repo and the best kernel exists; no source ``#include`` is absolute or escapes the repo (resolved
from the including file's folder) and every quoted one names a file of the repo (a stored kernel
compiles from the repo alone); a complete shape has its best-kernel registry file; the run's folder holds
nothing else (a results repo of an older layout is named, not misread) but imported logs kept as
history (``imported/<name>.json``, which must parse). Outside runs:
the registry files under ``kernels/<family>_<dtype>/`` are named for a key of that dtype and include
nothing outside the repo.

Each finding is a :class:`Problem` ``<path>: <reason>``; problems that belong to one shape name it
(``shape``), which is what ``croqq clean --invalid-only`` resets.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from croqq.domain.source import HEADERS_DIR
from croqq.errors import ConfigError, InvalidRecordError
from croqq.store import paths
from croqq.store.gitrepo import GitRepo
from croqq.store.load import list_runs, load_submissions, parse_json, parse_jsonl
from croqq.store.render import parse_tsv
from croqq.store.schema import (
    AttemptRecord,
    Checkpoint,
    IdeaEntry,
    ImportedLog,
    ResultsRow,
    RoundRecord,
    SiblingRecord,
    StateEntry,
    StateFile,
    sibling_problem,
)

log = logging.getLogger(__name__)

ShapeRef = tuple[str, str, str]  # (gpu, dsl, key)
T = TypeVar("T")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]*)[>"]', re.MULTILINE)
_MD_ITER = re.compile(r"^## iter(\d+)\b", re.MULTILINE)
_KEY = re.compile(r"^([a-z0-9]+)_\d+x\d+x\d+$")
FOREIGN_HINT = "a shape's files live in shapes/<key>/; an older layout is not supported, nor migrated"


@dataclass(frozen=True)
class Problem:
    """One finding: the repo path it is about and why it is wrong."""

    path: str
    reason: str
    shape: ShapeRef | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def include_problems(path: str, text: str, exists: Callable[[str], bool] | None = None) -> list[str]:
    """Reasons why the ``#include`` lines of the source at ``path`` point outside the repo, or (with
    ``exists``) why a quoted include does not resolve to a file of the repo: the source must compile from
    the repo alone."""
    reasons = []
    for match in _INCLUDE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        target = match.group(2).strip()
        close = ">" if match.group(1) == "<" else '"'
        shown = f"{match.group(1)}{target}{close}"
        if target.startswith("/") or "\\" in target or re.match(r"^[A-Za-z]:", target):
            reasons.append(f"line {line}: #include {shown} is absolute")
        elif not paths.is_inside_repo(
            resolved := posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        ):
            reasons.append(f"line {line}: #include {shown} escapes the repo")
        elif exists is not None and match.group(1) == '"' and not exists(resolved):
            reasons.append(f"line {line}: #include {shown} is not a file of the repo")
    return reasons


def _sequence_problem(ids: Sequence[int]) -> str | None:
    """Why ``ids`` is not 0, 1, 2, ... (None when it is)."""
    seen: set[int] = set()
    for position, value in enumerate(ids):
        if value in seen:
            return f"iteration {value:03d} appears twice"
        seen.add(value)
        if value != position:
            return f"iteration {position:03d} is missing (found {value:03d} in its place)"
    return None


def _close(a: float, b: float, tol: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=tol)


class _RunCheck:
    """The checks of one run; ``problems`` collects the findings."""

    def __init__(self, repo: GitRepo, gpu: str, dsl: str) -> None:
        self.repo = repo
        self.gpu, self.dsl = gpu, dsl
        self.run = paths.RunPaths(gpu, dsl)
        self.problems: list[Problem] = []

    def add(self, path: str, reason: str, key: str | None = None) -> None:
        self.problems.append(Problem(path, reason, (self.gpu, self.dsl, key) if key else None))

    def _parse(self, key: str | None, fn: Callable[..., T], *args: Any) -> T | None:
        """Run a parser; an InvalidRecordError becomes a problem (its message starts with the path)."""
        try:
            return fn(*args)
        except InvalidRecordError as exc:
            path, _, reason = str(exc).partition(": ")
            self.add(path, reason, key)
            return None

    def state(self) -> StateFile | None:
        path = self.run.state_json
        data = self.repo.read(path)
        if data is None:
            return None
        state = self._parse(None, parse_json, data, StateFile, path)
        if state is not None and (state.gpu, state.dsl) != (self.gpu, self.dsl):
            self.add(path, f"names run {state.gpu}/{state.dsl}, but lives under {self.gpu}/{self.dsl}")
        return state

    def checkpoints(self) -> tuple[dict[str, Checkpoint], set[str]]:
        """Valid checkpoints by key, and the keys of every checkpoint file (valid or not)."""
        found: dict[str, Checkpoint] = {}
        files: set[str] = set()
        for key in self.repo.list_dir(self.run.shapes_dir):
            path = self.run.checkpoint(key)
            data = self.repo.read(path)
            if data is None:
                continue
            files.add(key)
            ckpt = self._parse(key, parse_json, data, Checkpoint, path)
            if ckpt is not None and ckpt.key != key:
                self.add(path, f"holds the checkpoint of {ckpt.key!r}", key)
            elif ckpt is not None:
                found[key] = ckpt
        return found, files

    def shape_dirs(self) -> dict[str, str]:
        """Key -> its folder under shapes/ (a file there is a problem)."""
        found: dict[str, str] = {}
        for name in self.repo.list_dir(self.run.shapes_dir):
            path = self.run.shape_dir(name)
            if self.repo.is_dir(path):
                found[name] = path
            else:
                self.add(path, "not a shape's folder (shapes/<key>/)")
        return found

    def foreign(self) -> None:
        """Name what the run's folder holds besides the layout's files (an older layout's folders, say:
        nothing reads them, so they must not pass for results)."""
        run = self.run
        known = {
            run.state_json,
            run.submissions,
            run.summary_md,
            run.shapes_dir,
            run.imported_dir,
            f"{run.root}/{HEADERS_DIR}",
        }
        for path in (f"{run.root}/{name}" for name in self.repo.list_dir(run.root)):
            if path not in known:
                self.add(path, f"not part of the results layout ({FOREIGN_HINT})")

    def imported(self) -> None:
        """Imported logs kept as read-only history: each one JSON file that parses."""
        for name in self.repo.list_dir(self.run.imported_dir):
            path = f"{self.run.imported_dir}/{name}"
            if not name.endswith(".json") or self.repo.is_dir(path):
                self.add(path, "not an imported log (imported/<name>.json)")
                continue
            self._parse(None, parse_json, self.repo.read(path) or b"", ImportedLog, path)

    def check(self) -> list[Problem]:
        state = self.state()
        entries = state.shapes if state else {}
        ckpts, ckpt_files = self.checkpoints()
        dirs = self.shape_dirs()
        self.foreign()
        self.imported()
        for key in sorted(set(entries) | ckpt_files | set(dirs)):
            if entries.get(key) is None and key not in ckpt_files:
                self.add(dirs[key], "files of a shape with neither checkpoint nor state entry", key)
                continue
            self.shape(key, entries.get(key), ckpts.get(key), key in ckpt_files, state is not None)
        self._parse(None, load_submissions, self.repo, self.run.gpu, self.run.dsl)
        return self.problems

    def shape(
        self, key: str, entry: StateEntry | None, ckpt: Checkpoint | None, has_file: bool, has_state: bool
    ) -> None:
        if entry is not None and not has_file:
            self.add(self.run.state_json, f"shapes.{key}: state entry without checkpoint", key)
        if has_file and entry is None and has_state:
            self.add(self.run.checkpoint(key), "checkpoint without a state.json entry", key)
        if ckpt is None:
            return
        if entry is not None:
            self.entry_agrees(key, entry, ckpt)
        _ShapeCheck(self, key, ckpt).check()

    def entry_agrees(self, key: str, entry: StateEntry, ckpt: Checkpoint) -> None:
        for name in ("status", "best_iter", "best_kernel", "mode"):
            mine, theirs = getattr(entry, name), getattr(ckpt, name)
            if mine != theirs:
                self.add(
                    self.run.state_json,
                    f"shapes.{key}.{name} is {mine!r}, the checkpoint says {theirs!r}",
                    key,
                )
        if not _close(entry.best_tflops, ckpt.best_tflops, 1e-6):
            self.add(self.run.state_json, f"shapes.{key}.best_tflops differs from the checkpoint's", key)


class _ShapeCheck:
    """The checks of one shape that has a valid checkpoint."""

    def __init__(self, run: _RunCheck, key: str, ckpt: Checkpoint) -> None:
        self.r, self.key, self.ckpt = run, key, ckpt
        self.run = run.run

    def add(self, path: str, reason: str) -> None:
        self.r.add(path, reason, self.key)

    def _read(self, path: str) -> bytes | None:
        return self.r.repo.read(path)

    def rows(self) -> list[ResultsRow] | None:
        path = self.run.results_tsv(self.key)
        data = self._read(path)
        if data is None:
            return []
        return self.r._parse(self.key, parse_tsv, data.decode("utf-8", errors="replace"), path)

    def rounds(self) -> list[RoundRecord] | None:
        path = self.run.rounds_raw(self.key)
        data = self._read(path)
        if data is None:
            return []
        return self.r._parse(self.key, parse_jsonl, data, RoundRecord, path)

    def md_ids(self) -> list[int]:
        data = self._read(self.run.rounds_md(self.key))
        return [int(m) for m in _MD_ITER.findall(data.decode("utf-8", errors="replace"))] if data else []

    def check(self) -> None:
        rows, rounds = self.rows(), self.rounds()
        self.ids_agree(rows, rounds, self.md_ids())
        if rows is not None and rounds is not None and len(rows) == len(rounds):
            self.best_agrees(rows, rounds)
            self.rows_agree(rows, rounds)
        self.record_paths(rows or [], rounds or [])
        self.ideas()
        self.attempts()
        self.sources()
        self.registry()

    def ids_agree(
        self, rows: list[ResultsRow] | None, rounds: list[RoundRecord] | None, md: list[int]
    ) -> None:
        files = {
            self.run.results_tsv(self.key): [r.iter for r in rows] if rows is not None else None,
            self.run.rounds_raw(self.key): [r.iteration for r in rounds] if rounds is not None else None,
            self.run.rounds_md(self.key): md,
        }
        expected = list(range(self.ckpt.current_iter + 1))
        for path, ids in files.items():
            if ids is None:
                continue
            reason = _sequence_problem(ids)
            if reason is None and ids != expected:
                last = self.ckpt.current_iter
                reason = f"holds {len(ids)} iteration(s), the checkpoint's current_iter is {last}"
            if reason is not None:
                self.add(path, reason)

    def best_agrees(self, rows: list[ResultsRow], rounds: list[RoundRecord]) -> None:
        path = self.run.checkpoint(self.key)
        keeps = [r.iter for r in rows if r.decision == "KEEP"]
        expected = keeps[-1] if keeps else (0 if rows else -1)
        if self.ckpt.best_iter != expected:
            self.add(path, f"best_iter is {self.ckpt.best_iter}, the rows say {expected}")
        if rounds and not _close(self.ckpt.best_tflops, rounds[-1].best_after, 1e-6):
            self.add(
                path,
                f"best_tflops {self.ckpt.best_tflops} != last round's best_after {rounds[-1].best_after}",
            )

    def rows_agree(self, rows: list[ResultsRow], rounds: list[RoundRecord]) -> None:
        for row, rnd in zip(rows, rounds, strict=True):
            if row.decision != rnd.decision or not _close(row.tflops, rnd.tflops, 0.0011):
                self.add(
                    self.run.results_tsv(self.key), f"iter {row.iter:03d} disagrees with rounds.raw.jsonl"
                )
                return

    def check_path(self, where: str, what: str, path: str, must_exist: bool) -> None:
        if not paths.is_inside_repo(path):
            self.add(where, f"{what} {path!r} is outside the repo")
        elif must_exist and not self.r.repo.exists(posixpath.normpath(path)):
            self.add(where, f"{what} {path!r} does not exist")

    def record_paths(self, rows: list[ResultsRow], rounds: list[RoundRecord]) -> None:
        if self.ckpt.best_iter >= 0 or self.ckpt.best_kernel:
            self.check_path(self.run.checkpoint(self.key), "best_kernel", self.ckpt.best_kernel, True)
        for row in rows:
            self.check_path(self.run.results_tsv(self.key), f"iter {row.iter:03d} kernel", row.kernel, True)
        for rnd in rounds:
            where = self.run.rounds_raw(self.key)
            self.check_path(where, f"iter {rnd.iteration:03d} kernel", rnd.kernel, False)
            self.siblings(where, f"iter {rnd.iteration:03d}", rnd.candidate, rnd.siblings)

    def siblings(self, where: str, label: str, candidate: int, siblings: list[SiblingRecord]) -> None:
        """An iteration's (or attempt's) other candidates fit together; a stored sibling source exists."""
        problem = sibling_problem(candidate, siblings)
        if problem:
            self.add(where, f"{label}: {problem}")
        for sib in siblings:
            if sib.kernel:
                self.check_path(where, f"{label} sibling {sib.candidate} kernel", sib.kernel, True)

    def ideas(self) -> None:
        path = self.run.ideas(self.key)
        data = self._read(path)
        if data is not None:
            self.r._parse(self.key, parse_jsonl, data, IdeaEntry, path)

    def attempts(self) -> None:
        path = self.run.attempts(self.key)
        data = self._read(path)
        if data is None:
            return
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                raw = None
            if isinstance(raw, dict) and "iteration" in raw:
                self.add(path, f"line {number}: an attempt record has an iteration id ({raw['iteration']!r})")
                return
        records = self.r._parse(self.key, parse_jsonl, data, AttemptRecord, path)
        if records is not None and [a.attempt_no for a in records] != list(range(1, len(records) + 1)):
            self.add(path, "attempt numbers are not 1, 2, 3, ...")
        for att in records or []:
            self.siblings(path, f"attempt {att.attempt_no}", att.candidate, att.siblings)

    def sources(self) -> None:
        folder = self.run.srcs_dir(self.key)
        for name in self.r.repo.list_dir(folder):
            src = f"{folder}/{name}"
            text = (self._read(src) or b"").decode("utf-8", errors="replace")
            for reason in include_problems(src, text, self.r.repo.exists):
                self.add(src, reason)

    def registry(self) -> None:
        ck = self.ckpt
        if not (ck.status == "done" and ck.current_iter >= ck.max_iter and ck.best_kernel):
            return
        ext = posixpath.splitext(ck.best_kernel)[1]
        names = [d for d in self.r.repo.list_dir(paths.KERNELS) if d.endswith(f"_{ck.dtype}")]
        if not any(self.r.repo.exists(f"{paths.KERNELS}/{d}/{self.key}_best{ext}") for d in names):
            wanted = f"kernels/<family>_{ck.dtype}/{self.key}_best{ext}"
            self.add(self.run.checkpoint(self.key), f"complete, but {wanted} is missing")


def check_registry(repo: GitRepo) -> list[Problem]:
    """The best-kernel registry: file names and includes."""
    problems = []
    for folder in repo.list_dir(paths.KERNELS):
        base = f"{paths.KERNELS}/{folder}"
        if "_" not in folder or not repo.is_dir(base):
            continue
        dtype = folder.rsplit("_", 1)[1]
        for name in repo.list_dir(base):
            if "_best." not in name:
                continue
            path = f"{base}/{name}"
            match = _KEY.match(name.split("_best.", 1)[0])
            if match is None or match.group(1) != dtype:
                problems.append(Problem(path, f"not <{dtype}_MxNxK>_best.<ext> for folder {folder}"))
            text = (repo.read(path) or b"").decode("utf-8", errors="replace")
            problems += [Problem(path, reason) for reason in include_problems(path, text, repo.exists)]
    return problems


def validate_tip(repo: GitRepo, dsl: str | None) -> list[Problem]:
    """Every problem at the branch tip, for one dsl (None or ``all``: every dsl)."""
    problems: list[Problem] = []
    for gpu, run_dsl in list_runs(repo):
        if dsl in (None, "all") or run_dsl == dsl:
            problems += _RunCheck(repo, gpu, run_dsl).check()
    problems += check_registry(repo)
    log.info("validated %s: %d problem(s)", repo.path, len(problems))
    return problems


def validate_repo(repo_path: Path, dsl: str | None, branch: str = "main") -> list[Problem]:
    """Validate the committed results (the branch tip) of the repo at ``repo_path``."""
    if not repo_path.exists():
        raise ConfigError(f"{repo_path}: no results repo here")
    repo = GitRepo.open_existing(repo_path, branch).freeze()  # one tip, even while the writer commits
    try:
        return validate_tip(repo, dsl)
    finally:
        repo.close()
