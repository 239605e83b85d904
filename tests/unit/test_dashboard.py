"""The Grafana dashboard in the repo queries only metrics the exporter exports (it cannot drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import redis

from croqq.monitor.metrics import ClusterCollector
from croqq.work import stats

DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "croqq.json"
METRIC = re.compile(r"\bcroqq_[a-z0-9_]+\b")


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names(client: redis.Redis) -> set[str]:
    """Every series name the collector's families make (they are there even without samples; the repo's
    size once the writer published it)."""
    stats.record_repo_bytes(client, 1)
    return {f.name + suffix for f in ClusterCollector(client).collect() for suffix in SUFFIXES[f.type]}


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_every_metric_the_dashboard_queries_is_exported(redis_client: redis.Redis) -> None:
    exported = exported_names(redis_client)
    used = {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}
    assert used, "the dashboard queries no croqq metric"
    assert sorted(used - exported) == []


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    used = {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}
    for name in (
        "croqq_queue_messages",
        "croqq_iterations_total",
        "croqq_shapes",
        "croqq_gpu_busy_seconds_total",
        "croqq_quarantines_total",
        "croqq_migrations_total",
        "croqq_writer_commit_seconds_bucket",
        "croqq_results_repo_bytes",
        "croqq_agent_cost_dollars_total",
    ):
        assert name in used, name
