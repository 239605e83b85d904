"""The cuda backend's paths that need no GPU, with real subprocesses: compile failures and timeouts,
harness output parsing, hangs and crashes of the measured binary, and the ncu CSV parser."""

from __future__ import annotations

import json
import shutil
import stat
import time
from pathlib import Path

import pytest

from croqq.backends._base import GpuContext
from croqq.backends.cuda import CudaArtifact, CudaBackend, classify, parse_harness, parse_ncu_csv
from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.shapes import parse_key
from croqq.errors import InvalidRecordError
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


def backend(manifest, tmp_path: Path, **settings: object) -> CudaBackend:  # type: ignore[no-untyped-def]
    return CudaBackend(manifest, Settings(build_dir=tmp_path / "build", **settings))  # type: ignore[arg-type]


def gpu() -> GpuContext:
    probe = SimProbe(count=1)
    info = probe.discover()[0]
    return GpuContext(uuid=info.uuid, index=0, gpu_type="sm90_NVIDIA_H100_80GB_HBM3", probe=probe)


def artifact_for(binary: Path) -> str:
    return CudaArtifact(
        key=SHAPE.key, dsl="cuda", content_hash="f" * 64, knobs={}, binary=str(binary)
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
    fake = executable(tmp_path / "slowcc", "sleep 30")
    spec = manifest.dsls["cuda"].build.model_copy(update={"compiler": str(fake)})
    dsl = manifest.dsls["cuda"].model_copy(update={"build": spec})
    patched = manifest.model_copy(update={"dsls": {"cuda": dsl}})
    started = time.monotonic()
    outcome = backend(patched, tmp_path, compile_timeout_s=1).build(SHAPE, candidate(patched))
    assert time.monotonic() - started < 10
    assert not outcome.ok and outcome.reason == "compile timed out after 1s"


def test_harness_json_is_parsed_into_a_measurement(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = executable(tmp_path / "gemm", f"echo 'warming up' >&2; echo '{json.dumps(OK_LINE)}'")
    (m,) = backend(manifest, tmp_path).measure(gpu(), SHAPE, [artifact_for(binary)])
    assert (m.outcome, m.tflops, m.median_ms, m.repeats, m.verified) == ("ok", 536.9, 0.512, 50, True)
    assert m.hw_eff_pct == pytest.approx(100 * 536.9 / 989.4, abs=0.01)
    assert m.start is not None and m.end is not None and m.start.sm_clock_mhz > 0


@pytest.mark.parametrize(
    ("status", "code", "outcome"),
    [("wrong_answer", 3, "wrong_answer"), ("invalid", 4, "invalid"), ("error", 1, "crash")],
)
def test_harness_failures_become_outcomes(
    manifest, tmp_path: Path, status: str, code: int, outcome: str
) -> None:  # type: ignore[no-untyped-def]
    line = {**OK_LINE, "status": status, "verified": False, "detail": "max_abs_err 3.5 > tolerance"}
    binary = executable(tmp_path / "gemm", f"echo '{json.dumps(line)}'; exit {code}")
    (m,) = backend(manifest, tmp_path).measure(gpu(), SHAPE, [artifact_for(binary)])
    assert m.outcome == outcome and m.tflops == 0.0


def test_a_hanging_binary_is_killed_at_the_run_timeout(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = executable(tmp_path / "gemm", "sleep 30 & wait")
    started = time.monotonic()
    (m,) = backend(manifest, tmp_path, run_timeout_s=1).measure(gpu(), SHAPE, [artifact_for(binary)])
    assert time.monotonic() - started < 10
    assert m.outcome == "hang" and m.detail == "killed after 1s"


def test_a_crashing_binary_is_a_crash_with_its_signal(manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = executable(tmp_path / "gemm", "echo 'illegal memory access' >&2; kill -SEGV $$")
    (m,) = backend(manifest, tmp_path).measure(gpu(), SHAPE, [artifact_for(binary)])
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
