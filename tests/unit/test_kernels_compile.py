"""The CUDA kernel family with the real nvcc: every kernel of the manifest compiles for sm_90a, invalid
knob combinations fail with a reason, the index math holds (a host-only self-test binary), and the
harness binary run where there is no GPU reports that as a crash, not as a result."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from croqq.backends._base import GpuContext
from croqq.backends.cuda import CudaBackend, build_references
from croqq.backends.toolchain import candidate_of, knob_candidate
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import Shape
from croqq.probes.nvml import nvml_available
from croqq.probes.sim import SimProbe
from croqq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "kernels" / "cuda"

COMPILE_TIMEOUT_S = 3600.0  # a compile on a loaded 2-core host can take many times the product's 300 s

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CUDA toolkit)"),
    pytest.mark.timeout(3600),
]


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(ROOT / "kernels" / "manifest.json")


@pytest.fixture(scope="module")
def built(manifest: Manifest, tmp_path_factory: pytest.TempPathFactory) -> tuple[CudaBackend, dict[str, str]]:
    backend = CudaBackend(
        manifest, Settings(build_dir=tmp_path_factory.mktemp("build"), compile_timeout_s=COMPILE_TIMEOUT_S)
    )
    outcomes = build_references(backend, manifest.reference_shape)
    failed = {dtype: o.reason for (_, dtype), o in outcomes.items() if not o.ok}
    assert not failed, failed
    return backend, {dtype: o.artifact for (_, dtype), o in outcomes.items()}


def test_every_manifest_kernel_compiles_for_sm90a_with_its_reference_knobs(
    manifest: Manifest, built: tuple[CudaBackend, dict[str, str]]
) -> None:
    backend, artifacts = built
    assert set(artifacts) == set(manifest.dsl("cuda").kernels) == {"f16", "f16sp", "e4m3"}
    for artifact in artifacts.values():
        assert Path(backend.artifact_binary(artifact)).is_file()


def test_every_manifest_kernel_compiles_with_its_naive_knobs(manifest: Manifest, tmp_path: Path) -> None:
    backend = CudaBackend(manifest, Settings(build_dir=tmp_path, compile_timeout_s=COMPILE_TIMEOUT_S))
    outcomes = build_references(backend, (512, 1024, 512), seed="naive")
    assert {dtype: o.reason for (_, dtype), o in outcomes.items() if not o.ok} == {}


def test_the_cutlass_family_compiles_with_the_installed_nvidia_cutlass(
    manifest: Manifest, tmp_path: Path
) -> None:
    backend = CudaBackend(manifest, Settings(build_dir=tmp_path, compile_timeout_s=COMPILE_TIMEOUT_S))
    outcomes = build_references(backend, (4096, 4096, 4096), dsls=("cutlass",))
    assert {key: o.reason for key, o in outcomes.items() if not o.ok} == {}
    assert set(outcomes) == {("cutlass", "f16"), ("cutlass", "e4m3"), ("cutlass", "f16sp")}
    for outcome in outcomes.values():  # WGMMA (sm_90a's warpgroup MMA) is in the binary, not mma.sync
        assert b"wgmma" in Path(backend.artifact_binary(outcome.artifact)).read_bytes()
    sparse = Path(backend.artifact_binary(outcomes["cutlass", "f16sp"].artifact)).read_bytes()
    assert b"MainloopSm90TmaGmmaWarpSpecializedSparse" in sparse  # sparse WGMMA, not dense on the zeros


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"TILE_M": 256, "TILE_N": 256, "WARPS_M": 1, "WARPS_N": 1}, "accumulators exceed 256 registers"),
        (
            {"TILE_M": 256, "TILE_N": 256, "TILE_K": 128, "STAGES": 6, "WARPS_M": 4, "WARPS_N": 4},
            "shared memory per CTA exceeds 227 KiB",
        ),
        ({"SPLIT_K": 4, "TILE_K": 64}, "SPLIT_K exceeds the number of k-tiles"),
    ],
)
def test_knobs_the_hardware_cannot_run_are_refused_by_a_rule_and_by_the_compiler_with_the_reason(
    manifest: Manifest, tmp_path: Path, knobs: dict[str, int], reason: str
) -> None:
    shape = Shape(dtype="f16", m=4096, n=4096, k=128)
    cand = knob_candidate(
        manifest, Settings(), "cuda", shape, seed_knobs(manifest, "cuda", "f16", "reference") | knobs
    )
    backend = CudaBackend(manifest, Settings(build_dir=tmp_path, compile_timeout_s=COMPILE_TIMEOUT_S))
    ruled = backend.build(shape, cand)  # the knob candidate: the manifest's rule, before any compile
    assert not ruled.ok and ruled.reason.startswith("knob rule: ") and reason in ruled.reason
    # the same knobs in an edited source (an agent's): no rule applies, the kernel's static_assert does
    edited = candidate_of(manifest, Settings(), "cuda", "f16", "// an agent's edit\n" + cand.source)
    compiled = backend.build(shape, edited)
    assert not compiled.ok and reason in compiled.reason and "static assertion" in compiled.reason


SELFTEST_CONFIGS = [
    # M, N, K, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, RASTER, SWIZZLE
    (4096, 8192, 4096, 128, 256, 64, 2, 4, 0, 8),
    (384, 1280, 512, 256, 128, 32, 4, 2, 1, 4),
    (128, 32768, 256, 64, 64, 128, 1, 1, 0, 1),
]


@pytest.mark.parametrize("config", SELFTEST_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])))
def test_tile_order_swizzle_and_sparse_metadata_index_math(
    manifest: Manifest, tmp_path: Path, config: tuple[int, ...]
) -> None:
    names = (
        "GEMM_M",
        "GEMM_N",
        "GEMM_K",
        "TILE_M",
        "TILE_N",
        "TILE_K",
        "WARPS_M",
        "WARPS_N",
        "RASTER",
        "SWIZZLE",
    )
    defines = dict(zip(names, config, strict=True)) | {"STAGES": 2, "SPLIT_K": 1, "EPI_VEC": 8}
    spec = manifest.dsl("cuda").build
    binary = tmp_path / "selftest"
    compile_ = subprocess.run(
        [
            spec.compiler,
            "-std=c++17",
            f"-arch={spec.arch}",
            f"-I{CUDA_DIR}",
            *(f"-D{k}={v}" for k, v in defines.items()),
            "-o",
            str(binary),
            str(CUDA_DIR / "selftest.cu"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert compile_.returncode == 0, compile_.stderr[-2000:]
    run = subprocess.run([str(binary)], check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("selftest: ok"), run.stdout[-2000:]


@pytest.mark.skipif(nvml_available(), reason="this host has an NVIDIA GPU: the no-driver path does not apply")
def test_the_harness_where_there_is_no_gpu_is_a_crash_with_the_cuda_error(
    built: tuple[CudaBackend, dict[str, str]], manifest: Manifest
) -> None:
    backend, artifacts = built
    probe = SimProbe(count=1)
    info = probe.discover()[0]
    gpu = GpuContext(uuid=info.uuid, index=0, gpu_type="sm90_NVIDIA_H100_80GB_HBM3", probe=probe)
    m, n, k = manifest.reference_shape
    (result,) = backend.measure(gpu, Shape(dtype="f16", m=m, n=n, k=k), [artifacts["f16"]])
    assert result.outcome == "crash" and "cudaGetDeviceProperties" in result.detail
    assert result.tflops == 0.0 and not result.verified


def test_the_harness_refuses_an_unknown_argument_with_its_usage(
    built: tuple[CudaBackend, dict[str, str]],
) -> None:
    backend, artifacts = built
    run = subprocess.run(
        [backend.artifact_binary(artifacts["e4m3"]), "--repeat", "3"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "unknown or incomplete argument: --repeat" in run.stderr
