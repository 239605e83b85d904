"""Live progress of a long command: a Rich table redrawn in place on a terminal; anywhere else (a pipe,
CI, nohup) one progress line every ``every_s`` seconds, so a log shows the run advancing. A log file, when
given, gets the same line at the same pace in both cases."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.live import Live

from croqq.cli.view import progress_line, render
from croqq.work.progress import RateMeter, Snapshot


def stop_on_signals() -> None:
    """Ctrl-C and a supervisor's SIGTERM both raise KeyboardInterrupt, so a long command stops cleanly;
    also when it was started with SIGINT ignored (a background job of a script), which Python would keep."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)


class LiveProgress:
    def __init__(self, console: Console, every_s: float, log_path: Path | None = None) -> None:
        self.console, self.every_s, self.log_path = console, every_s, log_path
        self.started = time.monotonic()
        self.last_line = float("-inf")
        self.live: Live | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def update(self, snap: Snapshot, meter: RateMeter, title: str = "croqq", final: bool = False) -> None:
        if self.live is not None:
            self.live.update(render(snap, meter, title=title))
        now = time.monotonic()
        if not final and now - self.last_line < self.every_s:
            return
        self.last_line = now
        line = progress_line(snap, meter, self.elapsed_s)
        if self.live is None:
            self.console.print(line, highlight=False, soft_wrap=True)
        if self.log_path is not None:
            with self.log_path.open("a") as log:
                log.write(line + "\n")

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.live is not None:
            self.live.__exit__(kind, exc, tb)
