"""`croqq status [--watch]`: shapes done/active/pending per dtype, throughput, ETA, and each GPU's step."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.live import Live

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.cli.view import render


@app.command()
def status(
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    submission: str | None = typer.Option(
        None, "--submission", help="Only this submission ('latest' for the newest)."
    ),
    every: float = typer.Option(1.0, "--every", min=0.1, help="Refresh period in seconds with --watch."),
) -> None:
    """Show where the cluster stands."""
    from croqq.delivery.redis_client import connect, require_redis
    from croqq.work.progress import RateMeter, snapshot, submission_sids

    settings = load_settings()
    require_redis(settings)
    client = connect(settings)
    sids = submission_sids(client, submission)
    meter = RateMeter()
    snap = snapshot(client, sids)
    meter.add(snap)
    if not watch:
        Console().print(render(snap, None))
        return
    with Live(render(snap, meter), refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(every)
                snap = snapshot(client, sids)
                meter.add(snap)
                live.update(render(snap, meter))
        except KeyboardInterrupt:
            pass
