"""Writer benchmark: stored iterations per second on a big results repo, against ``git add && git commit``.

    python -m benchmarks.writer_bench <work dir>      # prints one JSON object

Setup. 268 schedule keys. Five "hot" keys are pre-filled to iteration 19 (100 iterations); the other
263 keys to iteration 37 (9,994 more, 10,094 in all, ~25k files). Pre-filling uses the writer's group
commit (the same files, in a few commits), then ``git repack -a -d``. The measured stream is the hot
keys' next iterations (20..59, with their compile-failed attempts), one commit each, on copies of the
same repo (hard links, except the reflogs that git appends to):

- ``writer_iters_per_s`` / ``_no_worktree``: ResultsWriter.apply with / without working-tree sync, on
  the 10k repo; the time includes the batched index flushes; ``writer_close_ms_at_10k``: the close
  after the stream (the last index flush and git's repack), timed apart from the commits;
- ``writer_commit_ms_at_10k`` / ``_at_100``: mean ms per commit of the same stream on the 10k repo and on
  a repo holding only the hot keys' 100 iterations (the keys' own files are the same size in both);
  ``writer_commit_ms_p99``: 99th percentile at 10k;
- ``writer_commit_ms_at_363_all_keys``: the same stream on a repo holding the hot keys' 100 iterations
  plus a baseline for each of the 263 other keys. Its folders and state.json are as wide as at 10k, so
  ``ratio_10k_over_363_all_keys`` isolates the history's depth, while ``ratio_10k_over_100`` also
  counts the per-commit cost of 268-wide folders (5 tree objects of ~12 KB) and an 80 KB state.json;
- ``naive_git_iters_per_s``: the same files written into the working tree, then
  ``git add -A && git commit`` per iteration with the git CLI, on a copy of the 10k repo;
- ``writer_fsync_iter_per_s`` / ``writer_nofsync_iter_per_s``: the writer on the 10k repo (working-tree
  sync on) with ``CROQQ_GIT_FSYNC`` on (the default, so the same run as ``writer_iters_per_s``) and off;
  ``fsync_cost_ratio``: commit time with fsync over without (1.0: durability is free).

Every writer figure except ``writer_nofsync_iter_per_s`` is measured with fsync on, the default.

Each writer figure is the best of ``ROUNDS`` runs on fresh copies (other load on a small shared machine
only ever slows a run down); dirty pages of the copy are synced before a run starts.

Repo size, commit time at depth and killed writers, :func:`compaction`, each figure beside its
``baseline_`` twin measured in the same run with the store of the baseline revision (``--baseline REV``
of ``python -m benchmarks``, default ``HEAD``: the last commit's writer beside the working tree's;
unpacked with ``git archive``, run in a child interpreter; ``baseline_commit`` names it):

- ``sweep_*``: a demo-like sweep written through the real writer (268 keys x 30 iterations, 8 keys in
  flight at a time as on the demo's 8 GPUs, the sample requests with their compile-failed attempts, one
  ``ResultsWriter.apply`` each, then ``close``; no working-tree sync, so ``.git`` holds no index);
  ``sweep_all_*``: the same with all 268 keys in flight (a fleet with a GPU per shape: consecutive
  commits never touch the same key's files, the worst case for git's choice of delta bases, which
  groups files by the last 16 characters of their path). ``sweep_git_bytes`` is ``.git/objects`` after it;
  ``sweep_bytes_per_iter`` that over the iterations, ``sweep_records_bytes_per_iter`` the same without
  candidate sources (srcs/, headers/, kernels/) and raw timing/profile text (perf/), which are
  ``sweep_sources_bytes_per_iter`` and ``sweep_perf_bytes_per_iter`` (each object's size in its pack,
  from ``git cat-file --batch-check``; a folder counts with what it holds; pack headers and indexes count
  as records); ``sweep_iters_per_s`` and ``sweep_commit_ms_mean`` count the commits, ``sweep_close_ms``
  the close after them (its last repack);
- ``compact_commit_ms_at_100`` / ``_10k`` / ``_100k``: mean ms per commit of the measured stream (as
  above, fsync on, no working tree: a 100k repo's index alone is ~20 MB, a cost of the working-tree
  option, not of the commit) on repos with 100, 10,094 and 100,040 iterations of history,
  ``compact_ratio_100k_over_100`` and ``compact_ratio_10k_over_100``; ``compact_commit_cpu_ms_at_*`` and
  ``compact_cpu_ratio_100k_over_100``: the same in CPU time of the writer process (all threads) and its
  git children, which other load on a shared machine disturbs less than wall time. These repos are
  synthesized (see :func:`_synthesize`): the cold keys' files are exactly what the writer would have
  written (its own ``plan_changes`` per request), committed a few keys per commit through
  ``GitRepo.commit``, not one commit per iteration (``CROQQ_BENCH_DEEP_DEPTH``: the cold keys' depth of
  the deepest repo, default 380). ``compact_commit_ms_at_100_loose`` / ``_10k_loose``: the same stream
  with loose objects instead of the one-pack-per-commit sink;
- ``killed_writers_pack_files``: pack files after a writer process was SIGKILLed ``KILLS`` times, each
  after ``COMMITS_PER_KILL`` new STOREs; ``_after_next_close``: after the next writer stored as many and
  closed; ``killed_writers_fsck_ok``: ``git fsck --strict`` passed then.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from croqq.store import paths, render
from croqq.store.gitrepo import GitRepo, blob_id_of
from croqq.store.load import load_state
from croqq.store.render import commit_message
from croqq.store.schema import StoreRequest
from croqq.store.writer import ResultsWriter, StateCache, plan_changes
from tests.samples import sample_requests, schedule_keys

log = logging.getLogger(__name__)

GPU = "sm90_NVIDIA_H200"
DSL = "cuda"
HOT_KEYS = 5
HOT_DEPTH = 20
COLD_DEPTH = 38
MEASURED_DEPTH = 60
NAIVE_COMMITS = 40
GROUP = 2500
SEED = 7
ROUNDS = 3
SWEEP_DEPTH = 30
SWEEP_IN_FLIGHT = 8  # keys tuned at a time, as on the 8 simulated GPUs of `make demo`
DEEP_COLD_DEPTH = int(os.environ.get("CROQQ_BENCH_DEEP_DEPTH", "380"))  # 263 x 380 + 100 = 100,040 iters
SYNTH_KEYS_PER_COMMIT = 8
KILLS = 20
COMMITS_PER_KILL = 5
SRC_ROOT = Path(__file__).resolve().parents[1]
SWEEP_SCRIPT = """
import sys, time
from pathlib import Path
from tests.samples import sample_requests, schedule_keys
from croqq.store.gitrepo import GitRepo
from croqq.store.writer import ResultsWriter
path, depth, seed, in_flight = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[6])
requests = list(sample_requests(sys.argv[4], sys.argv[5], schedule_keys(), depth, seed, in_flight=in_flight))
writer = ResultsWriter(GitRepo(path, sync_worktree=False))
started = time.perf_counter()
for req in requests:
    writer.apply(req)
closing = time.perf_counter()
writer.close()
iterations = sum(r.kind == "iteration" for r in requests)
print(closing - started, time.perf_counter() - closing, iterations, len(requests))
"""
KILL_SCRIPT = """
import sys
from pathlib import Path
from tests.samples import sample_requests, schedule_keys
from croqq.store.gitrepo import GitRepo
from croqq.store.writer import ResultsWriter
path, stores = Path(sys.argv[1]), int(sys.argv[2])
writer = ResultsWriter(GitRepo(path, sync_worktree=False))
for req in sample_requests(sys.argv[3], sys.argv[4], schedule_keys()[:8], 150, 5):
    if not writer.apply(req).duplicate:
        print("stored", flush=True)
        stores -= 1
        if stores == 0:
            break
writer.close()
"""
DEPTH_SCRIPT = """
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("croqq_writer_bench_now", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
print(json.dumps(bench._depth_figures(Path(sys.argv[2]))))
"""


def _streams() -> tuple[list[StoreRequest], list[StoreRequest], list[StoreRequest]]:
    """(hot pre-fill, cold pre-fill, measured) requests."""
    keys = schedule_keys()
    hot = list(sample_requests(GPU, DSL, keys[:HOT_KEYS], MEASURED_DEPTH, SEED))
    cold = list(sample_requests(GPU, DSL, keys[HOT_KEYS:], COLD_DEPTH, SEED + 1))
    prefill = [r for r in hot if r.checkpoint.current_iter < HOT_DEPTH]
    measured = [r for r in hot if r.checkpoint.current_iter >= HOT_DEPTH]
    return prefill, cold, measured


def _baselines(cold: list[StoreRequest]) -> list[StoreRequest]:
    return [r for r in cold if r.round is not None and r.round.iteration == 0]


def _prefill(path: Path, requests: list[StoreRequest]) -> float:
    """Group commits of the pre-fill requests, then a repack (as a repo that gets ``git gc``)."""
    started = time.perf_counter()
    repo = GitRepo(path, sync_worktree=True, index_flush_s=0.0)
    writer = ResultsWriter(repo)
    for start in range(0, len(requests), GROUP):
        writer.apply_group(requests[start : start + GROUP])
    repo.close()
    _git(path, "repack", "-a", "-d", "-q")
    _git(path, "prune-packed")
    return time.perf_counter() - started


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link what is only ever replaced (objects, worktree files: written by rename), copy what is
    appended to in place (reflogs)."""
    if f"{os.sep}.git{os.sep}logs{os.sep}" in src:
        shutil.copy2(src, dst)
    else:
        os.link(src, dst)


def _copy(src: Path, dst: Path, link: bool = True) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy if link else shutil.copy2)
    os.sync()  # the copy's writeback must not land in the timed run
    return dst


def _best_writer(
    src: Path, copy: Path, requests: list[StoreRequest], sync: bool, fsync: bool = True, loose: bool = False
) -> dict[str, float]:
    """The best of ROUNDS runs, each on a fresh copy of ``src``."""
    runs = [_time_writer(_copy(src, copy), requests, sync, fsync, loose) for _ in range(ROUNDS)]
    shutil.rmtree(copy, ignore_errors=True)
    return min(runs, key=lambda r: r["commit_ms_mean"])


class _LooseRepo(GitRepo):
    """The writer with loose objects (libgit2's object database) instead of one pack per commit."""

    def _packable(self) -> bool:
        return False


def _time_writer(
    path: Path, requests: list[StoreRequest], sync: bool, fsync: bool, loose: bool = False
) -> dict[str, float]:
    repo = (_LooseRepo if loose else GitRepo)(path, sync_worktree=sync, fsync=fsync)
    writer = ResultsWriter(repo)
    times = []
    cpu = _cpu_s()
    for req in requests:
        started = time.perf_counter()
        writer.apply(req)
        times.append(time.perf_counter() - started)
    total, cpu = sum(times), _cpu_s() - cpu
    started = time.perf_counter()
    repo.close()
    close_s = time.perf_counter() - started
    iterations = sum(1 for r in requests if r.kind == "iteration")
    times.sort()
    return {
        "iters_per_s": iterations / total,
        "commit_ms_mean": 1e3 * total / len(requests),
        "close_ms": 1e3 * close_s,
        "commit_ms_median": 1e3 * statistics.median(times),
        "commit_ms_p99": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))],
        "commit_cpu_ms_mean": 1e3 * cpu / len(requests),  # every thread's CPU and git's repacks'
    }


def _cpu_s() -> float:
    """CPU seconds of this process (all threads) and of its finished children (git repack)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class _Worktree:
    """A TipReader over a working tree (what a naive writer reads)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, path: str) -> bytes | None:
        full = self.root / path
        return full.read_bytes() if full.is_file() else None

    def blob_id(self, path: str) -> str | None:
        data = self.read(path)
        return blob_id_of(data) if data is not None else None


def _git(path: Path, *args: str) -> None:
    ident = ["-c", "user.name=croqq bench", "-c", "user.email=bench@localhost"]
    subprocess.run(["git", "-C", str(path), *ident, *args], check=True, capture_output=True)


def _time_naive(path: Path, requests: list[StoreRequest]) -> float:
    """Iterations per second of: write the files into the working tree, git add -A, git commit."""
    _git(path, "update-index", "-q", "--refresh")  # the copy changed every inode: warm git's stat cache
    tree, cache = _Worktree(path), StateCache()
    iterations, started = 0, time.perf_counter()
    for req in requests[:NAIVE_COMMITS]:
        changes = plan_changes(req, tree, cache) or {}
        for rel, data in changes.items():
            full = path / rel
            full.parent.mkdir(parents=True, exist_ok=True)
            if data is not None:
                full.write_bytes(data)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", commit_message(req))
        iterations += req.kind == "iteration"
    return iterations / (time.perf_counter() - started)


def _count_files(path: Path) -> int:
    return sum(len(files) for root, _, files in os.walk(path) if "/.git" not in root + "/")


def _build(work_dir: Path, hot: list[StoreRequest], cold: list[StoreRequest]) -> dict[str, Path]:
    """The three pre-filled repos; returns them by name (and the 10k pre-fill time in the log)."""
    repos = {"100": work_dir / "repo100", "363": work_dir / "repo363", "10k": work_dir / "repo10k"}
    for path in repos.values():
        shutil.rmtree(path, ignore_errors=True)
    _prefill(repos["100"], hot)
    _prefill(repos["363"], hot + _baselines(cold))
    log.info("10k pre-fill took %.1f s", _prefill(repos["10k"], hot + cold))
    return repos


def _figures(runs: dict[str, dict[str, float]], naive: float) -> dict[str, float]:
    def ms(name: str, stat: str = "commit_ms_mean") -> float:
        return round(runs[name][stat], 2)

    return {
        "writer_iters_per_s": round(runs["10k"]["iters_per_s"], 1),
        "writer_iters_per_s_no_worktree": round(runs["10k bare"]["iters_per_s"], 1),
        "naive_git_iters_per_s": round(naive, 2),
        "writer_commit_ms_at_100": ms("100"),
        "writer_commit_ms_at_10k": ms("10k"),
        "writer_commit_ms_p99": ms("10k", "commit_ms_p99"),
        "writer_commit_ms_median_at_10k": ms("10k", "commit_ms_median"),
        "writer_commit_ms_at_100_no_worktree": ms("100 bare"),
        "writer_commit_ms_at_10k_no_worktree": ms("10k bare"),
        "writer_commit_ms_p99_no_worktree": ms("10k bare", "commit_ms_p99"),
        "writer_commit_ms_at_363_all_keys": ms("363"),
        "writer_close_ms_at_10k": ms("10k", "close_ms"),
        "ratio_10k_over_100": round(ms("10k") / ms("100"), 2),
        "ratio_10k_over_100_no_worktree": round(ms("10k bare") / ms("100 bare"), 2),
        "ratio_10k_over_363_all_keys": round(ms("10k") / ms("363"), 2),
        "writer_fsync_iter_per_s": round(runs["10k"]["iters_per_s"], 1),
        "writer_nofsync_iter_per_s": round(runs["10k nofsync"]["iters_per_s"], 1),
        "fsync_cost_ratio": round(ms("10k") / ms("10k nofsync"), 2),
    }


def run(work_dir: Path, baseline: str = "HEAD") -> dict[str, float | int | str]:
    """Build the repos under ``work_dir``, measure (the compaction figures beside those of the store of
    revision ``baseline``), return the figures."""
    work_dir.mkdir(parents=True, exist_ok=True)
    hot, cold, measured = _streams()
    repos = _build(work_dir, hot, cold)
    copy = work_dir / "copy"
    runs = {
        name: _best_writer(repos[size], copy, measured, not name.endswith("bare"), "nofsync" not in name)
        for name, size in (
            ("100", "100"),
            ("100 bare", "100"),
            ("363", "363"),
            ("10k", "10k"),
            ("10k bare", "10k"),
            ("10k nofsync", "10k"),
        )
    }
    naive = _time_naive(_copy(repos["10k"], copy, link=False), measured)  # writes files in place: a real copy
    shutil.rmtree(copy, ignore_errors=True)
    return {
        "prefill_iterations": sum(r.kind == "iteration" for r in hot + cold),
        "prefill_keys": HOT_KEYS + len({r.key for r in cold}),
        "repo_files": _count_files(repos["10k"]),
        "measured_commits": len(measured),
        **_figures(runs, naive),
        **compaction(work_dir / "compaction", _baseline_src(work_dir, baseline)),
        "baseline_commit": _revision(baseline),
    }


# -- repo size, commit time at depth, killed writers ------------------------------------------------


def _child_env(src: Path) -> dict[str, str]:
    """A child's environment: croqq from ``src`` (this checkout or the baseline's), the test samples from
    this checkout."""
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{SRC_ROOT}"}


def _revision(rev: str) -> str:
    """The commit ``rev`` names in this source tree's git repo (short form)."""
    out = subprocess.run(
        ["git", "-C", str(SRC_ROOT), "rev-parse", "--short", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def _baseline_src(work_dir: Path, rev: str) -> Path:
    """The croqq package and kernels/ of revision ``rev``, unpacked from this source tree's git repo."""
    dst = work_dir / "baseline-src"
    if not (dst / "croqq").is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(SRC_ROOT), "archive", "--format=tar", _revision(rev), "croqq", "kernels"],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "-x", "-C", str(dst)], input=archive.stdout, check=True)
    return dst


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _bytes_by_kind(repo: Path) -> dict[str, int]:
    """Bytes of the repo's objects in their packs: candidate sources, perf text, everything else."""
    git = ["git", "-C", str(repo)]
    listing = subprocess.run([*git, "rev-list", "--objects", "--all"], check=True, capture_output=True)
    path_of = dict(
        [*line.split(" ", 1), ""][:2] for line in listing.stdout.decode().splitlines() if line.strip()
    )
    fmt = "--batch-check=%(objectname) %(objectsize:disk)"
    sizes = subprocess.run(
        [*git, "cat-file", "--batch-all-objects", fmt], check=True, capture_output=True
    ).stdout.decode()
    out = {"sources": 0, "perf": 0}
    for line in sizes.splitlines():
        oid, size = line.split()
        where = path_of.get(oid, "") + "/"  # a folder counts with what it holds
        if "/srcs/" in where or "/headers/" in where or where.startswith(paths.KERNELS + "/"):
            out["sources"] += int(size)
        elif "/perf/" in where:
            out["perf"] += int(size)
    return out


def _sweep(path: Path, src: Path, in_flight: int) -> dict[str, float]:
    """The demo-like sweep with the writer of ``src`` (a source tree), ``in_flight`` keys at a time (0:
    all), in a child interpreter."""
    shutil.rmtree(path, ignore_errors=True)
    env = _child_env(src)
    args = [sys.executable, "-c", SWEEP_SCRIPT, str(path), str(SWEEP_DEPTH), str(SEED), GPU, DSL]
    args.append(str(in_flight))
    proc = subprocess.run(args, check=True, capture_output=True, text=True, env=env, cwd=src)  # -c: cwd first
    seconds, close_s, iterations, requests = proc.stdout.split()
    total = _dir_bytes(path / ".git" / "objects")
    kinds = _bytes_by_kind(path)
    iters = int(iterations)
    return {
        "git_bytes": total,
        "bytes_per_iter": round(total / iters),
        "records_bytes_per_iter": round((total - kinds["sources"] - kinds["perf"]) / iters),
        "sources_bytes_per_iter": round(kinds["sources"] / iters),
        "perf_bytes_per_iter": round(kinds["perf"] / iters),
        "commit_ms_mean": round(1e3 * float(seconds) / int(requests), 2),
        "iters_per_s": round(iters / float(seconds), 1),
        "close_ms": round(1e3 * float(close_s)),
        "iterations": iters,
    }


class _Tail:
    """A TipReader for synthesizing one key's history: appended files read back empty once they exist
    (the caller keeps what each request appends), everything else as last written."""

    def __init__(self, appended: set[str]) -> None:
        self.appended = appended
        self.files: dict[str, bytes] = {}

    def read(self, path: str) -> bytes | None:
        data = self.files.get(path)
        return b"" if data is not None and path in self.appended else data

    def blob_id(self, path: str) -> str | None:
        data = self.files.get(path)
        return blob_id_of(data) if data is not None else None


def _key_files(requests: list[StoreRequest]) -> dict[str, bytes]:
    """Every file the writer holds for one key after ``requests`` (its own plan_changes, in order)."""
    run, key = paths.RunPaths(GPU, DSL), requests[0].key
    appended = {run.results_tsv(key), run.rounds_raw(key), run.rounds_md(key), run.ideas(key)}
    appended.add(run.attempts(key))
    tail = _Tail(appended)
    parts: dict[str, list[bytes]] = {path: [] for path in appended}
    for req in requests:
        for path, data in (plan_changes(req, tail) or {}).items():
            assert data is not None
            if path in appended:
                parts[path].append(data)
            tail.files[path] = data
    tail.files.pop(run.state_json, None)
    return tail.files | {path: b"".join(chunks) for path, chunks in parts.items() if chunks}


def _synthesize(path: Path, hot: list[StoreRequest], cold_keys: list[str], depth: int) -> int:
    """A repo with the hot keys' real history (group commits) and ``depth`` iterations of every cold
    key, each key's files as the writer makes them, SYNTH_KEYS_PER_COMMIT keys per commit; returns the
    iterations it holds."""
    shutil.rmtree(path, ignore_errors=True)
    repo = GitRepo(path, sync_worktree=False)
    writer = ResultsWriter(repo)
    writer.apply_group(hot)
    state = load_state(repo, GPU, DSL)
    lines = {key: render.state_line(key, entry) for key, entry in (state.shapes if state else {}).items()}
    iterations = sum(r.kind == "iteration" for r in hot)
    for start in range(0, len(cold_keys), SYNTH_KEYS_PER_COMMIT):
        changes: dict[str, bytes | None] = {}
        for number, key in enumerate(cold_keys[start : start + SYNTH_KEYS_PER_COMMIT]):
            seed = SEED + start + number
            requests = list(sample_requests(GPU, DSL, [key], depth, seed, max_iter=max(150, depth + 1)))
            changes |= _key_files(requests)
            iterations += sum(r.kind == "iteration" for r in requests)
            lines[key] = render.state_line(key, requests[-1].state)
        changes[paths.RunPaths(GPU, DSL).state_json] = render.state_text(GPU, DSL, lines).encode()
        repo.commit(changes, f"synthesized history: {len(changes)} files")
    repo.close()
    return iterations


def _depth_figures(work_dir: Path) -> dict[str, float]:
    """Commit time at 100, 10k and 100k iterations of history (synthesized repos)."""
    keys = schedule_keys()
    hot = list(sample_requests(GPU, DSL, keys[:HOT_KEYS], MEASURED_DEPTH, SEED))
    prefill = [r for r in hot if r.checkpoint.current_iter < HOT_DEPTH]
    measured = [r for r in hot if r.checkpoint.current_iter >= HOT_DEPTH]
    copy = work_dir / "copy"
    out: dict[str, float] = {}
    for name, depth in (("100", 0), ("10k", COLD_DEPTH), ("100k", DEEP_COLD_DEPTH)):
        repo = work_dir / f"synth{name}"
        started = time.perf_counter()
        iterations = _synthesize(repo, prefill, keys[HOT_KEYS:] if depth else [], depth)
        log.info("synthesized %s history in %.1f s", name, time.perf_counter() - started)
        out[f"compact_history_iterations_at_{name}"] = iterations
        out[f"compact_git_bytes_at_{name}"] = _dir_bytes(repo / ".git" / "objects")
        best = _best_writer(repo, copy, measured, False)
        out[f"compact_commit_ms_at_{name}"] = round(best["commit_ms_mean"], 2)
        out[f"compact_commit_cpu_ms_at_{name}"] = round(best["commit_cpu_ms_mean"], 2)
        out[f"compact_close_ms_at_{name}"] = round(best["close_ms"], 2)
        if name != "100k":  # the same stream with loose objects instead of the per-commit pack
            loose = _best_writer(repo, copy, measured, False, loose=True)
            out[f"compact_commit_ms_at_{name}_loose"] = round(loose["commit_ms_mean"], 2)
        shutil.rmtree(repo, ignore_errors=True)
    out["compact_ratio_10k_over_100"] = round(
        out["compact_commit_ms_at_10k"] / out["compact_commit_ms_at_100"], 2
    )
    out["compact_cpu_ratio_100k_over_100"] = round(
        out["compact_commit_cpu_ms_at_100k"] / out["compact_commit_cpu_ms_at_100"], 2
    )
    out["compact_ratio_100k_over_100"] = round(
        out["compact_commit_ms_at_100k"] / out["compact_commit_ms_at_100"], 2
    )
    return out


def compaction(work_dir: Path, baseline_src: Path) -> dict[str, float]:
    """Repo size after demo-like sweeps, commit time at depth and pack files after killed writers, each
    with this tree's writer and with the one in ``baseline_src``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, float] = {}
    for sweep, in_flight in (("sweep_", SWEEP_IN_FLIGHT), ("sweep_all_", 0)):
        for prefix, src in (("", SRC_ROOT), ("baseline_", baseline_src)):
            log.info(
                "%s%s: 268 keys x %d iterations, %s at a time, through the writer of %s",
                prefix,
                sweep,
                SWEEP_DEPTH,
                in_flight or "all",
                src,
            )
            result = _sweep(work_dir / f"{prefix}{sweep}repo", src, in_flight)
            figures |= {prefix + sweep + name: value for name, value in result.items()}
            shutil.rmtree(work_dir / f"{prefix}{sweep}repo", ignore_errors=True)
        figures[sweep + "size_ratio"] = round(
            figures[sweep + "git_bytes"] / figures["baseline_" + sweep + "git_bytes"], 3
        )
    for prefix, src in (("", SRC_ROOT), ("baseline_", baseline_src)):
        log.info("commit time at depth with the writer of %s", src)
        depth = _child_depth(work_dir / f"{prefix}depth", src)
        figures |= {prefix + name: value for name, value in depth.items()}
    for prefix, src in (("", SRC_ROOT), ("baseline_", baseline_src)):
        log.info(
            "%sSIGKILLed writers: %d x %d STOREs with the writer of %s", prefix, KILLS, COMMITS_PER_KILL, src
        )
        figures |= {
            prefix + name: value for name, value in _killed_writers(work_dir / f"{prefix}killed", src).items()
        }
    return figures


def _pack_count(path: Path) -> int:
    return len(list((path / ".git" / "objects" / "pack").glob("*.pack")))


def _killed_writers(path: Path, src: Path) -> dict[str, float]:
    """Pack files after a writer process (of ``src``) was SIGKILLed KILLS times, each after it stored
    COMMITS_PER_KILL STOREs, and after the next writer stored as many and closed."""
    shutil.rmtree(path, ignore_errors=True)
    env = _child_env(src)
    args = [sys.executable, "-c", KILL_SCRIPT, str(path)]
    for _ in range(KILLS):
        proc = subprocess.Popen([*args, "0", GPU, DSL], stdout=subprocess.PIPE, text=True, env=env, cwd=src)
        assert proc.stdout is not None
        for _ in range(COMMITS_PER_KILL):
            proc.stdout.readline()
        proc.kill()  # SIGKILL, mid-run
        proc.wait()
    killed = _pack_count(path)
    subprocess.run(
        [*args, str(COMMITS_PER_KILL), GPU, DSL], check=True, capture_output=True, env=env, cwd=src
    )
    fsck = subprocess.run(
        ["git", "-C", str(path), "fsck", "--strict", "--no-dangling"], check=False, capture_output=True
    )
    out: dict[str, float] = {
        "killed_writers_pack_files": killed,
        "killed_writers_pack_files_after_next_close": _pack_count(path),
        "killed_writers_fsck_ok": int(fsck.returncode == 0),
    }
    shutil.rmtree(path, ignore_errors=True)
    return out


def _child_depth(path: Path, src: Path) -> dict[str, float]:
    """:func:`_depth_figures` (this module's code) over the store of ``src``, in a child interpreter (so
    both stores run alike, with no logging)."""
    env = _child_env(src)
    args = [sys.executable, "-c", DEPTH_SCRIPT, str(Path(__file__).resolve()), str(path)]
    proc = subprocess.run(args, check=True, capture_output=True, text=True, env=env, cwd=src)
    figures: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(path, ignore_errors=True)
    return figures


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m benchmarks.writer_bench <work dir>", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # progress lines of this module only; the writer's own logs would skew timings
    print(json.dumps(run(Path(sys.argv[1])), indent=2))
