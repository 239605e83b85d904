"""Progress of a long report on stderr: a Rich bar on a terminal; without one (a pipe, CI, nohup) one
line per ``every_s`` (``croqq report: reading shapes 120/268, 4 s``), none at all for a report that is
done sooner, so a short run's stderr holds nothing but its errors."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

EVERY_S = 5.0


class Ticker(Protocol):
    def __call__(self) -> None: ...


class _Lines:
    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.started = time.monotonic()
        self.last = self.started

    @contextmanager
    def stage(self, name: str, total: int) -> Iterator[Ticker]:
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            now = time.monotonic()
            if now - self.last >= self.every_s:
                self.last = now
                print(f"croqq report: {name} {done}/{total}, {now - self.started:.0f} s", file=sys.stderr)

        yield tick


class _Bar:
    def __init__(self, progress: Any) -> None:
        self.progress = progress

    @contextmanager
    def stage(self, name: str, total: int) -> Iterator[Ticker]:
        task = self.progress.add_task(name, total=total)
        yield lambda: self.progress.advance(task)
        self.progress.remove_task(task)


Progress = _Lines | _Bar


@contextmanager
def progress(every_s: float = EVERY_S) -> Iterator[Progress]:
    """Stages with ticks: ``with progress() as p, p.stage("reading shapes", n) as tick: ... tick()``."""
    if not sys.stderr.isatty():
        yield _Lines(every_s)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        yield _Bar(bar)
