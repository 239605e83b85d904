"""croqq patches or reads a few private internals of kombu and Flower. Each module that does names them
and the version range it was checked on; these tests fail, saying what to re-check, when the installed
version leaves that range or an assumed internal is gone."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from types import ModuleType, SimpleNamespace

import pytest

from croqq.delivery import transport
from croqq.monitor import metrics
from croqq.processes import flower

PINS = [  # (module, distribution, its (lowest, first unchecked) versions, the internals it relies on)
    (transport, "kombu", transport.KOMBU_CHECKED, transport.KOMBU_INTERNALS),
    (metrics, "kombu", metrics.KOMBU_CHECKED, metrics.KOMBU_INTERNALS),
    (flower, "flower", flower.FLOWER_CHECKED, flower.FLOWER_INTERNALS),
]
IDS = [f"{module.__name__}:{dist}" for module, dist, _, _ in PINS]


def release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version string (``5.7.0rc1`` -> (5, 7, 0))."""
    found = re.match(r"\d+(\.\d+)*", version)
    assert found, f"not a version: {version!r}"
    return tuple(int(part) for part in found.group().split("."))


def resolve(internal: str) -> object:
    """``package.module:Attr.attr`` -> the object (AttributeError or ImportError when gone)."""
    module_name, _, path = internal.partition(":")
    found: object = importlib.import_module(module_name)
    for name in path.split("."):
        found = getattr(found, name)
    return found


def installed(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed (pip install 'croqq[flower]' for Flower)")


@pytest.mark.parametrize(("module", "dist", "checked", "internals"), PINS, ids=IDS)
def test_the_installed_version_is_one_the_internals_were_checked_on(
    module: ModuleType, dist: str, checked: tuple[str, str], internals: tuple[str, ...]
) -> None:
    version = installed(dist)
    low, high = checked
    assert release(low) <= release(version) < release(high), (
        f"{module.__name__} relies on {dist} internals checked on {low} <= {dist} < {high}, and {dist} "
        f"{version} is installed: re-check {', '.join(internals)} against {dist} {version}'s source "
        f"and run the tests that use it (grep -rl {module.__name__} tests), then widen the range there"
    )


@pytest.mark.parametrize(("module", "dist", "checked", "internals"), PINS, ids=IDS)
def test_every_assumed_internal_is_there(
    module: ModuleType, dist: str, checked: tuple[str, str], internals: tuple[str, ...]
) -> None:
    installed(dist)
    for internal in internals:
        try:
            resolve(internal)
        except (ImportError, AttributeError) as exc:
            pytest.fail(
                f"{module.__name__} relies on {internal}, which {dist} {installed(dist)} no longer has "
                f"({exc}): rework {module.__file__} for it"
            )


def test_kombu_keeps_a_queue_as_one_list_per_priority_step() -> None:
    from kombu.transport.redis import PRIORITY_STEPS, Channel

    channel = SimpleNamespace(sep=Channel.sep, priority=lambda step: step)
    lists = [Channel._q_for_pri(channel, "q", step) for step in PRIORITY_STEPS]
    assert lists == metrics.broker_lists("q"), (
        "kombu names a queue's priority lists differently now: re-check croqq/monitor/metrics.py broker_lists"
    )


def test_kombu_builds_a_client_per_call_through_create_client() -> None:
    """The transport overrides ``_create_client(asynchronous=...)``: kombu must still call it that way."""
    from kombu.transport import _transport_cache
    from kombu.transport.redis import Channel

    assert isinstance(_transport_cache, dict)
    assert "asynchronous" in Channel._create_client.__code__.co_varnames, (
        "kombu's Channel._create_client lost its `asynchronous` argument: "
        "re-check croqq/delivery/transport.py"
    )


def test_flower_metrics_is_a_handler_tornado_can_put_behind_flower_logins() -> None:
    pytest.importorskip("flower")
    from flower.views import BaseHandler
    from flower.views.monitor import Metrics

    assert issubclass(Metrics, BaseHandler), (
        "Flower's Metrics handler no longer uses Flower's login check: re-check croqq/processes/flower.py"
    )
