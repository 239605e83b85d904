"""Flower against a running cluster, looked at as an operator would: behind its login (pages and API), its
worker list naming every worker of the fleet, and the cluster's tasks on its tasks page."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from croqq.patience import wait_until
from croqq.placement import registry
from croqq.processes.boot import host_name
from croqq.processes.local import LocalCluster
from croqq.processes.naming import gpu_node
from tests.browser import Browser, browser  # noqa: F401
from tests.ports import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "ops", "flower-test-pw"
AUTH = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def get(url: str, authorization: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, b""
    except urllib.error.URLError:
        return 0, b""  # not listening (yet)


@pytest.fixture
def fleet(
    cluster_env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[LocalCluster, str, subprocess.Popen[bytes]]]:
    """A running cluster that has tuned one shape, and `croqq flower` on it (logins from the setting)."""
    with LocalCluster(cluster_env | {"CROQQ_TIME_SCALE": "0.01"}) as cluster:
        port = free_port()
        env = {**os.environ, **cluster.env, "CROQQ_FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"}
        with (tmp_path / "flower.log").open("wb") as log:
            flower = subprocess.Popen(
                [sys.executable, "-m", "croqq", "flower", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: get(f"{url}/healthcheck")[0] == 200, 180, "Flower answers", every_s=0.5)
            cluster.wait_gpus()
            cluster.wait_done(cluster.submit("f16", max_iter=2, limit=1), timeout_s=300)
            yield cluster, url, flower
        finally:
            flower.terminate()
            flower.wait(timeout=60)


def expected_workers(cluster: LocalCluster) -> set[str]:
    host = host_name()
    gpus = {f"{gpu_node(g.index, g.uuid)}@{host}" for g in registry.all_gpus(cluster.client)}
    return gpus | {f"{role}@{host}" for role in ("coordinator", "writer", "build", "ideate")}


def listed(browser: Browser, names: set[str]) -> set[str]:  # noqa: F811
    """The ``names`` on the page (a narrow column wraps a long name over lines)."""
    page = "".join(browser.text().split())
    return {name for name in names if name in page}


@pytest.mark.timeout(1800)  # with its fixture: Flower up, a cluster run, then the waits below
def test_flower_needs_its_login_on_pages_api_and_metrics_and_shows_it_on_no_command_line(
    fleet: tuple[LocalCluster, str, subprocess.Popen[bytes]],
) -> None:
    cluster, url, flower = fleet
    for path in ("/", "/workers", "/tasks", "/api/workers", "/metrics"):
        assert get(url + path)[0] == 401, path
        assert get(url + path, "Basic " + base64.b64encode(b"ops:wrong").decode())[0] == 401, path
    want = expected_workers(cluster)

    def api_lists_them() -> bool:  # Flower's API works with the same login
        status, body = get(f"{url}/api/workers?refresh=1", AUTH)
        return status == 200 and want <= set(json.loads(body))

    wait_until(api_lists_them, 180, f"/api/workers lists {sorted(want)}", every_s=0.5)
    assert get(f"{url}/metrics", AUTH)[0] == 200 and get(f"{url}/healthcheck")[0] == 200
    cmdline = Path(f"/proc/{flower.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in cmdline and b"flower" in cmdline


@pytest.mark.timeout(1800)
def test_flower_lists_every_worker_by_name_and_their_tasks_in_a_browser(
    fleet: tuple[LocalCluster, str, subprocess.Popen[bytes]],
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    cluster, url, _ = fleet
    browser.driver.execute_cdp_cmd("Network.enable", {})
    browser.driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": AUTH}})
    browser.open(f"{url}/workers")
    want = expected_workers(cluster)
    assert len([w for w in want if w.startswith("gpu-")]) == 2
    try:
        wait_until(lambda: want <= listed(browser, want), 180, f"Flower lists {sorted(want)}", every_s=0.5)
    finally:
        shot = browser.screenshot(tmp_path / "flower-workers.png")
        print(f"screenshot {shot}; the page read: {browser.text()[:500]!r}")
    assert shot.stat().st_size > 10_000
    images = browser.images()
    assert all(image["ok"] for image in images), images
    browser.open(f"{url}/tasks")
    wait_until(lambda: "croqq." in browser.text(), 180, "a croqq task on the tasks page", every_s=0.5)
    browser.screenshot(tmp_path / "flower-tasks.png")
