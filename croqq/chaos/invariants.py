"""The promises croqq keeps, checked over the results repo and the live state.

Repo (``repo_problems``): everything ``croqq validate`` checks (schemas; iteration ids contiguous from 000
with no gaps or duplicates; attempts without iteration ids; checkpoint, state.json, results.tsv,
rounds.raw.jsonl and rounds.md agree; paths inside the repo), plus exactly one commit per stored
iteration (commits are matched to runs by their ``Croqq-Run`` trailer; a group commit records each of its
iterations), and ``git fsck`` clean.

Live (``live_problems``): after reconciliation no lease is held by a dead process and no running step's
lease is overdue.

Epochs (``epoch_problems``), over the repo and the step ledger together: each stored iteration's STORE step
is in the ledger, done, at an epoch no older than the one its record carries; and its measurement was taken
under the epoch of the GPU step that was accepted. A measurement does not carry its epoch, but it carries
when its GPU step started (``MeasureResult.gpu_started_at``, Redis's clock) and on which GPU: the GPU step
that precedes a STORE (the shape's step number before it) must be done, on that GPU's queue, and claimed
at its final epoch no later than the measurement started. A result of an older epoch (a holder whose lease
expired and whose step was handed to another) started before that claim. Needs the step records, which
Redis keeps ``keys.STEP_TTL_S`` after a step ends: a check right after a run, not of an old repo.
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
from croqq.delivery.queues import GPU_KINDS
from croqq.delivery.redis_client import strs, text
from croqq.delivery.state import make_sid
from croqq.store.load import list_runs, load_rounds
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


CLOCK_SLACK_S = 0.5  # hosts read Redis's clock every few seconds and carry it forward in between


def _step_records(client: redis.Redis) -> dict[tuple[str, int], list[dict[str, str]]]:
    """(sid, step number) -> the ledger's step records (``<key>#<number>.<random>``)."""
    ids = strs(client.scan_iter(match=keys.step("*"), count=1000))
    pipe = client.pipeline(transaction=False)
    for key in ids:
        pipe.hgetall(key)
    out: dict[tuple[str, int], list[dict[str, str]]] = {}
    for key, raw in zip(ids, pipe.execute(), strict=True):
        record = {text(k) or "": text(v) or "" for k, v in raw.items()}
        record["step_id"] = key.split(":step:", 1)[1]
        number = record["step_id"].rpartition("#")[2].split(".", 1)[0]
        if record.get("sid") and number.isdigit():
            out.setdefault((record["sid"], int(number)), []).append(record)
    return out


def epoch_problems(repo_path: Path, client: redis.Redis) -> tuple[int, list[str]]:
    """The stored iterations checked, and each one not measured under the epoch that stored it."""
    from croqq.store.gitrepo import GitRepo

    steps = _step_records(client)
    by_id = {r["step_id"]: r for records in steps.values() for r in records}
    repo = GitRepo.open_existing(repo_path).freeze()
    checked, problems = 0, []
    for gpu, dsl in list_runs(repo):
        for key in repo.list_dir(RunPaths(gpu, dsl).shapes_dir):
            sid = make_sid(gpu, dsl, key)
            for rnd in load_rounds(repo, gpu, dsl, key):
                if rnd.imported is not None:
                    continue
                checked += 1
                where = f"{sid} iter{rnd.iteration:03d}"
                store = by_id.get(rnd.step_id)
                if store is None or store.get("kind") != "store" or store.get("status") != "done":
                    problems.append(
                        f"{where}: its STORE step {rnd.step_id} is not a done STORE in the ledger"
                    )
                    continue
                if int(store["epoch"]) < rnd.epoch:
                    problems.append(f"{where}: stored at epoch {rnd.epoch}, the ledger says {store['epoch']}")
                number = int(rnd.step_id.rpartition("#")[2].split(".", 1)[0])
                gpu_steps = [r for r in steps.get((sid, number - 1), []) if r.get("kind") in GPU_KINDS]
                if len(gpu_steps) != 1 or gpu_steps[0].get("status") != "done":
                    problems.append(f"{where}: no single done GPU step before its STORE ({gpu_steps})")
                    continue
                measured = gpu_steps[0]
                started = rnd.measure.gpu_started_at
                if measured.get("queue") != f"gpu.{rnd.gpu_uuid}":
                    problems.append(
                        f"{where}: measured on {rnd.gpu_uuid}, its step ran on {measured.get('queue')}"
                    )
                if started is None or started < float(measured["started_at"]) - CLOCK_SLACK_S:
                    problems.append(
                        f"{where}: measured at {started} before its step {measured['step_id']} was "
                        f"claimed at epoch {measured['epoch']} ({measured['started_at']}): a stale result"
                    )
    repo.close()
    return checked, problems
