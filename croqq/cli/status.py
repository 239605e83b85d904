"""`croqq status [--watch]`: shapes done/active/pending per dtype, throughput, ETA, and each GPU's step."""

from __future__ import annotations

import time

import typer
from rich.console import Console

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.cli.view import render


@app.command()
def status(
    watch: bool = typer.Option(
        False,
        "--watch",
        "-w",
        help="Refresh until Ctrl-C. Without a terminal (a pipe, a log): one progress line every "
        "CROQQ_PROGRESS_EVERY_S seconds instead (or --every).",
    ),
    submission: str | None = typer.Option(
        None, "--submission", help="Only this submission ('latest' for the newest)."
    ),
    every: float | None = typer.Option(
        None, "--every", min=0.1, help="Refresh period in seconds with --watch (default 1; no terminal: 10)."
    ),
) -> None:
    """Show where the cluster stands."""
    import redis

    from croqq.cli.live import LiveProgress, stop_on_signals
    from croqq.delivery.redis_client import make_client, redis_url, require_redis
    from croqq.work.progress import RateMeter, snapshot, submission_sids

    settings = load_settings()
    require_redis(settings)
    client = make_client(redis_url(settings), settings, retries=3)  # a watcher says when Redis is gone
    sids = submission_sids(client, submission)
    meter = RateMeter()
    snap = snapshot(client, sids)
    meter.add(snap)
    console = Console()
    if not watch:
        console.print(render(snap, None))
        return
    period = every or (1.0 if console.is_terminal else settings.progress_every_s)
    stop_on_signals()
    with LiveProgress(console, every_s=period) as progress:
        try:
            progress.update(snap, meter)
            while True:
                time.sleep(period)
                try:
                    snap = snapshot(client, sids)
                except redis.ConnectionError as exc:  # keep watching: it may come back (a restart)
                    console.print(f"croqq: Redis unreachable ({exc}); still trying", soft_wrap=True)
                    continue
                meter.add(snap)
                progress.update(snap, meter)
        except KeyboardInterrupt:
            pass
