"""Logins of Flower and the exporter: from a setting or a file (the file wins), never served to a network
without one, and a header is accepted only with a listed pair."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from croqq.errors import ConfigError
from croqq.processes.webauth import Logins, is_loopback, local_url, logins, require_logins
from croqq.settings import Settings


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_variable_gives_every_pair() -> None:
    found = logins(Settings(flower_basic_auth="ops:s3cret,viewer:pw:with:colons"), "flower")  # type: ignore[arg-type]
    assert found.pairs == (("ops", "s3cret"), ("viewer", "pw:with:colons"))
    assert found.as_flower_option() == "ops:s3cret,viewer:pw:with:colons"


def test_the_file_wins_over_the_variable(tmp_path: Path) -> None:
    secret = tmp_path / "flower-auth"
    secret.write_text("fromfile:pw\n")
    settings = Settings(flower_basic_auth="fromvar:pw", flower_basic_auth_file=secret)  # type: ignore[arg-type]
    assert logins(settings, "flower").pairs == (("fromfile", "pw"),)


def test_each_service_reads_its_own_setting() -> None:
    settings = Settings(flower_basic_auth="a:b")  # type: ignore[arg-type]
    assert logins(settings, "flower") and not logins(settings, "exporter")


def test_an_unreadable_file_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    with pytest.raises(ConfigError) as err:
        logins(Settings(flower_basic_auth_file=missing), "flower")
    line = str(err.value)
    assert line == f"CROQQ_FLOWER_BASIC_AUTH_FILE={missing}: cannot read it (No such file or directory)"


def test_a_file_without_a_password_is_one_line_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "auth"
    bad.write_text("justauser\n")
    with pytest.raises(ConfigError) as err:
        logins(Settings(exporter_basic_auth_file=bad), "exporter")
    assert f"CROQQ_EXPORTER_BASIC_AUTH_FILE={bad}" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_served_without_logins(address: str) -> None:
    assert is_loopback(address)
    assert not require_logins(Settings(), "flower", address)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.1.2.3", "flower.internal", ""])
def test_any_other_address_needs_a_login(address: str) -> None:
    assert not is_loopback(address)
    with pytest.raises(ConfigError, match=r"refusing to serve flower on .* set CROQQ_FLOWER_BASIC_AUTH="):
        require_logins(Settings(), "flower", address)
    assert require_logins(Settings(flower_basic_auth="a:b"), "flower", address)  # type: ignore[arg-type]


def test_allows_only_a_listed_pair() -> None:
    found = Logins((("ops", "s3cret"), ("viewer", "pw")))
    assert found.allows(header("ops", "s3cret")) and found.allows(header("viewer", "pw"))
    assert not found.allows(header("ops", "pw"))  # a password of another user
    assert not found.allows(header("ops", "s3cret!"))
    assert not found.allows(header("", ""))
    assert not found.allows(None) and not found.allows("")
    assert not found.allows("Bearer " + header("ops", "s3cret")[6:])
    assert not found.allows("Basic not-base64!")
    assert not found.allows("Basic " + base64.b64encode(b"\xff\xfe").decode())  # not UTF-8


def test_a_header_with_non_ascii_credentials_is_refused_not_an_error() -> None:
    found = Logins((("ops", "s3cret"),))
    assert not found.allows(header("öps", "s3cret")) and not found.allows(header("ops", "sécret"))
    assert Logins((("öps", "sécret"),)).allows(header("öps", "sécret"))


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:9808"),  # a wildcard is reached through loopback
        ("::", "http://127.0.0.1:9808"),
        ("10.0.0.5", "http://10.0.0.5:9808"),  # one interface: only there
        ("::1", "http://[::1]:9808"),
        ("localhost", "http://localhost:9808"),
    ],
)
def test_the_local_url_of_a_listening_address(address: str, url: str) -> None:
    assert local_url(address, 9808) == url
