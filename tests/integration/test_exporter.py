"""`croqq exporter` next to a real cluster: what Prometheus scrapes over HTTP matches what the cluster did."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from tests.integration.test_cluster import GROUP_SUBJECT, git
from tests.ports import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Metric sample name -> {sorted labels: value}."""
    with urllib.request.urlopen(url, timeout=60) as reply:
        text = reply.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def wait_healthy(env: dict[str, str], budget_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    """`croqq health --role exporter --ready`, asked until it says yes (the first beat may be on its way);
    the last answer. ``--max-age`` 60: readiness is what is asked, not how punctually a loaded machine
    beats (3 beats of 0.75 s by default)."""
    answers: list[subprocess.CompletedProcess[str]] = []

    def ready() -> bool:
        answers.append(
            subprocess.run(
                [sys.executable, "-m", "croqq", "health", "--role", "exporter", "--ready", "--max-age", "60"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        )
        return answers[-1].returncode == 0

    with contextlib.suppress(TimeoutError):  # the last answer says why
        wait_until(ready, budget_s, "croqq health --role exporter --ready", every_s=0.5)
    return answers[-1]


@pytest.mark.timeout(1800)
def test_exporter_scrapes_a_running_cluster(cluster_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    with LocalCluster(cluster_env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=2, limit=2)
        cluster.wait_done(sub, timeout_s=300)
        uuids = [g.uuid for g in cluster.snapshot().gpus]
        env = {**cluster.env, "PATH": "/usr/bin:/bin", "CROQQ_HEALTH_DIR": str(tmp_path / "health")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "croqq", "exporter", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        m: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}

        def published() -> bool:  # the exporter answers, and the writer's periodic flush published the size
            nonlocal m
            try:
                m = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                m = {}
            return bool(m.get("croqq_results_repo_bytes"))

        try:
            wait_until(published, 180, "the exporter's metrics with croqq_results_repo_bytes", every_s=0.5)
            health = wait_healthy(env)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert m, proc.stderr.read() if proc.stderr else ""
    assert sum(m["croqq_iterations_total"].values()) == 6  # 2 shapes x (baseline + 2 iterations)
    assert m["croqq_iterations_total"][(("decision", "baseline"),)] == 2
    stores = [  # the commits that stored iterations: one each, or a group commit of several
        subject
        for subject in git(Path(cluster_env["CROQQ_RESULTS_REPO"]), "log", "--format=%s").splitlines()
        if " iter0" in subject or GROUP_SUBJECT.match(subject)
    ]
    assert m["croqq_writer_commit_seconds_count"][()] == len(stores) >= 1  # one observation per commit
    assert m["croqq_results_repo_bytes"][()] > 0
    assert len(uuids) == 2
    for uuid in uuids:
        assert m["croqq_queue_messages"][(("queue", f"gpu.{uuid}"),)] == 0  # done: every queue drained
        assert m["croqq_gpu_state"][(("gpu", uuid), ("state", "healthy"))] == 1
    assert sum(m["croqq_gpu_busy_seconds_total"].values()) > 0
    assert m["croqq_shapes"][(("dtype", "f16"), ("status", "done"))] == 2
    assert health.returncode == 0, health.stderr
