"""The results repo read into the small model the report draws: one :class:`ShapeData` per stored shape.

Read from the branch tip only (``GitRepo.open_existing``: works on a clone, no cluster, never writes):
``state.json`` lists a run's shapes, each shape's checkpoint gives its size and ``max_iter``,
``rounds.raw.jsonl`` its iterations (TFLOPS, decision, the baseline's vendor TFLOPS, each GPU step's
interval) and ``attempts.jsonl`` its attempts by kind; ``submissions.jsonl`` names the shapes submitted
but not stored yet (pending); ``imported/`` the logs `croqq import` kept as read-only history.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from croqq.errors import ConfigError, InvalidRecordError
from croqq.store import load, paths
from croqq.store.gitrepo import GitRepo
from croqq.store.schema import ImportedLog, RoundRecord

FAIL_PREFIX = "FAIL_"


@dataclass(frozen=True)
class Point:
    """One measured iteration."""

    iteration: int
    tflops: float
    decision: str
    best_after: float


@dataclass(frozen=True)
class Busy:
    """One GPU step's interval (Redis clock, Unix seconds)."""

    gpu_uuid: str
    start: float
    seconds: float


@dataclass
class ShapeData:
    gpu: str
    dsl: str
    key: str
    dtype: str
    m: int
    n: int
    k: int
    status: str
    current_iter: int
    max_iter: int | None
    baseline_tflops: float
    best_tflops: float
    vendor_tflops: float | None = None
    points: list[Point] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)  # attempt kind -> count
    busy: list[Busy] = field(default_factory=list)
    imported: int = 0  # iterations brought in by `croqq import`
    siblings: int = 0  # other candidates measured beside the iterations' chosen ones (--candidates N)

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    @property
    def speedup(self) -> float | None:
        return self.best_tflops / self.baseline_tflops if self.baseline_tflops > 0 else None

    @property
    def vs_vendor(self) -> float | None:
        return self.best_tflops / self.vendor_tflops if self.vendor_tflops else None


@dataclass
class RunData:
    """One (gpu type, dsl) of the repo."""

    gpu: str
    dsl: str
    shapes: dict[str, ShapeData] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)  # submitted, nothing stored yet: key -> dtype
    imported: list[ImportedLog] = field(default_factory=list)  # logs kept as read-only history

    @property
    def label(self) -> str:
        return f"{self.gpu} / {self.dsl}"


@dataclass
class RepoData:
    path: Path
    commit: str
    runs: list[RunData]

    def shapes(self) -> list[ShapeData]:
        return [s for run in self.runs for s in run.shapes.values()]

    def iterations(self) -> int:
        return sum(len(s.points) for s in self.shapes())


@dataclass(frozen=True)
class Selection:
    """What to report on: filters of the runs and dtypes, and the shapes to draw one by one."""

    gpu: str | None = None
    dsl: str | None = None
    dtype: str | None = None
    keys: tuple[str, ...] = ()


def open_repo(path: Path, branch: str) -> GitRepo:
    """The results repo at ``path`` for reading; ConfigError unless it is a git repo with tuning/."""
    if not path.is_dir():
        raise ConfigError(f"{path}: not a results repo (no such folder; set CROQQ_RESULTS_REPO or --repo)")
    try:
        repo = GitRepo.open_existing(path, branch)
    except ConfigError:
        raise ConfigError(f"{path}: not a results repo (not a git repository)") from None
    if repo.head() is None:
        raise ConfigError(f"{path}: not a results repo (no branch {branch!r}; CROQQ_RESULTS_BRANCH)")
    if not repo.is_dir(paths.TUNING):
        raise ConfigError(f"{path}: not a results repo (no {paths.TUNING}/ folder on branch {branch})")
    return repo


def _close(name: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def select_runs(repo: GitRepo, sel: Selection) -> list[tuple[str, str, list[str]]]:
    """The (gpu, dsl, keys in state.json) the selection covers, read from state.json only (cheap), so
    that a wrong --gpu, --dsl or --key is refused before the slow read."""
    runs = load.list_runs(repo)
    for name, value, have in (
        ("--gpu", sel.gpu, sorted({g for g, _ in runs})),
        ("--dsl", sel.dsl, sorted({d for _, d in runs})),
    ):
        if value is not None and value not in have:
            raise ConfigError(f"{name} {value!r}: not in this repo (it has {', '.join(have) or 'none'})")
    chosen = [(g, d) for g, d in runs if sel.gpu in (None, g) and sel.dsl in (None, d)]
    out: list[tuple[str, str, list[str]]] = []
    for gpu, dsl in chosen:
        state = load.load_state(repo, gpu, dsl)
        keys = sorted(state.shapes) if state is not None else []
        out.append((gpu, dsl, [k for k in keys if sel.dtype in (None, k.split("_", 1)[0])]))
    stored = sorted({k for _, _, keys in out for k in keys})
    for key in sel.keys:
        if key not in stored:
            raise ConfigError(f"--key {key!r}: no such shape in the repo{_close(key, stored)}")
    return out


# The fields of ShapeData its checkpoint gives as they are.
_FROM_CHECKPOINT = {
    "key",
    "dtype",
    "m",
    "n",
    "k",
    "status",
    "current_iter",
    "max_iter",
    "baseline_tflops",
    "best_tflops",
}


def _shape(repo: GitRepo, gpu: str, dsl: str, key: str) -> ShapeData | None:
    ckpt = load.load_checkpoint(repo, gpu, dsl, key)
    rounds = load.load_rounds(repo, gpu, dsl, key)
    if ckpt is None or not rounds:
        return None
    shape = ShapeData(gpu=gpu, dsl=dsl, **ckpt.model_dump(include=_FROM_CHECKPOINT))
    for rnd in rounds:
        _add_round(shape, rnd)
    for att in load.load_attempts(repo, gpu, dsl, key):
        shape.attempts[att.kind] = shape.attempts.get(att.kind, 0) + 1
    return shape


def _add_round(shape: ShapeData, rnd: RoundRecord) -> None:
    shape.points.append(Point(rnd.iteration, rnd.tflops, rnd.decision, rnd.best_after))
    measure = rnd.measure
    if measure.vendor_tflops and (rnd.iteration == 0 or shape.vendor_tflops is None):
        shape.vendor_tflops = measure.vendor_tflops
    shape.imported += rnd.imported is not None
    shape.siblings += sum(s.measurement is not None for s in rnd.siblings)
    spans = [(measure.gpu_started_at, measure.gpu_busy_s)]
    if rnd.profile is not None:
        spans.append((rnd.profile.gpu_started_at, rnd.profile.gpu_busy_s))
    uuid = rnd.gpu_uuid or measure.gpu_uuid
    shape.busy += [Busy(uuid, start, secs) for start, secs in spans if start is not None and secs is not None]


def _pending(repo: GitRepo, gpu: str, dsl: str, stored: set[str], dtype: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for rec in load.load_submissions(repo, gpu, dsl):
        for entry in rec.shapes:
            if entry.key not in stored and dtype in (None, entry.dtype):
                out[entry.key] = entry.dtype
    return out


def _imported(repo: GitRepo, gpu: str, dsl: str) -> list[ImportedLog]:
    """The run's imported logs kept as history (one that does not parse is left out: validate names it)."""
    folder = paths.RunPaths(gpu, dsl).imported_dir
    out = []
    for name in repo.list_dir(folder):
        try:
            out.append(load.parse_json(repo.read(f"{folder}/{name}") or b"", ImportedLog, name))
        except InvalidRecordError:
            continue
    return out


def read_repo(
    repo: GitRepo,
    runs: list[tuple[str, str, list[str]]],
    sel: Selection,
    tick: Callable[[], None] = lambda: None,
) -> RepoData:
    """Every selected shape with at least one stored iteration (``tick`` once per shape read)."""
    repo.freeze()  # one consistent tip, even while a writer commits
    data = RepoData(path=repo.path, commit=repo.head() or "", runs=[])
    for gpu, dsl, keys in runs:
        run = RunData(gpu, dsl)
        for key in keys:
            shape = _shape(repo, gpu, dsl, key)
            if shape is not None:
                run.shapes[key] = shape
            tick()
        run.pending = _pending(repo, gpu, dsl, set(keys), sel.dtype)
        run.imported = _imported(repo, gpu, dsl)
        data.runs.append(run)
    return data
