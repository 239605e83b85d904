"""The results layout before ``shapes/``, and its move to one folder per shape (one commit, by the writer).

Before, a run kept one folder per kind of record, each with one entry per shape: ``checkpoints/<key>.json``,
``logs/<key>/``, ``memory/<key>/``, ``srcs/<key>/`` and ``perf/<key>/``. A STORE touches one shape in
each of them, so every commit re-serialized five trees as wide as the schedule (268 entries); now a run
keeps ``shapes/<key>/`` (see :mod:`croqq.store.paths`) and a commit rewrites one.

:func:`migrate` moves every run still in the old layout, all in ONE commit (a crash before it leaves the
old layout whole, after it the new one): ``checkpoints/<key>.json`` becomes ``shapes/<key>/checkpoint.json``,
the files of ``logs/<key>/`` and ``memory/<key>/`` go to ``shapes/<key>/``, those of ``srcs/<key>/`` and
``perf/<key>/`` to ``shapes/<key>/srcs/`` and ``shapes/<key>/perf/``. Two things inside files change with
the move: the source paths that records name (``kernel``, ``best_kernel``), in the moved records, in
state.json and in compaction-summary.md; and each moved source's quoted includes, now relative to its new
folder. The writer runs it when it opens the repo (it is the only process that writes there), and
``croqq validate`` names an old-layout folder that is still there.
"""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Iterator

from croqq.domain.source import rewrite_includes
from croqq.store import paths
from croqq.store.gitrepo import Changes, GitRepo
from croqq.store.load import list_runs

log = logging.getLogger(__name__)

MIGRATE_HINT = "the writer (`croqq writer`, or `croqq up`) moves it to shapes/<key>/ when it starts"
_SPREAD = ("logs", "memory")  # their files land in shapes/<key>/ itself; srcs/ and perf/ keep their name
_RECORDS = (".json", ".jsonl", ".tsv", ".md")


def legacy_runs(repo: GitRepo) -> list[paths.RunPaths]:
    """The runs that still have a folder of the old layout."""
    runs = [paths.RunPaths(gpu, dsl) for gpu, dsl in list_runs(repo)]
    return [run for run in runs if any(repo.exists(folder) for folder in run.legacy_dirs())]


def _files(repo: GitRepo, folder: str) -> Iterator[str]:
    for name in repo.list_dir(folder):
        path = f"{folder}/{name}"
        if repo.is_dir(path):
            yield from _files(repo, path)
        else:
            yield path


def _new_path(run: paths.RunPaths, path: str) -> str | None:
    """Where an old-layout file goes (None: not a shape's file; it stays, and validate names it). A shape
    that has a folder under shapes/ already keeps it: its old files stay too (nothing is overwritten)."""
    sub, _, rest = path[len(run.root) + 1 :].partition("/")
    key, _, inner = rest.partition("/")
    if sub == "checkpoints":
        return run.checkpoint(key[: -len(".json")]) if key.endswith(".json") and not inner else None
    if not inner:
        return None
    if sub in _SPREAD:
        return f"{run.shape_dir(key)}/{inner}"
    return f"{run.shape_dir(key)}/{sub}/{inner}"


def _source_paths(run: paths.RunPaths) -> tuple[re.Pattern[bytes], bytes]:
    """A pattern for a source path of the old layout in a record, and its replacement."""
    old = re.escape(f"{run.root}/srcs/".encode())
    return re.compile(old + rb"([^/\"\t\n\\]+)/"), f"{run.shapes_dir}/".encode() + rb"\1/srcs/"


def migration(repo: GitRepo, run: paths.RunPaths) -> Changes:
    """The changes that move one run to the new layout."""
    pattern, replacement = _source_paths(run)
    moved = tuple(run.shape_dir(key) + "/" for key in repo.list_dir(run.shapes_dir))
    moves = {
        old: new
        for folder in run.legacy_dirs()
        for old in _files(repo, folder)
        if (new := _new_path(run, old)) is not None and not new.startswith(moved)
    }
    changes: Changes = {}
    for old, new in moves.items():
        data = repo.read(old) or b""
        if old.endswith(_RECORDS):
            data = pattern.sub(replacement, data)
        elif old.startswith(f"{run.root}/srcs/"):
            data = _rebase_includes(data, old, new, moves)
        changes[old] = None
        changes[new] = data
    for path in (run.state_json, run.summary_md):
        found = repo.read(path)
        if found is not None:
            changes[path] = pattern.sub(replacement, found)
    return changes


def _rebase_includes(data: bytes, old: str, new: str, moves: dict[str, str]) -> bytes:
    """A moved source's quoted includes, relative to its new folder (what they named is unchanged)."""
    here, there = posixpath.dirname(old), posixpath.dirname(new)

    def target(include: str) -> str | None:
        if include.startswith("/"):
            return None
        named = posixpath.normpath(posixpath.join(here, include))
        return posixpath.relpath(moves.get(named, named), there)

    text = data.decode("utf-8", errors="surrogateescape")
    return rewrite_includes(text, target).encode("utf-8", errors="surrogateescape")


def migrate(repo: GitRepo) -> str | None:
    """Move every old-layout run to shapes/<key>/ in one commit; the commit, or None when none was left."""
    runs = legacy_runs(repo)
    if not runs:
        return None
    changes: Changes = {}
    for run in runs:
        changes |= migration(repo, run)
    names = ", ".join(f"{run.gpu}/{run.dsl}" for run in runs)
    commit = repo.commit(changes, f"layout: one folder per shape (shapes/<key>/) in {names}")
    log.warning("moved %s to the shapes/<key>/ layout (%d files) in %s", names, len(changes), commit[:12])
    return commit
