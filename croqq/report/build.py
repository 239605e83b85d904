"""`croqq report`: check the input, read the repo, draw, and publish ``<out>/index.html`` atomically.

Bad input is refused before anything slow, in one line (``ConfigError``: exit 2; an empty repo is a
``CroqqError``: exit 1): a folder that is not a results repo, a ``--gpu``/``--dsl``/``--dtype``/``--key``
it does not hold, an ``--out`` that cannot be written or that holds something other than a report.

Nothing half-written: the page is written into a temporary folder beside ``--out`` (same file system),
then renamed into place; an existing report is first renamed aside and deleted only once the new one is
in place. Any error before that removes the temporary folder and leaves the old report (or nothing).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from croqq.domain.manifest import Manifest
from croqq.errors import ConfigError, CroqqError
from croqq.report import sections
from croqq.report.html import page
from croqq.report.model import RepoData, Selection, open_repo, read_repo, select_runs
from croqq.report.progress import Progress, progress

INDEX = "index.html"
REPORT_FILES = {INDEX}


@dataclass(frozen=True)
class Options:
    repo: Path
    out: Path
    branch: str
    manifest: Manifest
    selection: Selection = field(default_factory=Selection)
    top: int = 6


@dataclass(frozen=True)
class Result:
    index: Path
    shapes: int
    iterations: int
    figures: int
    seconds: float


def _check_dtype(manifest: Manifest, dtype: str | None) -> None:
    if dtype is not None and dtype not in manifest.dtypes:
        raise ConfigError(f"--dtype {dtype!r}: unknown dtype; the manifest has {'|'.join(manifest.dtypes)}")


def _temp_beside(out: Path) -> Path:
    """An empty folder next to ``out`` for the new report; ConfigError when ``out`` cannot be written."""
    out = out.absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and not {p.name for p in out.iterdir()} <= REPORT_FILES:
        raise ConfigError(f"--out {out}: holds files other than a croqq report; give a new or empty folder")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: folder {out.parent} does not exist")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.croqq-tmp-", dir=out.parent))
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write in {out.parent} ({exc.strerror})") from None
    tmp.chmod(0o755)
    return tmp


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``, replacing an old report only once the new one is there."""
    out = out.absolute()
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.croqq-old-", dir=out.parent))
    os.rename(out, old / "report")
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old / "report", out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _render(opts: Options, data: RepoData, started: float, p: Progress) -> tuple[str, int]:
    sel = opts.selection
    parts = [
        (sections.summary(data, opts.manifest), []),
        sections.sweeps(data, opts.manifest),
        sections.shapes(data, sel.keys, opts.top),
        sections.outcomes(data, opts.manifest),
        sections.gpu_duty(data),
    ]
    jobs = [job for _, section_jobs in parts for job in section_jobs]
    with p.stage("drawing figures", len(jobs)) as tick:
        for job in jobs:
            job.run()
            tick()
    filters = [f"--{name} {value}" for name in ("gpu", "dsl", "dtype") if (value := getattr(sel, name))]
    meta = [
        ("repo", str(data.path.absolute())),
        ("branch, commit", f"{opts.branch} {data.commit}"),
        ("generated", datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("generation time", f"{time.perf_counter() - started:.1f} s"),
        ("shapes, iterations", f"{len(data.shapes())} shapes, {data.iterations()} iterations"),
        ("selection", " ".join(filters) or "everything"),
    ]
    body = [section for section, _ in parts] + [sections.shape_table(data), sections.imported_history(data)]
    return page("croqq report", meta, body), len(jobs)


def build(opts: Options) -> Result:
    started = time.perf_counter()
    sel = opts.selection
    _check_dtype(opts.manifest, sel.dtype)
    repo = open_repo(opts.repo, opts.branch)
    runs = select_runs(repo, sel)
    total = sum(len(keys) for _, _, keys in runs)
    what = f" for dtype {sel.dtype}" if sel.dtype else ""
    if total == 0:
        raise CroqqError(f"{opts.repo}: no stored iteration{what} yet; nothing to report")
    tmp = _temp_beside(opts.out)
    try:
        with progress() as p:
            with p.stage("reading shapes", total) as tick:
                data = read_repo(repo, runs, sel, tick)
            if not data.shapes():
                raise CroqqError(f"{opts.repo}: no stored iteration{what} yet; nothing to report")
            text, figures = _render(opts, data, started, p)
        (tmp / INDEX).write_text(text, encoding="utf-8")
        _publish(tmp, opts.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Result(
        opts.out / INDEX, len(data.shapes()), data.iterations(), figures, time.perf_counter() - started
    )
