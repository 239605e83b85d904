"""The exporter's scrape time with a big fleet registered.

A private Redis holds what a live sweep leaves there (``GPUS`` registered GPUs, every scheduled shape placed,
counters, commit times, agents); ``SCRAPES`` scrapes of ``/metrics`` over HTTP give the median and p90 wall
time per scrape and the number of samples in one."""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from croqq.delivery import keys, queues
from croqq.delivery.ledger import Ledger
from croqq.delivery.messages import SubmitMessage
from croqq.domain.manifest import load_manifest
from croqq.domain.records import AgentUsage, Idea
from croqq.domain.schedule import build_schedule
from croqq.monitor.exporter import make_server_for, metrics_app
from croqq.placement import registry
from croqq.placement.assign import Placement
from croqq.processes.redis_server import RedisServer
from croqq.processes.webauth import Logins
from croqq.settings import Settings
from croqq.work import agents, stats
from croqq.work.advance import Advance
from croqq.work.intake import Intake

log = logging.getLogger(__name__)
GPUS, ITERATIONS, COMMITS, AGENTS, SCRAPES = 64, 8000, 2000, 3, 200
GPU_TYPE = "sm90_Simulated_H100_SXM"
MANIFEST = Path(__file__).resolve().parents[1] / "kernels" / "manifest.json"


def populate(server: RedisServer, gpus: int = GPUS) -> int:
    """A live sweep's state in Redis; returns the number of shapes submitted."""
    client = server.client()
    settings = Settings(pipeline_depth=4, broker_url=server.url)
    manifest = load_manifest(MANIFEST)
    ledger = Ledger(client, settings.lease_ttl_s, Advance(), lambda records, pipe: None)
    placement = Placement(settings, client, ledger)
    rng = random.Random(11)
    for i in range(gpus):
        uuid = f"GPU-{i:08x}-bench"
        entry = registry.GpuEntry(
            uuid=uuid, host=f"host{i // 8}", index=i % 8, gpu_type=GPU_TYPE, queue=queues.gpu_queue(uuid)
        )
        registry.register_gpu(client, entry)
        stats.record_busy(client, uuid, 1000.0, 1000.0 + rng.uniform(3000, 3600))
        client.hset(keys.depth(uuid), "depth", str(rng.randint(3, 6)))
    intake = Intake(settings, manifest, client, ledger, placement)
    shapes = 0
    for dtype in ("f16", "e4m3"):
        msg = SubmitMessage(
            submission=f"bench-{dtype}",
            gpu_type=GPU_TYPE,
            dsl="cuda",
            mode="from_current_best",
            max_iter=30,
            shapes=build_schedule(manifest, dtype),
        )
        shapes += len(intake.submit(msg).sids)
    counts = {"stored": ITERATIONS, "KEEP": 900, "DISCARD": 6500, "FAIL": 332, "BASELINE": 268}
    counts |= {"attempts": 700, "attempts:compile": 500, "attempts:check": 150, "attempts:agent": 50}
    counts |= {"redispatch": 40, "lease_expired": 25, "quarantines": 2, "migrations": 9, "offline": 1}
    client.hset(keys.STATS, mapping=counts)  # type: ignore[arg-type]
    for _ in range(COMMITS):
        stats.record_commit(client, rng.lognormvariate(-4.5, 0.5))
    stats.record_repo_bytes(client, 512 * 2**20)
    for a in range(AGENTS):
        name = f"agent{a}"
        usage = AgentUsage(agent=name, wall_s=240.0, input_tokens=20000, output_tokens=3000, cost_usd=0.4)
        idea = Idea(summary="s", tag="s", knobs={}, content_hash="c" * 64, proposer=name, agent=usage)
        for _ in range(20):
            agents.record_call(client, name, idea, settings)
    client.close()
    return shapes


def _scrape(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def run(work_dir: Path, gpus: int = GPUS, scrapes: int = SCRAPES) -> dict[str, float | int]:
    with RedisServer(work_dir / "redis") as server:
        shapes = populate(server, gpus)
        server_client = server.client(retries=0)
        http = make_server_for("127.0.0.1", 0, metrics_app(server_client, Logins(())))
        threading.Thread(target=http.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{http.server_port}/metrics"
        try:
            samples = _scrape(url)  # warm: connections opened, modules imported
            times = []
            for _ in range(scrapes):
                started = time.perf_counter()
                _scrape(url)
                times.append(1000.0 * (time.perf_counter() - started))
        finally:
            http.shutdown()
            http.server_close()
    times.sort()
    result: dict[str, float | int] = {
        "exporter_gpus": gpus,
        "exporter_shapes": shapes,
        "exporter_samples_per_scrape": samples,
        "exporter_scrapes": scrapes,
        "exporter_scrape_ms_median": round(statistics.median(times), 2),
        "exporter_scrape_ms_p90": round(times[int(0.9 * (len(times) - 1))], 2),
    }
    log.info("exporter: %s", result)
    return result
