"""``croqq clean``: reset shape state in the results repo, in ONE commit.

- ``invalid_only``: reset exactly the shapes that :func:`croqq.store.validate.validate_tip` names
  (a problem's ``shape``); problems that belong to no shape (an unreadable state.json, a registry
  file) are returned as ``unresolved`` and left alone.
- otherwise: reset every shape that is not done-and-complete (``status == done`` and
  ``current_iter >= max_iter`` in its checkpoint): "all active state". Complete shapes are kept.

Resetting a shape removes its files (``RunPaths.shape_files``) and its state.json entry; resetting all
active state also removes the run's submissions.jsonl (nothing submitted is pending any more, so a Redis
that forgets does not bring the shapes back). Nothing else changes: the best-kernel registry and
compaction-summary.md are left as they are (the summary is refreshed by the writer's next summary pass).
The caller must be the writer (hold its lease).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from croqq.domain.schedule import is_complete
from croqq.errors import InvalidRecordError
from croqq.store import paths, render
from croqq.store.gitrepo import GitRepo
from croqq.store.load import list_runs, load_checkpoint, load_state
from croqq.store.render import TRAILER_RESET
from croqq.store.schema import state_entry
from croqq.store.validate import Problem, ShapeRef, validate_tip

log = logging.getLogger(__name__)

MESSAGE_KEYS = 10


@dataclass(frozen=True)
class CleanReport:
    """What clean did: the commit (None when nothing needed a reset) and the shapes it reset."""

    commit: str | None
    reset: list[ShapeRef]
    unresolved: list[Problem] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return [key for _, _, key in self.reset]


def _run_keys(repo: GitRepo, run: paths.RunPaths) -> set[str]:
    """Every key that has any state in a run: its state.json entries and its folders under shapes/."""
    keys = set(repo.list_dir(run.shapes_dir))
    try:
        state = load_state(repo, run.gpu, run.dsl)
    except InvalidRecordError:
        state = None
    return keys | set(state.shapes if state else ())


def _is_kept(repo: GitRepo, run: paths.RunPaths, key: str) -> bool:
    try:
        ckpt = load_checkpoint(repo, run.gpu, run.dsl, key)
    except InvalidRecordError:
        return False
    return ckpt is not None and is_complete(ckpt.status, ckpt.current_iter, ckpt.max_iter)


def active_shapes(repo: GitRepo, dsl: str | None) -> list[ShapeRef]:
    """Every shape of the selected runs that is not done-and-complete."""
    found = []
    for gpu, run_dsl in list_runs(repo):
        if dsl not in (None, "all") and run_dsl != dsl:
            continue
        run = paths.RunPaths(gpu, run_dsl)
        found += [(gpu, run_dsl, key) for key in sorted(_run_keys(repo, run)) if not _is_kept(repo, run, key)]
    return found


def _state_without(repo: GitRepo, run: paths.RunPaths, drop: set[str], rebuild: bool) -> bytes | None:
    """state.json without the ``drop`` keys; None to leave it as it is. An unreadable state.json is
    rebuilt from the kept checkpoints when ``rebuild`` (full clean), else left alone."""
    try:
        state = load_state(repo, run.gpu, run.dsl)
    except InvalidRecordError as exc:
        if not rebuild:
            return None
        log.warning("rebuilding state.json from the kept checkpoints: %s", exc)
        kept = [k for k in _run_keys(repo, run) - drop if _is_kept(repo, run, k)]
        ckpts = {k: load_checkpoint(repo, run.gpu, run.dsl, k) for k in kept}
        entries = {k: render.state_line(k, state_entry(c)) for k, c in ckpts.items() if c is not None}
        return render.state_text(run.gpu, run.dsl, entries).encode()
    if state is None or not drop & set(state.shapes):
        return None
    entries = {k: render.state_line(k, e) for k, e in state.shapes.items() if k not in drop}
    return render.state_text(run.gpu, run.dsl, entries).encode()


def _reset_changes(repo: GitRepo, targets: list[ShapeRef], rebuild: bool) -> dict[str, bytes | None]:
    changes: dict[str, bytes | None] = {}
    runs: dict[tuple[str, str], set[str]] = {}
    for gpu, dsl, key in targets:
        runs.setdefault((gpu, dsl), set()).add(key)
        changes.update({p: None for p in paths.RunPaths(gpu, dsl).shape_files(key) if repo.exists(p)})
    for (gpu, dsl), keys in runs.items():
        run = paths.RunPaths(gpu, dsl)
        state = _state_without(repo, run, keys, rebuild)
        if state is not None:
            changes[run.state_json] = state
        if rebuild and repo.exists(run.submissions):  # all active state goes: no submission is pending
            changes[run.submissions] = None
    return changes


def _message(label: str, targets: list[ShapeRef]) -> str:
    keys = list(dict.fromkeys(key for _, _, key in targets))
    shown = ", ".join(keys[:MESSAGE_KEYS]) + (
        f", ... (+{len(keys) - MESSAGE_KEYS} more)" if len(keys) > MESSAGE_KEYS else ""
    )
    body = "\n".join(f"{TRAILER_RESET}: {gpu}/{dsl}/{key}" for gpu, dsl, key in targets)
    return f"clean: reset {len(targets)} {label} shape(s): {shown}\n\n{body}\n"


def clean(repo: GitRepo, dsl: str | None, invalid_only: bool) -> CleanReport:
    """Reset the invalid shapes (``invalid_only``) or every not-complete shape, in one commit."""
    unresolved: list[Problem] = []
    if invalid_only:
        problems = validate_tip(repo, dsl)
        targets = sorted({p.shape for p in problems if p.shape is not None})
        unresolved = [p for p in problems if p.shape is None]
    else:
        targets = active_shapes(repo, dsl)
    if not targets:
        return CleanReport(commit=None, reset=[], unresolved=unresolved)
    label = "invalid" if invalid_only else "active"
    commit = repo.commit(_reset_changes(repo, targets, rebuild=not invalid_only), _message(label, targets))
    log.info("clean reset %d %s shape(s) in %s", len(targets), label, commit[:12])
    return CleanReport(commit=commit, reset=targets, unresolved=unresolved)
