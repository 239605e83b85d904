"""The move from the layout before shapes/ (a folder per kind of record) to one folder per shape.

The fixture ``results-before-shapes.bundle`` is a results repo written by croqq before the move (commit
49d4203): ``croqq up --dtype all --limit 4 --max-iter 12 --sim-gpus 2`` (4 complete shapes with their
best kernels and the submission), then 2 more shapes of ``sample_requests`` (profiles and compile-failed
attempts) and a compaction summary, all through that version's writer; that version's validate found
no problem in it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from croqq.domain.source import load_stored
from croqq.store import layout
from croqq.store.gitrepo import GitRepo
from croqq.store.load import (
    load_attempts,
    load_best_source,
    load_checkpoint,
    load_rounds,
    parse_json,
    parse_jsonl,
)
from croqq.store.paths import RunPaths
from croqq.store.render import parse_tsv
from croqq.store.schema import AttemptRecord, Checkpoint, RoundRecord
from croqq.store.validate import validate_tip

BUNDLE = Path(__file__).resolve().parents[1] / "fixtures" / "results-before-shapes.bundle"
RUN = RunPaths("sm90_Simulated_H100_SXM", "cuda")
OLD = RUN.root


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    path = tmp_path / "results"
    subprocess.run(["git", "clone", "-q", "-b", "main", str(BUNDLE), str(path)], check=True)
    return GitRepo(path, sync_worktree=True)


def _old_keys(repo: GitRepo) -> list[str]:
    return [name.removesuffix(".json") for name in repo.list_dir(f"{OLD}/checkpoints")]


def _moved(text: str) -> str:
    """Source paths of the old layout in ``text`` as the new one names them."""
    return re.sub(rf"{re.escape(OLD)}/srcs/([^/ ]+)/", lambda m: f"{RUN.srcs_dir(m.group(1))}/", text)


def _read(repo: GitRepo, path: str) -> str | None:
    data = repo.read(path)
    return data.decode() if data is not None else None


def _before(repo: GitRepo, key: str) -> dict[str, object]:
    """One shape's records read at their old paths, with source paths as the new layout names them."""
    ckpt = parse_json(repo.read(f"{OLD}/checkpoints/{key}.json") or b"", Checkpoint, key)
    rounds = parse_jsonl(repo.read(f"{OLD}/memory/{key}/rounds.raw.jsonl") or b"", RoundRecord, key)
    attempts = repo.read(f"{OLD}/logs/{key}/attempts.jsonl")
    rows = parse_tsv((repo.read(f"{OLD}/logs/{key}/results.tsv") or b"").decode(), key)
    sources = {
        f"{RUN.srcs_dir(key)}/{name}": load_stored(f"{OLD}/srcs/{key}/{name}", lambda p: _read(repo, p))
        for name in repo.list_dir(f"{OLD}/srcs/{key}")
    }
    return {
        "checkpoint": ckpt.model_copy(update={"best_kernel": _moved(ckpt.best_kernel)}),
        "rounds": [
            r.model_copy(update={"kernel": _moved(r.kernel), "run_command": _moved(r.run_command)})
            for r in rounds
        ],
        "attempts": parse_jsonl(attempts, AttemptRecord, key) if attempts else [],
        "kernels": [(_moved(row.kernel), _moved(row.run_command)) for row in rows],
        "sources": sources,
        "best": load_best_source(repo, ckpt),
        "ideas": repo.read(f"{OLD}/memory/{key}/ideas.jsonl"),
        "perf": {name: repo.read(f"{OLD}/perf/{key}/{name}") for name in repo.list_dir(f"{OLD}/perf/{key}")},
    }


def _after(repo: GitRepo, key: str) -> dict[str, object]:
    ckpt = load_checkpoint(repo, RUN.gpu, RUN.dsl, key)
    assert ckpt is not None
    rows = parse_tsv((repo.read(RUN.results_tsv(key)) or b"").decode(), key)
    return {
        "checkpoint": ckpt,
        "rounds": load_rounds(repo, RUN.gpu, RUN.dsl, key),
        "attempts": load_attempts(repo, RUN.gpu, RUN.dsl, key),
        "kernels": [(row.kernel, row.run_command) for row in rows],
        "sources": {
            path: load_stored(path, lambda p: _read(repo, p))
            for path in (f"{RUN.srcs_dir(key)}/{n}" for n in repo.list_dir(RUN.srcs_dir(key)))
        },
        "best": load_best_source(repo, ckpt),
        "ideas": repo.read(RUN.ideas(key)),
        "perf": {name: repo.read(f"{RUN.perf_dir(key)}/{name}") for name in repo.list_dir(RUN.perf_dir(key))},
    }


def test_the_old_layout_moves_to_one_folder_per_shape_in_one_commit_and_reads_back_the_same(
    repo: GitRepo,
) -> None:
    keys = _old_keys(repo)
    before = {key: _before(repo, key) for key in keys}
    assert len(keys) == 6 and any(b["attempts"] for b in before.values())
    assert all(b["best"] for b in before.values())  # every best kernel reads back from the old layout
    tip = repo.head()

    commit = layout.migrate(repo)

    assert commit is not None and repo.head() == commit
    parents = subprocess.run(
        ["git", "-C", str(repo.path), "rev-list", "--count", f"{tip}..{commit}"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert parents.stdout.strip() == "1"  # one commit: a crash leaves one layout or the other, whole
    assert not any(repo.exists(folder) for folder in RUN.legacy_dirs())
    assert sorted(repo.list_dir(RUN.shapes_dir)) == sorted(keys)
    for key in keys:
        assert _after(repo, key) == before[key], key
    state = (repo.read(RUN.state_json) or b"").decode()
    summary = (repo.read(RUN.summary_md) or b"").decode()
    assert f"{OLD}/srcs/" not in state + summary and f"{RUN.shapes_dir}/" in state
    assert validate_tip(repo, None) == []
    for key in keys:  # the working tree moved too
        assert (repo.path / RUN.checkpoint(key)).is_file()
    assert not (repo.path / OLD / "checkpoints").exists()


def test_validate_names_the_old_layout_and_migrate_leaves_the_new_one_alone(repo: GitRepo) -> None:
    problems = validate_tip(repo, None)
    folders = {p.path for p in problems if "layout before shapes/" in p.reason}
    assert folders == set(RUN.legacy_dirs())
    assert all(layout.MIGRATE_HINT in p.reason for p in problems if p.path in folders)
    first = layout.migrate(repo)
    assert first is not None
    assert layout.migrate(repo) is None and repo.head() == first


def test_what_is_no_shape_s_file_or_would_overwrite_one_stays_and_validate_names_its_folder(
    repo: GitRepo,
) -> None:
    stray = f"{OLD}/checkpoints/README"
    key = _old_keys(repo)[0]
    mine = RUN.checkpoint(key)
    repo.commit({stray: b"notes\n", mine: b"{}\n"}, "a file that is no shape's, a shape already moved")
    layout.migrate(repo)
    assert repo.read(stray) == b"notes\n"  # nothing that is not a shape's file is lost
    assert repo.read(mine) == b"{}\n" and repo.exists(f"{OLD}/checkpoints/{key}.json")  # nor overwritten
    assert repo.exists(f"{OLD}/logs/{key}/results.tsv") and not repo.exists(RUN.results_tsv(key))
    legacy = {p.path for p in validate_tip(repo, None) if "layout before shapes/" in p.reason}
    assert legacy == {f"{OLD}/{sub}" for sub in ("checkpoints", "logs", "memory", "srcs", "perf")}
