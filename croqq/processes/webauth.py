"""Logins of croqq's web endpoints (Flower, the exporter): HTTP basic auth from a setting or a file, and
the rule that keeps them from being served to a network without one.

An address is loopback when it names this machine only (127.0.0.0/8, ::1, localhost); anything else
(0.0.0.0, a pod or host address) needs credentials, or the command refuses to start.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
from dataclasses import dataclass

from croqq.errors import ConfigError
from croqq.settings import Settings, check_basic_auth


@dataclass(frozen=True)
class Logins:
    """The accepted (user, password) pairs; empty: no authentication."""

    pairs: tuple[tuple[str, str], ...]

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def as_flower_option(self) -> str:
        return ",".join(f"{u}:{p}" for u, p in self.pairs)

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries one of the pairs (compared in constant time)."""
        if not authorization or not authorization.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(authorization[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        given = (user.encode(), password.encode())  # bytes: compare_digest refuses non-ASCII text
        return any(
            hmac.compare_digest(given[0], u.encode()) & hmac.compare_digest(given[1], p.encode())
            for u, p in self.pairs  # & : no short circuit
        )


def logins(settings: Settings, service: str) -> Logins:
    """The logins of ``service`` (``flower`` | ``exporter``): its file setting wins over its variable."""
    var = f"CROQQ_{service.upper()}_BASIC_AUTH"
    path = getattr(settings, f"{service}_basic_auth_file")
    if path is not None and str(path) not in ("", "."):
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{var}_FILE={path}: cannot read it ({exc.strerror})") from exc
        return Logins(tuple(check_basic_auth(text, f"{var}_FILE={path}")))
    secret = getattr(settings, f"{service}_basic_auth")
    if secret is None:
        return Logins(())
    return Logins(tuple(check_basic_auth(secret.get_secret_value(), var)))


def is_loopback(address: str) -> bool:
    if address in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def local_url(address: str, port: int) -> str:
    """Where this host reaches a server listening on ``address`` (a wildcard: through loopback)."""
    host = "127.0.0.1" if address in ("", "0.0.0.0", "::") else address
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def require_logins(settings: Settings, service: str, address: str) -> Logins:
    """The service's logins; ConfigError when it would listen beyond this machine without any."""
    found = logins(settings, service)
    if not found and not is_loopback(address):
        var = f"CROQQ_{service.upper()}_BASIC_AUTH"
        raise ConfigError(
            f"refusing to serve {service} on {address} without a login: set {var}=user:password "
            f"(or {var}_FILE), or listen on 127.0.0.1"
        )
    return found
