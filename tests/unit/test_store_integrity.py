"""A damaged results repo (a flipped byte in a pack or a loose object, a truncated ref) is found by the
writer's cheap check, refused by the writer, and repaired from the remote it pushes to."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.chaos.invariants import repo_problems
from croqq.errors import RepoCorruptError
from croqq.store.gitrepo import GitRepo
from croqq.store.integrity import RepoCheck, RepoGuard
from croqq.store.repair import repair
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests

GPU, DSL = "sm90_NVIDIA_H200", "cuda"
KEYS = ["f16_4096x8192x8192", "f16_256x256x256"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def flip(path: Path, at: int) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def biggest_pack(repo: Path) -> Path:
    return max((repo / ".git/objects/pack").glob("*.pack"), key=lambda p: p.stat().st_size)


def tip(repo: Path) -> str:
    return git(repo, "rev-parse", "main")


def store(repo: Path, reqs: list, guard: RepoGuard | None = None) -> ResultsWriter:  # type: ignore[type-arg]
    writer = ResultsWriter(GitRepo(repo))
    writer.guard = guard
    for req in reqs:
        writer.apply(req)
    return writer


@pytest.fixture
def reqs() -> list:  # type: ignore[type-arg]
    return list(sample_requests(GPU, DSL, KEYS, 6, 5))


@pytest.fixture
def pushed(tmp_path: Path, reqs: list) -> tuple[Path, Path]:  # type: ignore[type-arg]
    """A repo with half the requests stored, all pushed to a bare remote, then repacked into one pack."""
    repo, remote = tmp_path / "results", tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    store(repo, reqs[: len(reqs) // 2]).close()
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "push", "-q", str(remote), "main:main")
    return repo, remote


def test_an_intact_repo_passes_the_check(pushed: tuple[Path, Path]) -> None:
    assert RepoCheck(pushed[0]).run() == []


def test_a_flipped_byte_in_a_pack_is_found_and_names_the_object(pushed: tuple[Path, Path]) -> None:
    repo = pushed[0]
    pack = biggest_pack(repo)
    flip(pack, pack.stat().st_size // 2)
    damage = RepoCheck(repo).run()
    assert len(damage) == 1 and damage[0].path == pack
    line = damage[0].line
    assert line.startswith("results repo corrupt: object ") and f"objects/pack/{pack.name}" in line
    bad = line.split()[4]
    assert "\n" not in line and line.endswith("see `croqq repo repair`")
    read = subprocess.run(["git", "-C", str(repo), "cat-file", "-p", bad], capture_output=True, check=False)
    assert read.returncode != 0


def test_a_flipped_byte_in_a_loose_object_is_found(pushed: tuple[Path, Path]) -> None:
    repo = pushed[0]
    git(repo, "commit", "-q", "--allow-empty", "-m", "a loose commit")  # git writes it as a loose object
    head = tip(repo)
    loose = repo / ".git/objects" / head[:2] / head[2:]
    flip(loose, loose.stat().st_size // 2)
    damage = RepoCheck(repo).run()
    assert damage and damage[0].line.startswith(f"results repo corrupt: loose object {head} unreadable")


@pytest.mark.parametrize("keep", [0, 7])
def test_a_truncated_ref_is_found(pushed: tuple[Path, Path], keep: int) -> None:
    repo = pushed[0]
    ref = repo / ".git/refs/heads/main"
    ref.write_text(ref.read_text()[:keep])
    damage = RepoCheck(repo).run()
    assert [d.line.split(" (")[0] for d in damage] == ["results repo corrupt: ref refs/heads/main unreadable"]


def test_an_old_pack_is_verified_again_in_turn(pushed: tuple[Path, Path]) -> None:
    """Packs verified once are read again within the per-run budget, so later bit rot is found too."""
    repo = pushed[0]
    pack = biggest_pack(repo)
    check = RepoCheck(repo, recheck_bytes=pack.stat().st_size // 2 + 1)
    assert check.run() == []
    flip(pack, pack.stat().st_size - 100)  # a blob (git packs commits and trees first)
    assert check.run() == []  # half the pack's bytes earned: not its turn yet
    assert check.run() != []  # the whole pack's worth: verified again


def test_the_writer_commits_nothing_on_a_damaged_repo_and_resumes_once_repaired(
    pushed: tuple[Path, Path],
    reqs: list,  # type: ignore[type-arg]
) -> None:
    repo, remote = pushed
    heard: list[str | None] = []
    guard = RepoGuard(RepoCheck(repo), heard.append, recheck_s=0.0)
    writer = store(repo, [], guard)
    before = tip(repo)
    pack = biggest_pack(repo)
    flip(pack, pack.stat().st_size // 2)
    assert guard.check() is not None
    rest = reqs[len(reqs) // 2 :]
    with pytest.raises(RepoCorruptError, match="results repo corrupt: object"):
        writer.apply(rest[0])
    assert tip(repo) == before and len(heard) == 1 and heard[0] is not None
    writer.repo.close()
    report = repair(repo, "main", str(remote))
    assert report.after == before and report.lost_commits == 0 and report.quarantined
    writer = store(repo, [], guard)
    for req in rest:
        writer.apply(req)
    writer.close()
    assert heard[-1] is None
    assert repo_problems(repo) == []


def test_a_commit_that_reads_a_damaged_object_is_refused_like_a_check(
    pushed: tuple[Path, Path],
    reqs: list,  # type: ignore[type-arg]
) -> None:
    """Damage the check has not seen yet: the commit's own read fails, and the guard takes it up."""
    repo = pushed[0]
    heard: list[str | None] = []
    guard = RepoGuard(RepoCheck(repo), heard.append, recheck_s=3600.0)
    guard.check()
    before = tip(repo)
    writer = ResultsWriter(GitRepo(repo, sync_worktree=False))
    writer.guard = guard
    writer.repo.on_damage = guard.found
    pack = biggest_pack(repo)
    os.chmod(pack, 0o644)
    pack.write_bytes(pack.read_bytes()[:12])  # every object of the pack is gone
    writer.repo.reopen()
    with pytest.raises(RepoCorruptError):
        writer.apply(reqs[len(reqs) // 2])
    assert heard and heard[-1] is not None and guard.problem == heard[-1]
    with pytest.raises(RepoCorruptError):
        writer.apply(reqs[len(reqs) // 2])  # refused at once, before any read
    assert (repo / ".git/refs/heads/main").read_text().strip() == before


def test_an_emptied_ref_is_moved_to_the_remote_tip_and_the_later_commits_are_counted_lost(
    pushed: tuple[Path, Path],
    reqs: list,  # type: ignore[type-arg]
) -> None:
    repo, remote = pushed
    pushed_tip = tip(repo)
    store(repo, reqs[len(reqs) // 2 :]).close()  # committed after the last push
    (repo / ".git/refs/heads/main").write_text("")
    report = repair(repo, "main", str(remote))
    assert report.after == pushed_tip and tip(repo) == pushed_tip
    assert RepoCheck(repo).run() == [] and repo_problems(repo) == []


def test_a_ref_truncated_after_seven_digits_keeps_its_commit(
    pushed: tuple[Path, Path],
    reqs: list,  # type: ignore[type-arg]
) -> None:
    repo, remote = pushed
    store(repo, reqs[len(reqs) // 2 :]).close()
    newest = tip(repo)
    ref = repo / ".git/refs/heads/main"
    ref.write_text(newest[:9])
    report = repair(repo, "main", str(remote))
    assert report.after == newest and report.lost_commits == 0 and repo_problems(repo) == []


def test_a_damaged_loose_object_is_re_fetched(pushed: tuple[Path, Path]) -> None:
    repo, remote = pushed
    git(repo, "commit", "-q", "--allow-empty", "-m", "a loose commit")
    git(repo, "push", "-q", str(remote), "main:main")
    head = tip(repo)
    loose = repo / ".git/objects" / head[:2] / head[2:]
    flip(loose, loose.stat().st_size // 2)
    report = repair(repo, "main", str(remote))
    assert report.after == head and RepoCheck(repo).run() == []
    assert git(repo, "cat-file", "-t", head) == "commit"


def test_repair_without_a_remote_and_an_unreadable_history_says_what_to_pass(
    pushed: tuple[Path, Path],
) -> None:
    repo = pushed[0]
    (repo / ".git/refs/heads/main").write_text("")
    with pytest.raises(Exception, match="--from REMOTE"):
        repair(repo, "main", "")


def test_a_repo_not_created_yet_is_not_damage(tmp_path: Path) -> None:
    assert RepoCheck(tmp_path / "results").run() == []
    (tmp_path / "empty").mkdir()
    assert RepoCheck(tmp_path / "empty").run() == []


def test_repo_check_names_the_damage_in_one_line_and_exits_1(
    pushed: tuple[Path, Path], croqq: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    repo, remote = pushed
    pack = biggest_pack(repo)
    flip(pack, pack.stat().st_size // 2)
    done = croqq({}, "repo", "check", "--repo", str(repo))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith("results repo corrupt: object ")
    assert "croqq repo repair" in done.stderr
    fixed = croqq({}, "repo", "repair", "--repo", str(repo), "--from", str(remote))
    assert fixed.returncode == 0 and "results repo repaired: main at" in fixed.stdout, fixed.stderr
    assert croqq({}, "repo", "check", "--repo", str(repo)).stdout.strip() == "results repo is intact"


def test_the_guards_first_verdict_is_always_heard(pushed: tuple[Path, Path]) -> None:
    """An intact repo at start-up clears an alarm that a previous writer left; later checks that find
    nothing new say nothing."""
    heard: list[str | None] = []
    guard = RepoGuard(RepoCheck(pushed[0]), heard.append)
    guard.check()
    guard.check()
    guard.require()
    assert heard == [None]
