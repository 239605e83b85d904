"""`croqq submit`: build the shape schedule, validate everything, then register it (idempotently)."""

from __future__ import annotations

import datetime as dt
import json
import secrets

import typer
from rich.console import Console
from rich.table import Table

from croqq.backends import backend_manifest, make_backend
from croqq.cli import app
from croqq.cli.common import CANDIDATES_HELP, candidates_or_default, load_settings
from croqq.domain.manifest import DEFAULT_MODE, Manifest
from croqq.domain.schedule import ScheduledShape, build_schedule, expand_dtypes
from croqq.domain.shapes import parse_dims
from croqq.errors import ConfigError
from croqq.placement import registry
from croqq.settings import Settings


def _dry_run(schedule: list[ScheduledShape], as_json: bool) -> None:
    if as_json:
        rows = [
            {
                "key": s.key,
                "dtype": s.dtype,
                "m": s.m,
                "n": s.n,
                "k": s.k,
                "scenarios": s.scenarios,
                "region": s.region,
                "rank": s.rank,
            }
            for s in schedule
        ]
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"schedule: {len(schedule)} shape(s)")
    for col in ("rank", "key", "region", "scenarios"):
        table.add_column(col)
    for s in schedule:
        table.add_row(str(s.rank), s.key, s.region, ",".join(s.scenarios))
    Console().print(table)


@app.command()
def submit(
    dtype: str = typer.Option(..., "--dtype", help="f16 | e4m3 | all (every dtype of the manifest)."),
    dsl: str | None = typer.Option(
        None,
        "--dsl",
        help="Kernel family (manifest 'dsls'); default CROQQ_DSL, else the mode's (manifest "
        "modes.<mode>.dsl: cutlass from the current best, cuda from scratch); replay with backend=replay.",
    ),
    shape: str | None = typer.Option(
        None, "--shape", help="Only this MxNxK (must pass the size constraints)."
    ),
    mode: str = typer.Option(
        DEFAULT_MODE,
        "--mode",
        help="from_current_best (30 iters from the reference kernel) | from_scratch (150 from the naive).",
    ),
    max_iter: int | None = typer.Option(
        None, "--max-iter", min=1, help="Override the mode's iteration count."
    ),
    candidates: int | None = typer.Option(None, "--candidates", help=CANDIDATES_HELP),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type, e.g. sm90_NVIDIA_H100_80GB_HBM3."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Only the first N shapes of the schedule (by priority)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the schedule; enqueue nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the schedule as a JSON list."),
    agent_calls: int | None = typer.Option(
        None, "--agent-calls", min=0, help="Budget: stop ideating after this many agent calls (0: no limit)."
    ),
    agent_usd: float | None = typer.Option(
        None, "--agent-usd", min=0.0, help="Budget: stop ideating once agents cost this much (0: no limit)."
    ),
) -> None:
    """Submit shapes for tuning: every shape of the scenarios (134 per dtype), highest priority first.

    Shapes already complete are skipped, active ones resume where they stopped, a 'done' shape with fewer
    iterations than asked is reopened. Nothing is enqueued if any argument is invalid.
    """
    settings = load_settings()
    count = candidates_or_default(candidates, settings)
    manifest = backend_manifest(settings)  # with backend=replay: plus the replay dsl
    dsl = manifest.family(dsl or settings.dsl, mode)
    dims = parse_dims(shape) if shape else None
    schedule = build_schedule(manifest, dtype, only=dims)[:limit]
    iterations = max_iter or manifest.mode(mode).max_iter
    spec = manifest.dsl(dsl)
    missing = [d for d in expand_dtypes(manifest, dtype) if d not in spec.kernels]
    if missing:
        raise ConfigError(f"dsl {dsl!r} has no kernel for dtype(s) {', '.join(missing)} in the manifest")
    make_backend(settings, manifest).check_dsl(dsl)  # e.g. the simulated GPU models the cuda family only
    if dry_run:
        _dry_run(schedule, as_json)
        return
    report = register(settings, manifest, schedule, dsl, mode, iterations, gpu, count)
    if agent_calls is not None or agent_usd is not None:
        from croqq.delivery.redis_client import connect
        from croqq.work.agents import set_budget

        set_budget(connect(settings), agent_calls, agent_usd)
    typer.echo(
        f"submitted {len(schedule)} shape(s) to {report['gpu_type']}/{dsl} as {report['submission']}: "
        f"{report['new']} new, {report['resumed']} resumed, {report['reopened']} reopened, "
        f"{report['skipped']} already complete"
        + (
            f", {report['parked']} parked (see `croqq status`; `croqq retry --errors` resumes them)"
            if report["parked"]
            else ""
        )
    )
    from croqq.delivery.redis_client import connect
    from croqq.work import intake

    if not intake.wait_recorded(connect(settings), str(report["submission"])):
        typer.echo(
            f"note: the writer has not recorded {report['submission']} in the results repo within "
            f"{intake.RECORD_WAIT_S:.0f}s (is `croqq writer` running?); until it does, the submission "
            "lives only in Redis",
            err=True,
        )


RECONCILE_WAIT_S = 30.0


def _wait_reconciled(settings: Settings) -> None:
    """After a Redis restart, restore or flush, wait (while a writer runs) until the writer has registered
    again what the results repo holds: only the writer has the repo, so a shape Redis forgot would
    otherwise be registered as new (the writer would still adopt its stored iterations, later)."""
    from croqq.delivery import keys
    from croqq.delivery.redis_client import connect
    from croqq.patience import wait_until
    from croqq.processes.runtime import get_runtime
    from croqq.work.housekeeping import ask_writer_to_reconcile
    from croqq.work.reconcile import redis_forgot

    client = connect(settings)
    if not redis_forgot(client) or not client.exists(keys.lease("writer")):
        return
    ask_writer_to_reconcile(get_runtime())
    try:
        wait_until(lambda: not redis_forgot(client), RECONCILE_WAIT_S, "the writer's reconcile", every_s=0.2)
    except TimeoutError as exc:
        typer.echo(
            f"note: {exc}; shapes Redis forgot are registered as new until it reconciles Redis with the "
            "results repo, then take their stored iterations",
            err=True,
        )


def register(
    settings: Settings,
    manifest: Manifest,
    schedule: list[ScheduledShape],
    dsl: str,
    mode: str,
    max_iter: int,
    gpu: str | None,
    candidates: int = 1,
) -> dict[str, object]:
    """Register a schedule with the cluster (in-process coordinator) and trigger GPU filling."""
    from croqq.delivery.messages import SubmitMessage
    from croqq.delivery.redis_client import require_redis
    from croqq.processes.runtime import Runtime

    require_redis(settings)
    gpu_type = registry.pick_gpu_type(settings, manifest, gpu)
    _wait_reconciled(settings)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    msg = SubmitMessage(
        submission=f"sub-{stamp}-{secrets.token_hex(3)}",
        gpu_type=gpu_type,
        dsl=dsl,
        mode=mode,
        max_iter=max_iter,
        candidates=candidates,
        shapes=schedule,
    )
    result = Runtime(settings).intake.submit(msg)
    return {
        "submission": msg.submission,
        "gpu_type": gpu_type,
        "new": len(result.new),
        "resumed": len(result.resumed),
        "reopened": len(result.reopened),
        "skipped": len(result.skipped),
        "parked": len(result.parked),
    }
