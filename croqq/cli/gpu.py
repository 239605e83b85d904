"""`croqq gpu release UUID`: an operator ends a GPU's quarantine at once (no cool-down, no re-check)."""

from __future__ import annotations

import typer

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.errors import ConfigError, CroqqError

gpu_app = typer.Typer(help="Manage the cluster's GPUs.", no_args_is_help=True)
app.add_typer(gpu_app, name="gpu")


@gpu_app.command()
def release(uuid: str = typer.Argument(..., help="The GPU's UUID, as `croqq status` shows it.")) -> None:
    """Put a quarantined GPU back in service now and give it shapes. Fix the cause first: a GPU that is
    still unhealthy is quarantined again by its next measurement."""
    from croqq.delivery import keys
    from croqq.delivery.redis_client import connect, require_redis
    from croqq.placement import registry
    from croqq.processes.runtime import Runtime

    settings = load_settings()
    require_redis(settings)
    client = connect(settings)
    gpu = registry.get_gpu(client, uuid)
    if gpu is None:
        uuids = [g.uuid for g in registry.all_gpus(client)]
        known = ", ".join(uuids[:8]) + (f" ... ({len(uuids)} in all)" if len(uuids) > 8 else "")
        raise ConfigError(f"no GPU {uuid!r} in the registry (known: {known or 'none'})")
    if gpu.status == registry.HEALTHY:
        typer.echo(f"GPU {uuid} is not quarantined (healthy): nothing to do")
        return
    if gpu.status != registry.QUARANTINED:
        raise ConfigError(f"GPU {uuid} is {gpu.status}, not quarantined: start its worker (`croqq worker`)")
    served = bool(client.exists(keys.lease(f"gpu:{uuid}")))
    # with no worker serving it, the GPU gets its shapes when its worker starts
    lifted = Runtime(settings).placement.lift(uuid) if served else registry.lift_quarantine(client, uuid)
    if not lifted:  # someone else changed it meanwhile
        now = registry.get_gpu(client, uuid)
        raise CroqqError(f"GPU {uuid} is no longer quarantined (now {now.status if now else 'unregistered'})")
    typer.echo(f"released GPU {uuid} from quarantine ({gpu.reason}); it is healthy again")
    if served:
        typer.echo(f"GPU {uuid} now holds {client.scard(keys.active(uuid))} shape(s)")
    else:
        typer.echo(f"no worker serves GPU {uuid} now: it gets shapes when its worker starts")
