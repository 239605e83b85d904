"""Every benchmark run leaves one JSON line in the history: the commit it measured, whether the tree was
dirty, when, on what machine, which parts and their figures; appending never makes the next run dirty."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from benchmarks import history
from benchmarks.__main__ import run_parts


def git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@localhost"]
    return subprocess.run(
        ["git", "-C", str(repo), *ident, *args], capture_output=True, text=True, check=True
    ).stdout


def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / "benchmarks" / "history.jsonl").write_text("")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "code")
    return repo


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_appends_one_line_naming_the_commit_parts_and_figures(tmp_path: Path) -> None:
    repo = checkout(tmp_path)
    file = repo / "benchmarks" / "history.jsonl"
    fake = {"fake": ("a fake part", lambda work, args: {"fake_s": 1.5, "fake_work": work.name})}
    figures = run_parts(["fake"], argparse.Namespace(), fake)  # type: ignore[arg-type]
    history.append(file, ["fake"], figures, root=repo)
    history.append(file, ["fake"], {"fake_s": 1.25}, root=repo)  # the first line made nothing dirty
    first, second = lines(file)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert first["commit"] == second["commit"] == head
    assert first["dirty"] is False and second["dirty"] is False
    assert first["parts"] == ["fake"] and first["figures"] == {"fake_s": 1.5, "fake_work": "fake"}
    assert second["figures"] == {"fake_s": 1.25}
    assert str(first["date"]).endswith("Z") and first["machine"] and first["cpus"]


def test_a_run_on_changed_tracked_files_is_marked_dirty(tmp_path: Path) -> None:
    repo = checkout(tmp_path)
    (repo / "code.py").write_text("x = 2\n")
    line = history.append(tmp_path / "elsewhere.jsonl", ["fake"], {}, root=repo)
    assert line["dirty"] is True and lines(tmp_path / "elsewhere.jsonl") == [line]


def test_outside_a_git_checkout_the_commit_is_null(tmp_path: Path) -> None:
    line = history.append(tmp_path / "h.jsonl", [], {}, root=tmp_path)
    assert line["commit"] is None and line["dirty"] is None
