"""What Celery's task events cost Redis: the same short sweep with ``CROQQ_TASK_EVENTS`` off, on, and
on with a Flower subscribed.

Each variant runs a real local cluster on a fresh Redis of the product's configuration; Redis's own
counters (INFO commandstats, network bytes) over the submission give commands and bytes per stored
iteration, and the idle cluster's rate afterwards gives what events cost while nothing runs."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.capacity_bench import _wait_stored, cluster_env

log = logging.getLogger(__name__)
GPUS, DEPTH, SHAPES, MAX_ITER = 4, 4, 16, 10
IDLE_S, SETTLE_S = 10.0, 3.0
VARIANTS = {"off": ("false", False), "on": ("true", False), "on_flower": ("true", True)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flower(env: dict[str, str], logfile: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "croqq", "flower", "--port", str(_free_port())]
    with logfile.open("wb") as out:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


@dataclass
class Traffic:
    """Redis's counters: calls per command, bytes received from and sent to clients."""

    calls: dict[str, float]
    bytes_in: float
    bytes_out: float

    @classmethod
    def read(cls, client: Any) -> Traffic:
        info = client.info("everything")
        calls = {k[len("cmdstat_") :]: float(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_")}
        return cls(calls, float(info["total_net_input_bytes"]), float(info["total_net_output_bytes"]))

    def __sub__(self, other: Traffic) -> Traffic:
        calls = {k: v - other.calls.get(k, 0.0) for k, v in self.calls.items()}
        return Traffic(calls, self.bytes_in - other.bytes_in, self.bytes_out - other.bytes_out)

    def per(self, n: float) -> dict[str, float]:
        return {
            "commands": round(sum(self.calls.values()) / n, 1),
            "publish": round(self.calls.get("publish", 0.0) / n, 1),
            "bytes_in": round(self.bytes_in / n),
            "bytes_out": round(self.bytes_out / n),
        }


def run_variant(work: Path, events: str, flower: bool) -> dict[str, object]:
    """One variant on its own Redis: per stored iteration, and per second while idle."""
    from croqq.processes.local import LocalCluster
    from croqq.processes.redis_server import RedisServer

    server = RedisServer(work / "redis").start()
    env = cluster_env(work, server) | {
        "CROQQ_SIM_GPUS": str(GPUS),
        "CROQQ_PIPELINE_DEPTH": str(DEPTH),
        "CROQQ_TASK_EVENTS": events,
    }
    client = server.client()
    viewer = None
    stored = SHAPES * (MAX_ITER + 1)
    try:
        with LocalCluster(env, log_level="WARNING") as cluster:
            viewer = _flower(cluster.env, work / "flower.log") if flower else None
            cluster.wait_gpus()
            time.sleep(SETTLE_S)  # boot traffic settles
            before, started = Traffic.read(client), time.monotonic()
            cluster.submit("f16", max_iter=MAX_ITER, limit=SHAPES)
            _wait_stored(client, stored)
            run, wall = Traffic.read(client) - before, time.monotonic() - started
            time.sleep(SETTLE_S)
            idle0 = Traffic.read(client)
            time.sleep(IDLE_S)
            idle = Traffic.read(client) - idle0
    finally:
        if viewer is not None:
            viewer.terminate()
            viewer.wait(timeout=30)
        server.stop()
    return {
        "iterations": stored,
        "wall_s": round(wall, 1),
        "per_iter": run.per(stored),
        "idle_per_s": idle.per(IDLE_S),
    }


def events_cost(work: Path) -> dict[str, Any]:
    """Every variant, then what events add to the run without them (per iteration, and in percent)."""
    out: dict[str, Any] = {}
    for name, (events, flower) in VARIANTS.items():
        log.info("events %s%s ...", events, ", Flower subscribed" if flower else "")
        out[name] = run_variant(work / name, events, flower)
    off, off_idle = out["off"]["per_iter"], out["off"]["idle_per_s"]
    for name in ("on", "on_flower"):
        on, on_idle = out[name]["per_iter"], out[name]["idle_per_s"]
        added = {k: round(on[k] - off[k], 1) for k in on}
        out[f"{name}_adds"] = {
            "per_iter": added,
            "commands_pct": round(100 * added["commands"] / off["commands"], 1),
            "bytes_pct": round(
                100 * (added["bytes_in"] + added["bytes_out"]) / (off["bytes_in"] + off["bytes_out"]), 1
            ),
            "idle_per_s": {k: round(on_idle[k] - off_idle[k], 1) for k in on_idle},
        }
    return {"events": out}
