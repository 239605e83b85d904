"""The monitoring path end to end, with real parts: a real Prometheus (Debian's package) scrapes a real
`croqq exporter` beside a running cluster, with the scrape job and login of docker/prometheus/prometheus.yml
(the compose profile's file, only its target changed), and every query of the Grafana dashboard
(docker/grafana/croqq.json) is evaluated by that Prometheus: each must be valid PromQL and return data.
Skips, saying why, where Prometheus is not installed (.ci/run installs it as root)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from tests.ports import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "scrape-pw"
AGENT = {"CROQQ_PROPOSER": "agent", "CROQQ_AGENT": "scripted"}  # so the agent panels have data too


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of the dashboard."""
    board = json.loads((ROOT / "docker" / "grafana" / "croqq.json").read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", []) if t.get("expr")]


def scrape_config(tmp_path: Path, exporter_port: int) -> Path:
    """The compose profile's Prometheus config, pointed at this test's exporter and password file."""
    config = yaml.safe_load((ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
    # a scrape every 5 s, each allowed 5 s (a timeout may not exceed the interval; with 1 s, a loaded
    # machine's slower answer would count as the exporter down)
    config["global"]["scrape_interval"] = "5s"
    config["global"]["scrape_timeout"] = "5s"
    (job,) = config["scrape_configs"]
    (tmp_path / "exporter_password").write_text(PASSWORD + "\n")
    assert job["basic_auth"]["password_file"] == "/run/secrets/exporter_password"
    job["basic_auth"]["password_file"] = str(tmp_path / "exporter_password")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query(port: int, expr: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return dict(json.load(reply))
    except urllib.error.HTTPError as exc:  # a bad query: 400 with the parser's message
        return dict(json.load(exc))
    except OSError:  # not listening yet
        return {}


@pytest.mark.timeout(1800)
def test_prometheus_scrapes_the_exporter_and_every_dashboard_query_returns_data(
    cluster_env: dict[str, str], tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed (apt-get install prometheus; .ci/run does it as root)")
    exporter_port, prom_port = free_port(), free_port()
    env = cluster_env | AGENT | {"CROQQ_EXPORTER_BASIC_AUTH": f"prometheus:{PASSWORD}"}
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "croqq", "exporter", "--port", str(exporter_port)],
            cwd=ROOT,
            env={**cluster.env, "PATH": "/usr/bin:/bin", "CROQQ_HEALTH_DIR": str(tmp_path / "health")},
            stderr=subprocess.DEVNULL,
        )
        prometheus = subprocess.Popen(
            [
                binary,
                f"--config.file={scrape_config(tmp_path, exporter_port)}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )

        def scraped() -> bool:
            return bool(query(prom_port, 'up{job="croqq"} == 1').get("data", {}).get("result"))

        results: dict[str, dict[str, Any]] = {}
        up: dict[str, Any] = {}

        def every_panel_has_data() -> bool:  # a few scrapes after the run, the last one successful
            nonlocal results, up
            results = {expr: query(prom_port, expr) for _, expr in dashboard_queries()}
            up = query(prom_port, 'up{job="croqq"}')
            return all(r.get("status") == "success" and r["data"]["result"] for r in results.values()) and [
                s["value"][1] for s in up.get("data", {}).get("result", [])
            ] == ["1"]

        try:
            wait_until(scraped, 180, "Prometheus to scrape the exporter", every_s=0.5)
            sub = cluster.submit("f16", max_iter=6, limit=2)  # stored while Prometheus watches
            cluster.wait_done(sub, timeout_s=300)
            with contextlib.suppress(TimeoutError):  # what is missing is named below
                wait_until(every_panel_has_data, 180, "every dashboard query to return data", every_s=2)
        finally:
            prometheus.terminate()
            exporter.terminate()
            prometheus.wait(timeout=20)
            exporter.wait(timeout=20)
    log = (tmp_path / "prometheus.log").read_text()[-2000:]
    assert [s["value"][1] for s in up["data"]["result"]] == ["1"], log  # scraped, login accepted
    assert len(dashboard_queries()) >= 14
    for title, expr in dashboard_queries():
        reply = results[expr]
        assert reply.get("status") == "success", f"{title}: {expr}: {reply.get('error')}"
        assert reply["data"]["result"], f"{title}: {expr} returned no data"
    stored = query_value(results, "sum by (decision) (rate(croqq_iterations_total[15m])) * 3600")
    assert stored > 0  # iterations were stored between two scrapes


def query_value(results: dict[str, dict[str, Any]], expr: str) -> float:
    return sum(float(s["value"][1]) for s in results[expr]["data"]["result"])
