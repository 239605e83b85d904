"""`croqq retry KEY... | --errors`: resume parked shapes once the cause of their error is fixed."""

from __future__ import annotations

import typer

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.errors import ConfigError


@app.command()
def retry(
    keys_: list[str] = typer.Argument(
        None, metavar="[KEY]...", help="Shapes to resume, e.g. f16_4096x8192x8192."
    ),
    errors: bool = typer.Option(False, "--errors", help="Resume every parked shape."),
) -> None:
    """Resume parked shapes ('error' in `croqq status`): each waits for a GPU again and re-measures its best
    there first. Fix the cause first (the reason is in `croqq status`), or it parks again."""
    from croqq.delivery import keys
    from croqq.delivery.redis_client import connect, require_redis, strs
    from croqq.delivery.state import ShapeSummary, split_sid
    from croqq.processes.runtime import Runtime

    if bool(keys_) == errors:
        raise ConfigError("name the shapes to resume (croqq retry KEY...) or pass --errors, not both")
    settings = load_settings()
    require_redis(settings)
    client = connect(settings)
    raw = client.hgetall(keys.SUMMARY)
    summaries = {str(sid): ShapeSummary.model_validate_json(text) for sid, text in raw.items()}
    if errors:
        sids = sorted(sid for sid, s in summaries.items() if s.status == "error")
    else:
        by_key: dict[str, list[str]] = {}
        for sid in strs(client.smembers(keys.SHAPES)):
            by_key.setdefault(split_sid(sid)[2], []).append(sid)
        unknown = [k for k in keys_ if k not in by_key]
        if unknown:
            raise ConfigError(f"no submitted shape {', '.join(unknown)} (see `croqq status`)")
        sids = sorted(sid for k in keys_ for sid in by_key[k])
        healthy = [
            split_sid(s)[2] for s in sids if summaries.get(s) is None or summaries[s].status != "error"
        ]
        if healthy:
            raise ConfigError(f"{', '.join(healthy)} is not parked; only parked shapes can be resumed")
    resumed = Runtime(settings).intake.retry(sids)
    typer.echo(
        f"resumed {len(resumed)} parked shape(s)"
        + (f": {', '.join(split_sid(s)[2] for s in resumed)}" if resumed else "")
    )
