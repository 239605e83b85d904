"""The promises croqq keeps, checked over the results repo and the live state.

Repo (``repo_problems``): everything ``croqq validate`` checks (schemas; iteration ids contiguous from 000
with no gaps or duplicates; attempts without iteration ids; checkpoint, state.json, results.tsv,
rounds.raw.jsonl and rounds.md agree; paths inside the repo), plus exactly one commit per stored
iteration (commits are matched to runs by their ``Croqq-Run`` trailer; a group commit records each of its
iterations), and ``git fsck`` clean.

Live (``live_problems``): after reconciliation no lease is held by a dead process and no running step's
lease is overdue.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pygit2
import redis

from croqq.delivery import clock, keys
from croqq.delivery.leases import dead_local
from croqq.delivery.redis_client import strs, text
from croqq.store.load import list_runs
from croqq.store.paths import RunPaths
from croqq.store.render import TRAILER_RESET, parse_tsv, stored_in_message
from croqq.store.validate import Problem, validate_repo

_RESET = re.compile(rf"^{TRAILER_RESET}: (\S+)$", re.MULTILINE)


def iteration_commits(repo_path: Path, branch: str = "main") -> Counter[tuple[str, str, int]]:
    """(run, key, iteration) -> number of commits on the branch that stored it, counting for each shape
    only the commits after its last reset by ``croqq clean`` (its history starts over there)."""
    repo = pygit2.Repository(str(repo_path))
    counts: Counter[tuple[str, str, int]] = Counter()
    ref = repo.references.get(f"refs/heads/{branch}")
    if ref is None:
        return counts
    reset: set[tuple[str, str]] = set()
    for commit in repo.walk(ref.target, pygit2.enums.SortMode.TOPOLOGICAL):  # newest first
        for run_key in _RESET.findall(commit.message):
            run, _, key = run_key.rpartition("/")
            reset.add((run, key))
        for run, key, iteration in stored_in_message(commit.message):
            if (run, key) not in reset:
                counts[(run, key, iteration)] += 1
    return counts


def stored_iterations(repo_path: Path) -> Counter[tuple[str, str, int]]:
    """(run, key, iteration) -> rows in the branch tip's results.tsv files."""
    from croqq.store.gitrepo import GitRepo

    repo = GitRepo.open_existing(repo_path).freeze()
    rows: Counter[tuple[str, str, int]] = Counter()
    for gpu, dsl in list_runs(repo):
        run = RunPaths(gpu, dsl)
        for key in repo.list_dir(run.shapes_dir):
            data = repo.read(run.results_tsv(key))
            for row in parse_tsv(data.decode()) if data else []:
                rows[(f"{gpu}/{dsl}", key, row.iter)] += 1
    repo.close()
    return rows


def fsck_problems(repo_path: Path) -> list[Problem]:
    done = subprocess.run(
        ["git", "-C", str(repo_path), "fsck", "--no-progress", "--no-dangling"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    if done.returncode == 0 and not lines:
        return []
    return [Problem(".git", f"git fsck: {line}") for line in lines or [f"exit {done.returncode}"]]


def repo_problems(repo_path: Path, dsl: str | None = None) -> list[Problem]:
    problems = validate_repo(repo_path, dsl)
    commits = iteration_commits(repo_path)
    rows = stored_iterations(repo_path)
    for (run, key, iteration), n in sorted(rows.items()):
        made = commits.get((run, key, iteration), 0)
        if made != 1 or n != 1:
            problems.append(
                Problem(
                    RunPaths(*run.split("/")).results_tsv(key),
                    f"iter{iteration:03d}: {n} row(s) and {made} commit(s); expected exactly one",
                )
            )
    for (run, key, iteration), made in sorted(commits.items()):
        if (run, key, iteration) not in rows:
            problems.append(
                Problem(
                    RunPaths(*run.split("/")).results_tsv(key),
                    f"iter{iteration:03d} was committed {made} time(s) but is not in results.tsv",
                )
            )
    return problems + fsck_problems(repo_path)


def live_problems(client: redis.Redis, grace_s: float) -> list[str]:
    """Leases held by dead processes, and running steps whose lease is overdue by more than ``grace_s``."""
    problems = []
    for key in strs(client.scan_iter(match=keys.lease("*"), count=500)):
        owner = text(client.get(key)) or ""
        if dead_local(owner):
            problems.append(f"{key} is held by {owner}, a process that no longer exists")
    now = clock.now(client)
    running: list[tuple[str, float]] = list(client.zrange(keys.RUNNING, 0, -1, withscores=True))  # type: ignore[arg-type]
    for step_id, score in running:
        sid, deadline = text(step_id) or "", float(score)
        if deadline < now - grace_s:
            owner = text(client.hget(keys.step(sid), "owner")) or "?"
            problems.append(
                f"step {sid} (owner {owner}) is running with a lease overdue by {now - deadline:.0f}s"
            )
    return problems
