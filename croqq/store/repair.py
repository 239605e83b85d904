"""Repairing a damaged results repo from the remote it pushes to (``croqq repo repair``).

1. Every damaged file that :class:`croqq.store.integrity.RepoCheck` finds (packs, loose objects, ref
   files) moves to ``<gitdir>/croqq-quarantine/<time>/``: nothing is deleted.
2. The objects of a quarantined pack that are still intact go back into the repo (``git
   unpack-objects -r``, git's own salvage), so what was never pushed survives where it can.
3. The remote's branch is fetched into a scratch repo and its packs are copied in. (A fetch into the
   damaged repo itself would not do: git does not fetch what the repo's refs claim to have.)
4. The branch stays where it is when its whole history is readable again; otherwise it moves to the
   remote's tip, and the commits after the last push are lost from git. Their iterations are not lost
   for good: croqq's reconciliation (git is the truth) sees the live state ahead of the repo and runs
   them again.
5. ``git fsck`` must then be clean.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from croqq.errors import ConfigError, CroqqError
from croqq.store.integrity import RepoCheck

log = logging.getLogger(__name__)

QUARANTINE = "croqq-quarantine"
GIT_TIMEOUT_S = 600.0


class RepairError(CroqqError):
    """The repo could not be brought back to an intact state; the message says why."""


@dataclass
class RepairReport:
    quarantined: list[str] = field(default_factory=list)  # files moved aside (relative to the gitdir)
    salvaged: int = 0  # packs whose intact objects were put back
    fetched: str = ""  # the remote's tip
    before: str = ""  # the branch's value before (may be unreadable)
    after: str = ""  # the branch's tip after
    lost_commits: int | None = None  # 0 when the branch kept its tip; None: unknown
    lines: list[str] = field(default_factory=list)  # what happened, for the operator


def _git(repo: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, timeout=GIT_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"]
        raise RepairError(f"git {args[0]} in {repo}: {why[-1]}")
    return done.stdout.decode(errors="replace").strip()


def _connected(path: Path, tip: str) -> bool:
    """Every object reachable from ``tip`` is there (the damaged files are gone, so: readable)."""
    done = subprocess.run(
        ["git", "-C", str(path), "rev-list", "--objects", "--quiet", tip],
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    return done.returncode == 0


def _quarantine(path: Path, gitdir: Path, branch: str, report: RepairReport) -> list[Path]:
    """Move every damaged file aside; returns the packs moved."""
    folder = gitdir / QUARANTINE / time.strftime("%Y%m%dT%H%M%S")
    packs = []
    for damage in RepoCheck(path, branch, recheck_bytes=0).run():
        log.warning("%s", damage.line)
        report.lines.append(damage.line)
        if damage.path is None or not damage.path.exists():
            continue
        moving = [damage.path]
        if damage.path.suffix in (".pack", ".idx"):
            moving = list(damage.path.parent.glob(damage.path.stem + ".*"))
            packs.append(folder / damage.path.with_suffix(".pack").relative_to(gitdir))
        for file in moving:
            target = folder / file.relative_to(gitdir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(file), target)
            report.quarantined.append(file.relative_to(gitdir).as_posix())
    return [p for p in packs if p.exists()]


def _salvage(path: Path, packs: list[Path], report: RepairReport) -> None:
    for pack in packs:
        _git(path, "unpack-objects", "-q", "-r", stdin=pack.read_bytes(), check=False)
        report.salvaged += 1


def _fetch(path: Path, gitdir: Path, remote: str, branch: str) -> str:
    """Copy the remote branch's objects in (as packs); returns its tip."""
    with tempfile.TemporaryDirectory(prefix="croqq-refetch-", dir=gitdir) as scratch:
        tmp = Path(scratch)
        _git(tmp, "init", "-q", "--bare")
        _git(tmp, "fetch", "-q", "--no-tags", remote, f"+refs/heads/{branch}:refs/heads/{branch}")
        tip = _git(tmp, "rev-parse", f"refs/heads/{branch}")
        _git(tmp, "repack", "-a", "-d", "-q")
        for file in (tmp / "objects" / "pack").glob("pack-*"):
            target = gitdir / "objects" / "pack" / file.name
            if not target.exists():
                shutil.copyfile(file, target.with_name(target.name + ".tmp"))
                target.with_name(target.name + ".tmp").rename(target)
    return tip


def _branch_value(gitdir: Path, branch: str) -> str:
    ref = gitdir / "refs" / "heads" / branch
    if ref.exists():
        return ref.read_text(errors="replace").strip()
    packed = gitdir / "packed-refs"
    for line in packed.read_text().splitlines() if packed.exists() else []:
        if line.endswith(f" refs/heads/{branch}"):
            return line.split(" ", 1)[0]
    return ""


def _readable_tip(path: Path, value: str) -> str:
    """The commit the old ref names, when its whole history is readable: a ref truncated after at least 7
    hex digits still names its commit when that prefix is unique; '' when there is none."""
    if len(value) < 7 or any(c not in "0123456789abcdef" for c in value):
        return ""
    tip = _git(path, "rev-parse", "--verify", "--quiet", f"{value}^{{commit}}", check=False)
    return tip if tip and _connected(path, tip) else ""


def repair(path: Path, branch: str, remote: str) -> RepairReport:
    """Repair the repo at ``path`` from ``remote`` (see the module docstring); the caller holds the writer
    lock. Raises RepairError when the repo cannot be brought back."""
    gitdir = Path(_git(path, "rev-parse", "--absolute-git-dir"))
    report = RepairReport(before=_branch_value(gitdir, branch))
    packs = _quarantine(path, gitdir, branch, report)
    _salvage(path, packs, report)
    if remote:
        try:
            report.fetched = _fetch(path, gitdir, remote, branch)
        except RepairError as exc:
            if not _readable_tip(path, report.before):
                raise
            report.lines.append(f"could not fetch from {remote} ({exc}); the local history is readable")
    local = _readable_tip(path, report.before)  # with what the remote gave back
    if not local and not report.fetched:
        raise ConfigError("no remote to repair from: pass --from REMOTE or set CROQQ_RESULTS_REMOTE")
    if local:
        report.after, report.lost_commits = local, 0
        report.lines.append(f"refs/heads/{branch} at {local}: its whole history is readable")
    else:
        report.after = report.fetched
        report.lines.append(
            f"refs/heads/{branch} moved to the remote's {report.fetched}: the commits made after the last "
            "push are gone from git; the writer's reconciliation runs their iterations again"
        )
    if report.after != report.before:
        (gitdir / "refs" / "heads" / branch).unlink(missing_ok=True)
        _git(path, "update-ref", f"refs/heads/{branch}", report.after)
    problems = RepoCheck(path, branch, recheck_bytes=0).run()
    fsck = fsck_lines(path)
    if problems or fsck:
        first = problems[0].line if problems else fsck[0]
        raise RepairError(f"the repo is still damaged after the repair: {first}")
    return report


def fsck_lines(path: Path) -> list[str]:
    """``git fsck --full`` over the whole history: its complaints (empty: clean)."""
    done = subprocess.run(
        ["git", "-C", str(path), "fsck", "--full", "--no-progress", "--no-dangling"],
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return lines or ([f"git fsck: exit {done.returncode}"] if done.returncode else [])
