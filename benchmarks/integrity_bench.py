"""What the writer's repo check costs on a results repo of ~10k iterations, one commit each.

    python -m benchmarks --only integrity

The repo: the writer benchmark's pre-fill stream (268 keys, 10,094 iterations with their attempts),
stored one ``ResultsWriter.apply`` per request (fsync off: only the repo's shape matters here), so it
has a commit per STORE and the packs git's background repack leaves. Figures:

- ``repo_check_startup_ms``: :class:`croqq.store.integrity.RepoCheck` run once on a fresh object (every
  ref, pack and loose object verified: what a writer start-up costs);
- ``repo_check_tick_ms``: the next run after one more commit (its new pack, plus the default budget of
  older files verified again in turn: what each periodic check costs);
- ``repo_check_new_only_ms``: the same with no re-verification budget (the floor);
- ``git_fsck_connectivity_s`` / ``git_fsck_full_s``: ``git fsck --connectivity-only`` and ``git fsck
  --full`` on the same repo (what ``croqq repo check`` adds, and why the periodic check does not run it).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import writer_bench
from croqq.store.gitrepo import GitRepo
from croqq.store.integrity import RepoCheck
from croqq.store.writer import ResultsWriter


def _build(path: Path) -> tuple[int, ResultsWriter]:
    prefill, cold, _ = writer_bench._streams()
    writer = ResultsWriter(GitRepo(path, sync_worktree=False, fsync=False))
    for req in prefill + cold:
        writer.apply(req)
    return sum(r.kind == "iteration" for r in prefill + cold), writer


def _ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return round((time.perf_counter() - started) * 1000, 1)


def _git_s(path: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(["git", "-C", str(path), *args], capture_output=True, check=True)
    return round(time.perf_counter() - started, 2)


def run(work_dir: Path) -> dict[str, float | int]:
    path = work_dir / "integrity-10k"
    iterations, writer = _build(path)
    writer.close()
    return {"repo_check_iterations": iterations, **measure(path)}


def measure(path: Path) -> dict[str, float | int]:
    """The figures on a repo built by :func:`_build` (its next STORE is the measured stream's first)."""
    _, _, measured = writer_bench._streams()
    check, floor = RepoCheck(path), RepoCheck(path, recheck_bytes=0)
    startup = _ms(check.run)
    floor.run()
    writer = ResultsWriter(GitRepo(path, sync_worktree=False, fsync=False))
    writer.apply(measured[0])
    writer.repo.sync_index()
    tick, new_only = _ms(check.run), _ms(floor.run)
    writer.close()
    git_dir = path / ".git"
    commits = subprocess.run(
        ["git", "-C", str(path), "rev-list", "--count", "main"], capture_output=True, text=True, check=True
    )
    return {
        "repo_check_commits": int(commits.stdout),
        "repo_check_packs": len(list((git_dir / "objects" / "pack").glob("*.pack"))),
        "repo_check_repo_mb": round(sum(f.stat().st_size for f in git_dir.rglob("*") if f.is_file()) / 1e6),
        "repo_check_startup_ms": startup,
        "repo_check_tick_ms": tick,
        "repo_check_new_only_ms": new_only,
        "git_fsck_connectivity_s": _git_s(path, "fsck", "--connectivity-only", "--no-progress"),
        "git_fsck_full_s": _git_s(path, "fsck", "--full", "--no-progress"),
    }
