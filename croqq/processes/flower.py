"""Flower in this process, set up for a croqq fleet.

- **Logins** come from :func:`croqq.processes.webauth.require_logins` (``CROQQ_FLOWER_BASIC_AUTH`` or the
  file named by ``CROQQ_FLOWER_BASIC_AUTH_FILE``); a non-loopback address without one is refused. They reach
  Flower as an argument of its in-process command (``celery_app.start(argv)``), so they appear on no
  command line (``/proc/<pid>/cmdline`` stays ``croqq flower --port ...``) and in no environment variable.
  With logins, Flower's HTTP API (``/api/...``) takes the same ones (Flower 2 answers 401 on its API when it
  has no authentication at all, unless ``FLOWER_UNAUTHENTICATED_API`` is set).
- **Events**: croqq's workers send task events and event heartbeats by the ``CROQQ_TASK_EVENTS`` setting
  (on by default). Flower would otherwise broadcast ``enable_events`` to every worker every 5 s and so
  overrule an operator who turned them off; croqq's Flower never does (``--enable_events=False``).
- **/metrics** (Flower's Prometheus text) asks for the same logins as every page when there are logins
  (Flower serves it to anyone); ``/healthcheck`` stays open for probes.
- **Read-only** unless ``--controls``: Flower's buttons can shut workers down, revoke tasks and resize a
  pool, and a GPU worker's pool grown past one runs two measurements on one GPU.
- **Offline workers** leave Flower's worker list once offline for as long as croqq's registry keeps a silent
  worker (``--purge_offline_workers``, one lease TTL), instead of lingering until Flower restarts.
"""

from __future__ import annotations

import math

from croqq.errors import ConfigError
from croqq.processes.webauth import Logins, local_url
from croqq.settings import Settings

# Flower internals this module relies on (its /metrics handler class, wrapped with tornado's login check),
# checked on flower >= 2.2, < 2.3 (tests/unit/test_third_party_pins.py)
FLOWER_CHECKED = ("2.2", "2.3")
FLOWER_INTERNALS = ("flower.views.monitor:Metrics.get", "flower.views:BaseHandler.get_current_user")


def flower_argv(
    settings: Settings, port: int, address: str, logins: Logins, read_only: bool = False
) -> list[str]:
    """Flower's arguments (in-process only: they may carry passwords)."""
    argv = [
        "flower",
        f"--port={port}",
        f"--address={address}",
        "--enable_events=False",
        f"--purge_offline_workers={max(1, math.ceil(settings.lease_ttl_s))}",
    ]
    if logins:
        argv.append(f"--basic_auth={logins.as_flower_option()}")
    if read_only:
        argv.append("--read_only=True")
    return argv


def run_flower(settings: Settings, port: int, address: str, logins: Logins, read_only: bool = False) -> None:
    """Serve Flower until interrupted (its health beat checks that ``/healthcheck`` answers)."""
    try:
        import flower  # noqa: F401
    except ImportError as exc:
        raise ConfigError("Flower is not installed; pip install 'croqq[flower]'") from exc
    from croqq.processes import health as hc
    from croqq.processes.app import app as celery_app
    from croqq.processes.boot import host_name

    if logins:
        _metrics_need_login()
    serves = lambda: hc.http_problems(f"{local_url(address, port)}/healthcheck")  # noqa: E731
    hc.start_heartbeat(settings, hc.Reporter(settings, "flower", f"flower@{host_name()}", problems=serves))
    celery_app.start(flower_argv(settings, port, address, logins, read_only))


def _metrics_need_login() -> None:
    """Flower's /metrics handler behind Flower's own login check (this process serves only Flower)."""
    from flower.views.monitor import Metrics
    from tornado import web

    if not getattr(Metrics.get, "__wrapped__", None):
        Metrics.get = web.authenticated(Metrics.get)
