"""`croqq exporter`'s web server: ``/metrics`` in Prometheus's text format, ``/healthz``, HTTP basic auth.

``/metrics`` is prometheus-client's WSGI app over a registry holding only :class:`ClusterCollector`; with
logins set, every path but ``/healthz`` answers 401 (with ``WWW-Authenticate``) to a request without one
of them. ``/healthz`` answers 200 to anyone (it says nothing about the cluster): the exporter's heartbeat
probes it, so ``croqq health --role exporter --ready`` means "Redis reached and the server answers".
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

from croqq.errors import ConfigError
from croqq.monitor.metrics import ClusterCollector
from croqq.processes.webauth import Logins

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
HEALTH_PATH = "/healthz"


def _plain(
    start_response: Callable[..., Any], status: str, body: str, *headers: tuple[str, str]
) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers])
    return [body.encode()]


def metrics_app(client: redis.Redis, logins: Logins, dsls: Sequence[str] = ()) -> WsgiApp:
    """The exporter's WSGI application (``dsls``: the kernel families whose build queues it shows)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(client, dsls))
    metrics = make_wsgi_app(registry, disable_compression=False)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == HEALTH_PATH:
            return _plain(start_response, "200 OK", "ok\n")
        if logins and not logins.allows(environ.get("HTTP_AUTHORIZATION")):
            challenge = ("WWW-Authenticate", 'Basic realm="croqq exporter", charset="UTF-8"')
            return _plain(start_response, "401 Unauthorized", "login required\n", challenge)
        if path == "/metrics":
            return metrics(environ, start_response)
        return _plain(start_response, "404 Not Found", "croqq exporter: metrics are at /metrics\n")

    return app


class _QuietHandler(WSGIRequestHandler):
    """Requests are logged at DEBUG (a scrape every few seconds would flood the log at INFO)."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def make_server_for(address: str, port: int, app: WsgiApp) -> WSGIServer:
    """A threading WSGI server bound to ``address:port`` (IPv4 or IPv6); ConfigError when it cannot."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class Server(ThreadingWSGIServer):
            address_family = family

        return make_server(address, port, app, Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
