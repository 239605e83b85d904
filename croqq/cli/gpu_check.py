"""`croqq gpu-check`: the real GPU path end to end on this host, one command (`make gpu-check`).

It builds the reference kernel of every dtype of every family (dsl) for three shapes, verifies each and
times it against cuBLAS on the same shape, measures one kernel repeatedly for the spread between
measurements, and runs a short tuning loop through a real local cluster (Redis, one GPU worker, the
writer). It prints tables and writes a JSON report. Simulated GPUs cannot show any of this, so without an
NVIDIA GPU it refuses in one line.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError, CroqqError

if TYPE_CHECKING:  # the CUDA side loads only when the command runs
    from croqq.backends._base import GpuContext
    from croqq.backends.cuda import CudaBackend

SHAPES = ((2048, 2048, 2048), (4096, 8192, 4096), (8192, 8192, 8192))
SPREAD_RUNS = 10
LOOP_SHAPE, LOOP_ITERS = "4096x8192x4096", 3


def _gpu(manifest: Manifest, console: Console) -> GpuContext:
    from croqq.backends._base import GpuContext
    from croqq.probes.nvml import NvmlProbe

    probe = NvmlProbe()
    info = probe.discover()[0]
    gpu_type = info.gpu_type
    if gpu_type not in manifest.gpus:
        console.print(f"[yellow]{gpu_type} has no peak figures in the manifest; using the H100's[/]")
        gpu_type = "sm90_NVIDIA_H100_80GB_HBM3"
    return GpuContext(uuid=info.uuid, index=info.index, gpu_type=gpu_type, probe=probe)


Built = dict[tuple[str, str, tuple[int, int, int]], str]  # (dsl, dtype, shape) -> artifact


def _build_all(backend: CudaBackend) -> Built:
    from croqq.backends.cuda import build_references

    out = {}
    for dims in SHAPES:
        for (dsl, dtype), outcome in build_references(
            backend, dims, dsls=tuple(backend.manifest.dsls)
        ).items():
            if not outcome.ok:
                raise CroqqError(
                    f"the {dsl} {dtype} reference kernel for {dims} does not build: {outcome.reason}"
                )
            out[(dsl, dtype, dims)] = outcome.artifact
    return out


def _versus_cublas(backend: CudaBackend, gpu: GpuContext, artifacts: Built) -> list[dict[str, object]]:
    rows = []
    for (dsl, dtype, dims), artifact in artifacts.items():
        shape = Shape(dtype=dtype, m=dims[0], n=dims[1], k=dims[2])
        (ours,) = backend.measure(gpu, shape, [artifact])
        vendor = backend.vendor_tflops(gpu, shape)
        rows.append(
            {
                "dsl": dsl,
                "dtype": dtype,
                "shape": "x".join(map(str, dims)),
                "outcome": ours.outcome,
                "verified": ours.verified,
                "tflops": ours.tflops,
                "cublas_tflops": vendor,
                "ratio": round(ours.tflops / vendor, 3) if vendor else None,
                "hw_eff_pct": ours.hw_eff_pct,
                "detail": ours.detail,
            }
        )
    return rows


def _spread(backend: CudaBackend, gpu: GpuContext, artifact: str) -> dict[str, float]:
    shape = Shape(dtype="f16", m=8192, n=8192, k=8192)
    medians = [backend.measure(gpu, shape, [artifact])[0].median_ms for _ in range(SPREAD_RUNS)]
    return {
        "runs": SPREAD_RUNS,
        "min_ms": min(medians),
        "max_ms": max(medians),
        "spread_pct": round(100 * (max(medians) / min(medians) - 1), 3),
        "median_ms": statistics.median(medians),
    }


def _tuning_loop(work: Path, build_dir: Path) -> list[str]:
    from croqq.processes.local import LocalCluster
    from croqq.store.paths import RunPaths

    env = {
        "CROQQ_RUN_DIR": str(work / "run"),
        "CROQQ_RESULTS_REPO": str(work / "results"),
        "CROQQ_BACKEND": "cuda",
        "CROQQ_PROBE": "nvml",
        "CROQQ_BUILD_DIR": str(build_dir),
        "CROQQ_BROKER_URL": "",
        "CROQQ_PIPELINE_DEPTH": "1",
        "CROQQ_BUILD_CONCURRENCY": "4",
    }
    with LocalCluster(env, log_level="INFO") as cluster:
        cluster.wait_gpus(timeout_s=120)
        sub = cluster.submit("f16", shape=LOOP_SHAPE, max_iter=LOOP_ITERS)
        cluster.wait_done(sub, timeout_s=420)
        gpu_type = sorted({s.split("/")[0] for s in cluster.snapshot(sub).shapes})[0]
    tsv = work / "results" / RunPaths(gpu_type, "cuda").results_tsv(f"f16_{LOOP_SHAPE}")
    return tsv.read_text().splitlines() if tsv.exists() else []


def _print_rows(console: Console, rows: list[dict[str, object]]) -> None:
    table = Table(title="reference kernels vs cuBLAS")
    for col in ("dsl", "dtype", "shape", "outcome", "TFLOPS", "cuBLAS", "ratio", "% of peak"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["dsl"]),
            str(r["dtype"]),
            str(r["shape"]),
            str(r["outcome"]),
            f"{r['tflops']:.1f}",
            f"{r['cublas_tflops'] or 0:.1f}",
            str(r["ratio"]),
            f"{r['hw_eff_pct']:.1f}",
        )
    console.print(table)


def _print_rest(console: Console, spread: dict[str, float], loop: list[str]) -> None:
    console.print(
        f"spread of {spread['runs']} measurements (f16 8192^3): {spread['spread_pct']:.2f}% "
        f"(min {spread['min_ms']:.4f} ms, max {spread['max_ms']:.4f} ms)"
    )
    console.print("tuning loop results.tsv:")
    for line in loop:
        console.print("  " + "  ".join(line.split("\t")[:6]))


@app.command("gpu-check")
def gpu_check(
    out: Path = typer.Option(Path("bench/gpu_check.json"), "--out", help="Where the JSON report goes."),
) -> None:
    """Check the real GPU path on this host, end to end: build every family's reference kernel of each
    dtype for three shapes (nvcc), verify each and time it against cuBLAS, measure the spread of repeated
    measurements of one kernel, then run a 3-iteration tuning loop through a local cluster. Takes minutes;
    needs an NVIDIA GPU with its driver and the CUDA compiler (without a GPU it exits 2 at once)."""
    from croqq.backends.cuda import CudaBackend
    from croqq.probes.nvml import nvml_available

    if not nvml_available():
        raise ConfigError(
            "no NVIDIA GPU found (NVML reports none): run gpu-check on a host with an NVIDIA GPU "
            "and its driver"
        )
    console = Console()
    settings = load_settings().model_copy(update={"backend": "cuda", "probe": "nvml"})
    manifest = load_manifest(settings.manifest)
    work = Path(tempfile.mkdtemp(prefix="croqq-gpu-check-"))
    build_dir = work / "build"
    backend = CudaBackend(manifest, settings.model_copy(update={"build_dir": build_dir}))
    gpu = _gpu(manifest, console)
    started = time.monotonic()
    artifacts = _build_all(backend)
    console.print(f"built {len(artifacts)} kernels in {time.monotonic() - started:.0f}s")
    rows = _versus_cublas(backend, gpu, artifacts)
    _print_rows(console, rows)  # before the tuning loop: a failure there keeps these
    spread = _spread(backend, gpu, artifacts[("cuda", "f16", (8192, 8192, 8192))])
    loop = _tuning_loop(work, build_dir)
    _print_rest(console, spread, loop)
    headline = {
        str(r["dsl"]): r["ratio"] for r in rows if r["dtype"] == "f16" and r["shape"] == "8192x8192x8192"
    }
    report = {
        "gpu": gpu.gpu_type,
        "seconds": round(time.monotonic() - started, 1),
        "kernels": rows,
        "f16_8192_ratio_to_cublas": headline,
        "spread": spread,
        "tuning_loop_rows": loop,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    ratios = ", ".join(f"{dsl} {ratio}" for dsl, ratio in headline.items())
    console.print(f"f16 8192^3 / cuBLAS: {ratios}; report in {out} ({report['seconds']} s)")
