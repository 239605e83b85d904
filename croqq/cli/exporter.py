"""`croqq exporter`: the cluster's Prometheus metrics over HTTP (see croqq.monitor)."""

from __future__ import annotations

import typer

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.logs import configure


@app.command()
def exporter(
    port: int = typer.Option(9808, "--port", min=1, max=65535, help="TCP port to listen on."),
    address: str = typer.Option(
        "127.0.0.1",
        "--address",
        help="Interface to listen on. Anything but a loopback address needs CROQQ_EXPORTER_BASIC_AUTH "
        "(user:password[,...]) or CROQQ_EXPORTER_BASIC_AUTH_FILE.",
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG | INFO | WARNING | ERROR."),
) -> None:
    """Serve the cluster's Prometheus metrics at http://ADDRESS:PORT/metrics (text format), read from Redis
    at each scrape: queue lengths, shapes by status, iterations by decision, attempts, GPU state, duty and
    depth, lease expiries, quarantines, writer commit latency, repo size, agent calls, tokens and cost.
    Keeps no state: run any number. With logins set, /metrics needs HTTP basic auth; /healthz never does.
    `croqq health --role exporter` is its container probe."""
    from croqq.backends import backend_manifest
    from croqq.monitor.exporter import make_server_for, metrics_app
    from croqq.processes import health as hc
    from croqq.processes.boot import host_name
    from croqq.processes.webauth import local_url, require_logins

    configure(log_level)
    settings = load_settings()
    logins = require_logins(settings, "exporter", address)
    dsls = list(backend_manifest(settings).dsls)  # the build queue of each kernel family
    server = make_server_for(address, port, metrics_app(hc.quick_client(settings), logins, dsls))
    serves = lambda: hc.http_problems(f"{local_url(address, port)}/healthz")  # noqa: E731
    hc.start_heartbeat(
        settings, hc.Reporter(settings, "exporter", f"exporter@{host_name()}", problems=serves)
    )
    typer.echo(
        f"croqq exporter: metrics at http://{address}:{port}/metrics"
        f" ({'basic auth' if logins else 'no login: loopback only'})",
        err=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
