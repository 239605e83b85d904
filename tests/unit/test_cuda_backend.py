"""The cuda backend's paths that need no GPU, with real subprocesses: compile failures and timeouts,
harness output parsing, hangs and crashes of the measured binary, the ncu CSV parser, and the binary's
way from the build host to the GPU host through the artifact store (fetched, verified, never compiled)."""

from __future__ import annotations

import json
import shutil
import stat
import time
from pathlib import Path

import pytest
import redis

from croqq.backends._base import GpuContext, KernelRef
from croqq.backends.cuda import CudaBackend, classify, parse_harness, parse_ncu_csv
from croqq.backends.toolchain import knob_candidate
from croqq.delivery import keys
from croqq.delivery.artifacts import ArtifactStore
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import parse_key
from croqq.errors import ArtifactMissingError, InvalidRecordError
from croqq.probes.sim import SimProbe
from croqq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHAPE = parse_key("f16_4096x8192x4096")
OK_LINE = {
    "kernel": "candidate",
    "dtype": "f16",
    "m": 4096,
    "n": 8192,
    "k": 4096,
    "status": "ok",
    "verified": True,
    "reference": "cublas",
    "max_abs_err": 0.002,
    "max_rel_err": 0.001,
    "median_ms": 0.512,
    "min_ms": 0.509,
    "max_ms": 0.530,
    "repeats": 50,
    "tflops": 536.9,
    "detail": "",
}


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def manifest():  # type: ignore[no-untyped-def]
    return load_manifest(ROOT / "kernels" / "manifest.json")


def backend(manifest, tmp_path: Path, client: redis.Redis | None = None, **settings: object) -> CudaBackend:  # type: ignore[no-untyped-def]
    """A cuda backend whose host folders (build, artifact cache) are under ``tmp_path``."""
    s = Settings(build_dir=tmp_path / "build", run_dir=tmp_path / "run", **settings)  # type: ignore[arg-type]
    return CudaBackend(manifest, s, ArtifactStore(s, client))


def with_compiler(manifest, compiler: Path):  # type: ignore[no-untyped-def]
    spec = manifest.dsls["cuda"].build.model_copy(update={"compiler": str(compiler)})
    dsl = manifest.dsls["cuda"].model_copy(update={"build": spec})
    return manifest.model_copy(update={"dsls": {"cuda": dsl}})


def gpu() -> GpuContext:
    probe = SimProbe(count=1)
    info = probe.discover()[0]
    return GpuContext(uuid=info.uuid, index=0, gpu_type="sm90_NVIDIA_H100_80GB_HBM3", probe=probe)


def artifact_for(be: CudaBackend, binary: Path) -> str:
    """What a build hands on for ``binary``: its bytes in the artifact store, a reference in step state."""
    ref = be.artifacts.put(binary.read_bytes())
    return KernelRef(
        backend="cuda", key=SHAPE.key, dsl="cuda", content_hash="f" * 64, artifact=ref
    ).model_dump_json()


def candidate(manifest):  # type: ignore[no-untyped-def]
    return knob_candidate(
        manifest, Settings(), "cuda", SHAPE, seed_knobs(manifest, "cuda", "f16", "reference")
    )


@pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not installed: the compile-failure path needs it"
)
def test_a_source_that_does_not_compile_is_an_outcome_with_the_first_error(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    kernels = tmp_path / "kernels" / "cuda"
    kernels.mkdir(parents=True)
    (kernels / "gemm_f16.cuh").write_text("#error croqq test: this kernel does not compile\n")
    knobs = seed_knobs(manifest, "cuda", "f16", "reference")
    cand = knob_candidate(manifest, Settings(kernels_dir=tmp_path), "cuda", SHAPE, knobs)  # headers travel
    outcome = backend(manifest, tmp_path).build(SHAPE, cand)
    assert not outcome.ok and "croqq test: this kernel does not compile" in outcome.reason
    assert "#error" in outcome.log


def test_a_compiler_that_hangs_is_killed_at_the_compile_timeout(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    patched = with_compiler(manifest, executable(tmp_path / "slowcc", "sleep 3600"))
    started = time.monotonic()
    outcome = backend(patched, tmp_path, compile_timeout_s=1).build(SHAPE, candidate(patched))
    assert time.monotonic() - started < 300  # an hour-long compiler: it was killed, not waited for
    assert not outcome.ok and outcome.reason == "compile timed out after 1s"


def test_harness_json_is_parsed_into_a_measurement(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = executable(tmp_path / "gemm", f"echo 'warming up' >&2; echo '{json.dumps(OK_LINE)}'")
    be = backend(manifest, tmp_path)
    (m,) = be.measure(gpu(), SHAPE, [artifact_for(be, binary)])
    assert (m.outcome, m.tflops, m.median_ms, m.repeats, m.verified) == ("ok", 536.9, 0.512, 50, True)
    assert m.hw_eff_pct == pytest.approx(100 * 536.9 / 989.4, abs=0.01)
    assert m.start is not None and m.end is not None and m.start.sm_clock_mhz > 0


def test_the_harness_is_told_where_cublaslt_is_and_a_cluster_takes_the_setting(
    manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from croqq.processes.local import settings_from

    line = json.dumps({**OK_LINE, "detail": "DETAIL"}).replace("DETAIL", "$CROQQ_CUBLASLT")
    binary = executable(tmp_path / "gemm", f'echo "{line.replace(chr(34), chr(92) + chr(34))}"')
    be = backend(manifest, tmp_path, cublaslt="/opt/cuda/lib/libcublasLt.so.13")
    (m,) = be.measure(gpu(), SHAPE, [artifact_for(be, binary)])
    assert m.outcome == "ok" and m.detail == "/opt/cuda/lib/libcublasLt.so.13"
    assert settings_from({"CROQQ_CUBLASLT": "/x/libcublasLt.so"}).cublaslt == "/x/libcublasLt.so"


@pytest.mark.parametrize(
    ("status", "code", "outcome"),
    [("wrong_answer", 3, "wrong_answer"), ("invalid", 4, "invalid"), ("error", 1, "crash")],
)
def test_harness_failures_become_outcomes(
    manifest, tmp_path: Path, status: str, code: int, outcome: str
) -> None:  # type: ignore[no-untyped-def]
    line = {**OK_LINE, "status": status, "verified": False, "detail": "max_abs_err 3.5 > tolerance"}
    binary = executable(tmp_path / "gemm", f"echo '{json.dumps(line)}'; exit {code}")
    be = backend(manifest, tmp_path)
    (m,) = be.measure(gpu(), SHAPE, [artifact_for(be, binary)])
    assert m.outcome == outcome and m.tflops == 0.0


def test_a_hanging_binary_is_killed_at_the_run_timeout(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = executable(tmp_path / "gemm", "sleep 3600 & wait")
    be = backend(manifest, tmp_path, run_timeout_s=1)
    started = time.monotonic()
    (m,) = be.measure(gpu(), SHAPE, [artifact_for(be, binary)])
    assert time.monotonic() - started < 300  # an hour-long child: its group was killed, not waited for
    assert m.outcome == "hang" and m.detail == "killed after 1s"


def test_a_crashing_binary_is_a_crash_with_its_signal(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = executable(tmp_path / "gemm", "echo 'illegal memory access' >&2; kill -SEGV $$")
    be = backend(manifest, tmp_path)
    (m,) = be.measure(gpu(), SHAPE, [artifact_for(be, binary)])
    assert m.outcome == "crash" and "signal 11" in m.detail and "illegal memory access" in m.raw


def test_parse_harness_takes_the_last_json_line_and_refuses_none() -> None:
    assert parse_harness('noise\n{"status":"ok","tflops":1}\n')["tflops"] == 1
    with pytest.raises(InvalidRecordError):
        parse_harness("Segmentation fault\n")


def test_ncu_csv_is_parsed_and_classified() -> None:
    metrics = parse_ncu_csv((FIXTURES / "ncu_gemm.csv").read_text())
    assert metrics["gpu__time_duration.sum"] == 1024512.0 and metrics["launch__grid_size"] == 2048.0
    assert classify(metrics) == "compute"
    assert (
        classify(
            {
                **metrics,
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": 30.0,
                "dram__throughput.avg.pct_of_peak_sustained_elapsed": 85.0,
            }
        )
        == "memory"
    )
    assert classify({**metrics, "gpu__time_duration.sum": 8000.0}) == "launch"
    assert classify({**metrics, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 35.0}) == "latency"
    with pytest.raises(InvalidRecordError):
        parse_ncu_csv("==PROF== No kernels were profiled.\n")


# -- from the build host to the GPU host by content ---------------------------------------------------------


def fake_compiler(path: Path, binary: Path, log: Path) -> Path:
    """A stand-in for nvcc: records its call and "compiles" by copying ``binary`` to its -o argument."""
    find_out = 'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done'
    return executable(path, f'echo "$@" >> {log}; {find_out}; cp {binary} "$out"')


def hosts(manifest: Manifest, tmp_path: Path, client: redis.Redis) -> tuple[CudaBackend, CudaBackend]:
    """A build host whose compiler works and a GPU host whose compiler only records that it was called;
    nothing shared but Redis."""
    harness = executable(tmp_path / "harness", f"echo '{json.dumps(OK_LINE)}'")
    build_cc = fake_compiler(tmp_path / "buildcc", harness, tmp_path / "build-host-compiles")
    gpu_cc = fake_compiler(tmp_path / "gpucc", harness, tmp_path / "gpu-host-compiles")
    build_host = backend(with_compiler(manifest, build_cc), tmp_path / "build-host", client)
    gpu_host = backend(with_compiler(manifest, gpu_cc), tmp_path / "gpu-host", client)
    return build_host, gpu_host


def test_a_gpu_host_with_an_empty_cache_gets_the_binary_from_redis_and_never_compiles(
    manifest: Manifest, tmp_path: Path, redis_client: redis.Redis
) -> None:
    build_host, gpu_host = hosts(manifest, tmp_path, redis_client)
    outcome = build_host.build(SHAPE, candidate(manifest))
    assert outcome.ok and (tmp_path / "build-host-compiles").is_file()
    ref = KernelRef.model_validate_json(outcome.artifact)
    assert len(outcome.artifact) < 512 and "/" not in outcome.artifact  # a reference, not a path
    (m,) = gpu_host.measure(gpu(), SHAPE, [outcome.artifact])
    assert (m.outcome, m.tflops) == ("ok", 536.9)
    assert not (tmp_path / "gpu-host-compiles").exists()
    cached = tmp_path / "gpu-host" / "run" / "artifacts" / ref.artifact.sha256
    assert cached.read_bytes() == (tmp_path / "harness").read_bytes() and cached.stat().st_mode & stat.S_IXUSR
    assert int(redis_client.hget(keys.STATS, "artifact_bytes_got") or 0) == ref.artifact.size
    gpu_host.measure(gpu(), SHAPE, [outcome.artifact])  # the second run uses the verified local copy
    assert int(redis_client.hget(keys.STATS, "artifact_bytes_got") or 0) == ref.artifact.size


def test_a_binary_corrupted_in_redis_is_refused_on_the_gpu_host_and_named_for_a_rebuild(
    manifest: Manifest, tmp_path: Path, redis_client: redis.Redis
) -> None:
    build_host, gpu_host = hosts(manifest, tmp_path, redis_client)
    outcome = build_host.build(SHAPE, candidate(manifest))
    sha = KernelRef.model_validate_json(outcome.artifact).artifact.sha256
    redis_client.set(keys.artifact(sha), "#!/bin/sh\necho pwned\n", keepttl=True)
    with pytest.raises(ArtifactMissingError, match="failed verification") as caught:
        gpu_host.measure(gpu(), SHAPE, [outcome.artifact])
    assert caught.value.artifact == outcome.artifact
    assert not (tmp_path / "gpu-host-compiles").exists()
    assert not (tmp_path / "gpu-host" / "run" / "artifacts" / sha).exists()
