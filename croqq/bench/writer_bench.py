"""Writer benchmark: stored iterations per second on a big results repo, against ``git add && git commit``.

    python -m croqq.bench.writer_bench <work dir>      # prints one JSON object

Setup. 268 schedule keys. Five "hot" keys are pre-filled to iteration 19 (100 iterations); the other
263 keys to iteration 37 (9,994 more, 10,094 in all, ~25k files). Pre-filling uses the writer's group
commit (the same files, in a few commits), then ``git repack -a -d``. The measured stream is the hot
keys' next iterations (20..59, with their compile-failed attempts), one commit each, on copies of the
same repo (hard links, except the reflogs that git appends to):

- ``writer_iters_per_s`` / ``_no_worktree``: ResultsWriter.apply with / without working-tree sync, on
  the 10k repo; the time includes the batched index flushes and the final one at close;
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

Every writer figure except ``writer_nofsync_iter_per_s`` is measured with fsync on, the default (figures
before issue 10 were measured without fsync).

Each writer figure is the best of ``ROUNDS`` runs on fresh copies (other load on a small shared machine
only ever slows a run down); dirty pages of the copy are synced before a run starts.
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

from croqq.bench.samples import sample_requests, schedule_keys
from croqq.store.gitrepo import GitRepo, blob_id_of
from croqq.store.render import commit_message
from croqq.store.schema import StoreRequest
from croqq.store.writer import ResultsWriter, StateCache, plan_changes

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
    src: Path, copy: Path, requests: list[StoreRequest], sync: bool, fsync: bool = True
) -> dict[str, float]:
    """The best of ROUNDS runs, each on a fresh copy of ``src``."""
    runs = [_time_writer(_copy(src, copy), requests, sync, fsync) for _ in range(ROUNDS)]
    shutil.rmtree(copy, ignore_errors=True)
    return min(runs, key=lambda r: r["commit_ms_mean"])


def _time_writer(path: Path, requests: list[StoreRequest], sync: bool, fsync: bool) -> dict[str, float]:
    repo = GitRepo(path, sync_worktree=sync, fsync=fsync)
    writer = ResultsWriter(repo)
    times = []
    for req in requests:
        started = time.perf_counter()
        writer.apply(req)
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    repo.close()
    total = sum(times) + time.perf_counter() - started
    iterations = sum(1 for r in requests if r.kind == "iteration")
    times.sort()
    return {
        "iters_per_s": iterations / total,
        "commit_ms_mean": 1e3 * total / len(requests),
        "commit_ms_median": 1e3 * statistics.median(times),
        "commit_ms_p99": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))],
    }


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
        "ratio_10k_over_100": round(ms("10k") / ms("100"), 2),
        "ratio_10k_over_100_no_worktree": round(ms("10k bare") / ms("100 bare"), 2),
        "ratio_10k_over_363_all_keys": round(ms("10k") / ms("363"), 2),
        "writer_fsync_iter_per_s": round(runs["10k"]["iters_per_s"], 1),
        "writer_nofsync_iter_per_s": round(runs["10k nofsync"]["iters_per_s"], 1),
        "fsync_cost_ratio": round(ms("10k") / ms("10k nofsync"), 2),
    }


def run(work_dir: Path) -> dict[str, float | int]:
    """Build the repos under ``work_dir``, measure, return the figures."""
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
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m croqq.bench.writer_bench <work dir>", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # progress lines of this module only; the writer's own logs would skew timings
    print(json.dumps(run(Path(sys.argv[1])), indent=2))
