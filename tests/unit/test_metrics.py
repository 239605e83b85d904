"""`croqq exporter`'s metrics on a real Redis, populated by the product's own code paths (ledger, placement,
stats, agents, kombu's Redis transport), read back through HTTP and prometheus-client's parser."""

from __future__ import annotations

import base64
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Queue
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from croqq.delivery import queues
from croqq.delivery.ledger import Ledger, StepRecord
from croqq.delivery.messages import SubmitMessage
from croqq.domain.fsm import BaselineMeasured, Built, Stored
from croqq.domain.manifest import load_manifest
from croqq.domain.records import AgentUsage, BuildOutcome, Idea, Measurement
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
from tests.output import error_line

ROOT = Path(__file__).resolve().parents[2]
GPU_TYPE = "sm90_Simulated_H100_SXM"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Serve = Callable[..., str]


class Fleet:
    """A ledger, placement and intake on the test's Redis, counting stores as the runtime does."""

    def __init__(self, client: redis.Redis, ttl: float = 5.0) -> None:
        self.client = client
        self.settings = Settings(pipeline_depth=2, lease_ttl_s=ttl)
        self.published: list[StepRecord] = []
        advance = Advance([stats.on_stored], refill=lambda uuid: self.placement.fill(uuid))  # noqa: PLW0108
        self.ledger = Ledger(client, ttl, advance, lambda records, _: self.published.extend(records))
        self.placement = Placement(self.settings, client, self.ledger)
        self.intake = Intake(
            self.settings,
            load_manifest(ROOT / "kernels" / "manifest.json"),
            client,
            self.ledger,
            self.placement,
        )

    def add_gpu(self, uuid: str, index: int = 0) -> None:
        entry = registry.GpuEntry(
            uuid=uuid, host="h1", index=index, gpu_type=GPU_TYPE, queue=queues.gpu_queue(uuid)
        )
        registry.register_gpu(self.client, entry)

    def submit(self, shapes: int) -> list[str]:
        manifest = load_manifest(ROOT / "kernels" / "manifest.json")
        schedule = build_schedule(manifest, "f16")[:shapes]
        msg = SubmitMessage(
            submission="s1",
            gpu_type=GPU_TYPE,
            dsl="cuda",
            mode="from_current_best",
            max_iter=3,
            shapes=schedule,
        )
        return self.intake.submit(msg).sids

    def step(self, kind: str) -> StepRecord:
        found = next(r for r in self.published if r.kind == kind)
        self.published.remove(found)
        return found

    def run(self, kind: str, event: object, owner: str = "w") -> None:
        rec = self.step(kind)
        assert self.ledger.claim(rec.step_id, rec.epoch, owner, rec.kind, rec.sid)[0] == "ok"
        self.ledger.complete(rec.step_id, rec.epoch, owner, event)  # type: ignore[arg-type]


def baseline() -> BaselineMeasured:
    return BaselineMeasured(knobs={"TILE_M": 128}, measurement=Measurement(outcome="ok", tflops=100.0))


def scrape(url: str, auth: str | None = None) -> Samples:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(request, timeout=60) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def serve(redis_client: redis.Redis) -> Iterator[Serve]:
    servers = []

    def start(logins: Logins = Logins(())) -> str:
        server = make_server_for("127.0.0.1", 0, metrics_app(redis_client, logins, ["cuda", "cutlass"]))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def publish(redis_server: RedisServer, queue: str, priorities: list[int]) -> None:
    """Send messages the way Celery does (kombu's Redis transport: one list per priority step)."""
    with Connection(redis_server.url.replace("unix://", "redis+socket://")) as conn:
        producer = conn.Producer()
        for priority in priorities:
            producer.publish({"n": 1}, routing_key=queue, declare=[Queue(queue)], priority=priority)


def test_metrics_show_what_the_cluster_recorded(
    redis_client: redis.Redis, redis_server: RedisServer, serve: Serve
) -> None:
    fleet = Fleet(redis_client)
    fleet.add_gpu("GPU-a")
    fleet.add_gpu("GPU-b", 1)
    sids = fleet.submit(3)
    fleet.run("implement", Built(build=BuildOutcome(ok=True, artifact="seed")))
    fleet.run("baseline", baseline())
    fleet.run("store", Stored(iteration=0))
    stats.record_busy(redis_client, "GPU-a", 1000.0, 1012.5)
    for seconds in (0.004, 0.02, 0.02, 3.0):
        stats.record_commit(redis_client, seconds)
    for dsl, seconds in (("cuda", 3.4), ("cuda", 4.1), ("cutlass", 50.5), ("cutlass", 1000.0)):
        stats.record_compile(redis_client, dsl, seconds)
    stats.record_repo_bytes(redis_client, 123456)
    usage = AgentUsage(agent="claude", wall_s=2.5, input_tokens=100, output_tokens=40, cost_usd=0.25)
    idea = Idea(summary="s", tag="s", knobs={}, content_hash="c" * 64, proposer="claude", agent=usage)
    agents.record_call(redis_client, "claude", idea, fleet.settings)
    agents.record_call(redis_client, "claude", idea, fleet.settings)
    publish(redis_server, queues.gpu_queue("GPU-b"), [0, 5, 9])
    publish(redis_server, queues.build_queue("cutlass"), [0, 0])
    fleet.placement.quarantine("GPU-a", "XID 79")

    m = scrape(serve() + "/metrics")

    assert value(m, "croqq_iterations_total", decision="baseline") == 1
    assert value(m, "croqq_iterations_total", decision="keep") == 0
    active = value(m, "croqq_shapes", dtype="f16", status="active")
    assert active + value(m, "croqq_shapes", dtype="f16", status="pending") == len(sids)
    assert value(m, "croqq_queue_messages", queue="gpu.GPU-b") == 3  # three priority lists, summed
    assert value(m, "croqq_queue_messages", queue="gpu.GPU-a") == 0
    assert value(m, "croqq_queue_messages", queue="store") == 0
    assert value(m, "croqq_queue_messages", queue="build.cutlass") == 2  # what k8s scales build workers on
    assert value(m, "croqq_queue_messages", queue="build.cuda") == 0
    assert value(m, "croqq_gpu_state", gpu="GPU-a", state="quarantined") == 1
    assert value(m, "croqq_gpu_state", gpu="GPU-a", state="healthy") == 0
    assert value(m, "croqq_gpu_state", gpu="GPU-b", state="healthy") == 1
    assert value(m, "croqq_gpu_info", gpu="GPU-b", host="h1", gpu_type=GPU_TYPE, index="1") == 1
    assert value(m, "croqq_gpu_busy_seconds_total", gpu="GPU-a") == 12.5
    assert value(m, "croqq_gpu_steps_total", gpu="GPU-a") == 1
    assert value(m, "croqq_gpu_measurements_total", gpu="GPU-a") == 1
    assert 0 < value(m, "croqq_gpu_duty_ratio", gpu="GPU-a") < 1  # 12.5 s busy since 1970 + 1000 s
    assert value(m, "croqq_gpu_active_shapes", gpu="GPU-b") == active  # all migrated off GPU-a
    assert value(m, "croqq_gpu_active_shapes", gpu="GPU-a") == 0
    assert value(m, "croqq_quarantines_total") == 1
    assert value(m, "croqq_migrations_total") >= 1
    assert value(m, "croqq_writer_commit_seconds_count") == 4
    assert value(m, "croqq_writer_commit_seconds_bucket", le="0.005") == 1
    assert value(m, "croqq_writer_commit_seconds_bucket", le="0.025") == 3
    assert value(m, "croqq_writer_commit_seconds_bucket", le="+Inf") == 4
    assert value(m, "croqq_writer_commit_seconds_sum") == pytest.approx(3.044)
    assert value(m, "croqq_results_repo_bytes") == 123456
    assert value(m, "croqq_compile_seconds_count", dsl="cuda") == 2
    assert value(m, "croqq_compile_seconds_bucket", dsl="cuda", le="2.5") == 0
    assert value(m, "croqq_compile_seconds_bucket", dsl="cuda", le="5.0") == 2
    assert value(m, "croqq_compile_seconds_bucket", dsl="cutlass", le="60.0") == 1
    assert value(m, "croqq_compile_seconds_bucket", dsl="cutlass", le="900.0") == 1  # cumulative
    assert value(m, "croqq_compile_seconds_bucket", dsl="cutlass", le="+Inf") == 2
    assert value(m, "croqq_compile_seconds_sum", dsl="cutlass") == pytest.approx(1050.5)
    assert value(m, "croqq_agent_calls_total", agent="claude") == 2
    assert value(m, "croqq_agent_call_seconds_total", agent="claude") == 5.0
    assert value(m, "croqq_agent_tokens_total", agent="claude", kind="input") == 200
    assert value(m, "croqq_agent_tokens_total", agent="claude", kind="output") == 80
    assert value(m, "croqq_agent_cost_dollars_total", agent="claude") == 0.5
    assert value(m, "croqq_redis_up") == 1
    assert value(m, "croqq_exporter_scrape_seconds") > 0


def test_an_expired_lease_counts_as_a_lease_expiry_and_a_redispatch(
    redis_client: redis.Redis,
    serve: Serve,
) -> None:
    fleet = Fleet(redis_client, ttl=0.2)
    fleet.add_gpu("GPU-a")
    fleet.submit(1)
    fleet.run("implement", Built(build=BuildOutcome(ok=True, artifact="seed")))
    rec = fleet.step("baseline")
    fleet.ledger.claim(rec.step_id, 0, "dead-worker", rec.kind, rec.sid)
    time.sleep(0.3)
    assert fleet.ledger.expire_leases() == 1

    m = scrape(serve() + "/metrics")
    assert value(m, "croqq_lease_expiries_total") == 1
    assert value(m, "croqq_redispatches_total") == 1


def test_an_empty_cluster_scrapes_with_zeros_and_no_labels_invented(
    redis_client: redis.Redis,
    serve: Serve,
) -> None:
    m = scrape(serve() + "/metrics")
    assert value(m, "croqq_queue_messages", queue="control") == 0
    assert value(m, "croqq_writer_commit_seconds_count") == 0
    assert not [k for k in m if k[0].startswith(("croqq_gpu_", "croqq_agent_", "croqq_shapes"))]


def test_metrics_need_a_login_when_logins_are_set_and_healthz_never_does(
    redis_client: redis.Redis,
    serve: Serve,
) -> None:
    base = serve(Logins((("prom", "s3cret"),)))
    for auth in (None, "prom:wrong"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(base + "/metrics", auth)
        assert refused.value.code == 401
        assert refused.value.headers["WWW-Authenticate"].startswith("Basic ")
    assert value(scrape(base + "/metrics", "prom:s3cret"), "croqq_redis_up") == 1
    with urllib.request.urlopen(base + "/healthz", timeout=60) as reply:
        assert reply.status == 200


def test_a_scrape_while_redis_is_unreachable_says_so(tmp_path: Path) -> None:
    gone = redis.Redis(
        unix_socket_path=str(tmp_path / "nothing.sock"), socket_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    server = make_server_for("127.0.0.1", 0, metrics_app(gone, Logins(())))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        m = scrape(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert value(m, "croqq_redis_up") == 0


def test_exporter_refuses_a_network_address_without_a_login(
    croqq: Callable[..., Any], tmp_path: Path
) -> None:
    done = croqq({"CROQQ_RUN_DIR": str(tmp_path)}, "exporter", "--address", "0.0.0.0")
    assert done.returncode == 2
    assert "CROQQ_EXPORTER_BASIC_AUTH" in error_line(done.stderr), done.stderr


def test_an_alarm_is_one_series_per_worker_in_the_exporter_and_status_until_its_worker_clears_it(
    redis_client: redis.Redis, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from croqq.cli.view import render
    from croqq.work import alarms, hosts
    from croqq.work.progress import snapshot

    url = serve() + "/metrics"
    assert not [k for k in scrape(url) if k[0] == "croqq_alarm"]
    for worker in ("writer@node1", "build@node2"):
        monkeypatch.setenv(hosts.ENV_WORKER, worker)
        alarms.raise_alarm(redis_client, "disk_full", f"{worker}: no space left; free some")
    alarms.raise_alarm(redis_client, "disk_full", "build@node2: still full")  # refreshed, not doubled
    m = scrape(url)
    for source in ("writer@node1", "build@node2"):  # value()'s own "name" argument hides the label
        assert m[("croqq_alarm", (("name", "disk_full"), ("source", source)))] == 1
    console = Console(width=200, record=True)
    console.print(render(snapshot(redis_client, []), None))
    shown = console.export_text()
    assert "ALARMS" in shown and "still full" in shown and "writer@node1: no space left" in shown
    assert alarms.clear_alarm(redis_client, "disk_full")  # this worker's (build@node2) only
    assert not alarms.clear_alarm(redis_client, "disk_full")
    assert [a.source for a in alarms.active(redis_client)] == ["writer@node1"]
    assert [k for k in scrape(url) if k[0] == "croqq_alarm"] == [
        ("croqq_alarm", (("name", "disk_full"), ("source", "writer@node1")))
    ]


def test_status_shows_a_long_alarm_message_whole(redis_client: redis.Redis) -> None:
    """An alarm says what to do: `croqq status` never cuts it, and folds it in a narrow terminal."""
    from rich.console import Console

    from croqq.cli.view import render
    from croqq.work import alarms
    from croqq.work.progress import snapshot

    where = "/deep" * 40
    message = f"no space left on device writing {where} (468 KiB free): free space there; retries every 1s"
    alarms.raise_alarm(redis_client, "disk_full", message)
    shown = {}
    for width in (400, 80):
        console = Console(width=width, record=True)
        console.print(render(snapshot(redis_client, []), None))
        rows = console.export_text().splitlines()
        start = next(i for i, line in enumerate(rows) if line.lstrip().startswith("disk_full"))
        shown[width] = [line.split("│")[-1].strip() for line in rows[start:] if "│" in line]
    assert len(message) > 160 and shown[400][0] == message  # one line where it fits
    folded = "".join(shown[80]).replace(" ", "")
    assert len(shown[80]) > 1 and folded == message.replace(" ", "")  # folded, whole
