"""Build artifacts travel by content: the artifact store against the real Redis (stored once, TTL,
size cap, verified on arrival from Redis and from the local cache), and a GPU host that never compiles
(a loop without its best's artifact is sent to a build worker first; a lost artifact is rebuilt there)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import redis

from croqq.backends.sim import SimBackend
from croqq.delivery import keys
from croqq.delivery.artifacts import ArtifactRef, ArtifactStore
from croqq.delivery.ledger import step_kind
from croqq.delivery.messages import StepMessage
from croqq.delivery.queues import GPU_KINDS
from croqq.delivery.state import ShapeState, make_sid
from croqq.domain.fsm import ArtifactLost, BestBuilt, Phase, transition
from croqq.domain.knobs import seed_knobs
from croqq.errors import ArtifactMissingError, ArtifactTooLargeError
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.settings import Settings
from croqq.store.schema import Checkpoint
from croqq.work import executors, steps
from croqq.work.persist import loop_from_checkpoint

GPU_TYPE = "sm90_Simulated_H100_SXM"
PAYLOAD = b"\x7fELF" + bytes(range(256)) * 64


def store(client: redis.Redis | None, folder: Path, **settings: object) -> ArtifactStore:
    return ArtifactStore(Settings(run_dir=folder, **settings), client, host="node7")  # type: ignore[arg-type]


@pytest.fixture
def build_host(tmp_path: Path, redis_client: redis.Redis) -> ArtifactStore:
    return store(redis_client, tmp_path / "build-host")


@pytest.fixture
def gpu_host(tmp_path: Path, redis_client: redis.Redis) -> ArtifactStore:
    return store(redis_client, tmp_path / "gpu-host")


def stat(client: redis.Redis, name: str) -> int:
    return int(client.hget(keys.STATS, name) or 0)


# -- the store ------------------------------------------------------------------------------------------


def test_what_a_build_host_puts_a_gpu_host_gets_by_its_reference(
    build_host: ArtifactStore, gpu_host: ArtifactStore, redis_client: redis.Redis
) -> None:
    ref = build_host.put(PAYLOAD)
    assert (ref.sha256, ref.size, ref.built_on) == (
        hashlib.sha256(PAYLOAD).hexdigest(),
        len(PAYLOAD),
        "node7",
    )
    assert gpu_host.get(ref) == PAYLOAD
    assert gpu_host.path(ref).read_bytes() == PAYLOAD and gpu_host.path(ref).parent == gpu_host.cache_dir
    assert (
        stat(redis_client, "artifact_bytes_put") == stat(redis_client, "artifact_bytes_got") == len(PAYLOAD)
    )


def test_the_same_content_is_stored_once_and_a_second_put_sends_no_bytes(
    build_host: ArtifactStore, redis_client: redis.Redis
) -> None:
    assert build_host.put(PAYLOAD) == build_host.put(PAYLOAD)
    assert redis_client.keys(keys.artifact("*")) == [keys.artifact(hashlib.sha256(PAYLOAD).hexdigest())]
    assert stat(redis_client, "artifact_bytes_put") == len(PAYLOAD)


def test_an_artifact_lives_for_its_ttl_and_every_put_and_get_refreshes_it(
    build_host: ArtifactStore, gpu_host: ArtifactStore, redis_client: redis.Redis
) -> None:
    ref = build_host.put(PAYLOAD)
    key = keys.artifact(ref.sha256)
    assert 6 * 3600 - 600 < redis_client.ttl(key) <= 6 * 3600
    for refresh in (lambda: build_host.put(PAYLOAD), lambda: gpu_host.get(ref), lambda: gpu_host.get(ref)):
        redis_client.expire(key, 10)
        refresh()  # the put, the fetch from Redis, then a get served by the local cache
        assert redis_client.ttl(key) > 6 * 3600 - 600


def test_an_artifact_over_the_cap_is_refused_with_the_setting_to_raise(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    small = store(redis_client, tmp_path, artifact_max_bytes=1024)
    with pytest.raises(
        ArtifactTooLargeError, match=r"over the artifact store's cap .*CROQQ_ARTIFACT_MAX_BYTES"
    ):
        small.put(PAYLOAD)
    assert redis_client.keys(keys.artifact("*")) == []


def test_a_value_corrupted_in_redis_is_refused_deleted_and_stored_again_by_the_next_put(
    build_host: ArtifactStore, gpu_host: ArtifactStore, redis_client: redis.Redis
) -> None:
    ref = build_host.put(PAYLOAD)
    redis_client.set(keys.artifact(ref.sha256), PAYLOAD[:-1] + b"!", keepttl=True)
    with pytest.raises(ArtifactMissingError, match="failed verification on arrival"):
        gpu_host.get(ref)
    assert (
        not redis_client.exists(keys.artifact(ref.sha256)) and not (gpu_host.cache_dir / ref.sha256).exists()
    )
    build_host.put(PAYLOAD)
    assert gpu_host.get(ref) == PAYLOAD


def test_a_tampered_local_copy_is_discarded_and_fetched_again(
    build_host: ArtifactStore, gpu_host: ArtifactStore, redis_client: redis.Redis
) -> None:
    ref = build_host.put(PAYLOAD)
    cached = gpu_host.path(ref)
    cached.write_bytes(b"#!/bin/sh\necho pwned\n")
    assert gpu_host.get(ref) == PAYLOAD and cached.read_bytes() == PAYLOAD
    assert stat(redis_client, "artifact_bytes_got") == 2 * len(PAYLOAD)


def test_a_missing_artifact_raises_and_a_reference_with_another_size_does_not_verify(
    build_host: ArtifactStore, gpu_host: ArtifactStore, redis_client: redis.Redis
) -> None:
    never = ArtifactRef(sha256="0" * 64, size=3, built_on="node7")
    with pytest.raises(ArtifactMissingError, match="expired or was never stored"):
        gpu_host.get(never)
    ref = build_host.put(PAYLOAD)
    with pytest.raises(ArtifactMissingError, match="failed verification"):
        gpu_host.get(ref.model_copy(update={"size": ref.size + 1}))


def test_without_redis_the_cache_folder_is_the_whole_store(tmp_path: Path) -> None:
    local = store(None, tmp_path)
    ref = local.put(PAYLOAD)
    assert local.get(ref) == PAYLOAD
    local.path(ref).write_bytes(b"tampered")
    with pytest.raises(ArtifactMissingError, match="no Redis"):
        local.get(ref)


# -- no compile on a GPU host ----------------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis) -> Runtime:
    return Runtime(Settings(broker_url=redis_server.url, run_dir=tmp_path / "run"))


def rebuilt_state(rt: Runtime) -> ShapeState:
    """A shape whose loop the writer rebuilt from its checkpoint (Redis forgot it): no best artifact."""
    knobs = seed_knobs(rt.manifest, "cuda", "f16", "reference")
    ckpt = Checkpoint(
        key="f16_4096x8192x8192",
        dtype="f16",
        m=4096,
        n=8192,
        k=8192,
        mode="from_current_best",
        max_iter=30,
        current_iter=5,
        best_iter=3,
        best_tflops=600.0,
        baseline_tflops=550.0,
        best_kernel="",
        best_knobs=knobs,
        seed_knobs=knobs,
        consecutive_discards=2,
        attempts=0,
        status="active",
        scenarios=["square"],
        region="near",
        last_updated="2026-01-01T00:00:00+00:00",
    )
    return ShapeState(
        sid=make_sid(GPU_TYPE, "cuda", ckpt.key),
        gpu_type=GPU_TYPE,
        dsl="cuda",
        key=ckpt.key,
        dtype="f16",
        m=ckpt.m,
        n=ckpt.n,
        k=ckpt.k,
        mode=ckpt.mode,
        scenarios=ckpt.scenarios,
        region=ckpt.region,
        rank=0,
        loop=loop_from_checkpoint(ckpt, rt.settings),
        gpu_uuid="GPU-a",
    )


def message(state: ShapeState, kind: str) -> StepMessage:
    return StepMessage(step_id=f"{state.sid}#1.abcd", epoch=0, sid=state.sid, kind=kind)


def test_a_loop_rebuilt_from_a_checkpoint_builds_its_best_on_a_build_worker_before_any_gpu_step(
    runtime: Runtime,
) -> None:
    state = rebuilt_state(runtime)
    assert (state.loop.phase, state.loop.best_iter, state.loop.best_artifact) == (Phase.PROFILE, 3, "")
    assert step_kind(state) == "implement" and "implement" not in GPU_KINDS
    event = executors.implement(runtime, state, message(state, "implement"))
    assert isinstance(event, BestBuilt)
    state.loop = transition(state.loop, event)
    assert state.loop.phase == Phase.PROFILE and step_kind(state) == "profile"
    gpu_host = SimBackend(
        runtime.manifest, runtime.settings, store(runtime.client, runtime.settings.run_dir / "gpu-host")
    )
    assert gpu_host.decode(state.shape, state.loop.best_artifact).knobs == state.loop.best_knobs


def test_a_gpu_step_whose_artifact_is_missing_is_done_and_the_shape_goes_back_to_a_build_worker(
    runtime: Runtime, redis_client: redis.Redis
) -> None:
    state = rebuilt_state(runtime)
    state.loop = transition(state.loop, executors.implement(runtime, state, message(state, "implement")))
    redis_client.delete(*redis_client.keys(keys.artifact("*")))  # expired from the store

    def profile_on_a_gpu_host() -> object:
        return runtime.backend.profile(None, state.shape, state.loop.best_artifact)  # type: ignore[arg-type]

    outcome, event = steps._guarded(runtime, message(state, "profile"), profile_on_a_gpu_host)
    assert outcome == "done" and event == ArtifactLost(artifact=state.loop.best_artifact)
    state.loop = transition(state.loop, event)
    assert state.loop.best_artifact == "" and step_kind(state) == "implement"
