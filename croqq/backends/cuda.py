"""The real GPU backend: nvcc builds, the timing harness on the claimed GPU, ncu profiles.

- **build** (build workers): the candidate's source goes to ``<build dir>/<key>-<hash>/cand.cu`` with its
  headers beside it (nothing is included from croqq's checkout) and is compiled with its flags (its own
  timeout, ``compile_timeout_s``); a failure is a BuildOutcome with the compiler's first error line and
  the log's tail, never an exception. A binary already built for the same content hash is reused. The
  binary's bytes go into the artifact store; the artifact string names them by sha256, not by path.
- **measure** (GPU workers): gets the binary from the artifact store (this host's cache, else Redis,
  verified by sha256, written executable to the cache; a GPU host never compiles), runs it with
  ``CUDA_VISIBLE_DEVICES=<uuid>`` under ``run_timeout_s`` in its own process group (a hang kills the
  group), parses the harness's JSON line (see ``kernels/README.md``) and records clocks, temperature and
  clock-event reasons before and after. Several artifacts are run alternately. A self-timed family's
  binary runs with its warm-up and repeat counts in its variables, and its own output is read
  (:mod:`croqq.backends.selftimed`).
- **profile**: ``ncu --csv`` with a fixed metric set on the candidate kernel; the bottleneck is classified
  from throughput and duration (:func:`classify`).
- **vendor_tflops**: the harness's ``--cublas`` mode on the same shape (none for a self-timed family).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from croqq.backends import selftimed
from croqq.backends._base import Backend, GpuContext, KernelRef
from croqq.backends.toolchain import knob_candidate, package_includes
from croqq.domain.knobs import Candidate, seed_knobs
from croqq.domain.manifest import RunSpec
from croqq.domain.records import Bottleneck, BuildOutcome, GpuSnapshot, Measurement, Outcome, Profile
from croqq.domain.shapes import Shape
from croqq.errors import HostError, InvalidRecordError

log = logging.getLogger(__name__)

NCU_METRICS = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__grid_size",
)
KERNEL_NAME = "regex:croqq_gemm"
STATUS_OUTCOME: dict[str, Outcome] = {
    "ok": "ok",
    "wrong_answer": "wrong_answer",
    "invalid": "invalid",
    "error": "crash",
}
LOG_TAIL = 4000
EXEC = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


@dataclass(frozen=True)
class Run:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str


def run_process(
    argv: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Run:
    """Run a command in its own process group; kill the whole group if it outlives ``timeout_s``."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return Run(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:  # a grandchild that left the group may still hold the pipes: do not wait for it
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return Run(None, out, err)


def write_sources(folder: Path, candidate: Candidate) -> Path:
    """``cand.cu`` and every header of the candidate's closure, side by side in ``folder``."""
    for name, text in candidate.headers.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    source = folder / "cand.cu"
    source.write_text(candidate.source, encoding="utf-8")
    return source


def parse_harness(stdout: str) -> dict[str, object]:
    """The harness's one JSON line (the last line of stdout that is a JSON object)."""
    for raw_line in reversed(stdout.strip().splitlines()):
        line = raw_line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                return data
    raise InvalidRecordError("the timing harness printed no JSON result line")


def _num(data: dict[str, object], key: str) -> float:
    value = data.get(key)
    try:
        return float(value) if isinstance(value, int | float | str) else 0.0
    except ValueError:
        return 0.0


def first_error(log_text: str) -> str:
    """The compiler's first error line (what an attempt record shows)."""
    for line in log_text.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    return (lines[-1].strip() if lines else "compile failed")[:300]


def parse_ncu_csv(text: str) -> dict[str, float]:
    """Metric name -> value for the (first) profiled kernel of ``ncu --csv`` output."""
    start = text.find('"ID"')
    if start < 0:
        raise InvalidRecordError("ncu printed no CSV table (is the kernel name right?)")
    metrics: dict[str, float] = {}
    first_id = None
    for row in csv.DictReader(io.StringIO(text[start:])):
        first_id = first_id or row.get("ID")
        if row.get("ID") != first_id or not row.get("Metric Name"):
            continue
        value = (row.get("Metric Value") or "").replace(",", "")
        with contextlib.suppress(ValueError):
            metrics[row["Metric Name"]] = float(value)
    if not metrics:
        raise InvalidRecordError("ncu CSV holds no numeric metric values")
    return metrics


def classify(metrics: dict[str, float]) -> Bottleneck:
    """memory / compute / latency / launch, from the fixed metric set (percentages of peak)."""
    duration_us = metrics.get("gpu__time_duration.sum", 0.0) / 1000.0
    compute = metrics.get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
    memory = max(
        metrics.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0.0),
        metrics.get("lts__throughput.avg.pct_of_peak_sustained_elapsed", 0.0),
    )
    if 0 < duration_us < 20:
        return "launch"
    if compute >= 60 and compute >= memory:
        return "compute"
    if memory >= 60:
        return "memory"
    return "latency"


class CudaBackend(Backend):
    name = "cuda"
    _last_binary: Path | None = None  # the shape's seed binary, for the cuBLAS reference run

    # -- build ----------------------------------------------------------------------------------------

    def compile_command(self, candidate: Candidate, source: Path, binary: Path) -> list[str]:
        """nvcc with the candidate's flags; its headers sit next to the source, so the only include
        folder is the build folder (never croqq's checkout)."""
        spec = self.manifest.dsl(candidate.dsl).build
        return [
            spec.compiler,
            *candidate.flags,
            f"-I{source.parent.resolve()}",
            *package_includes(spec, candidate.dsl),
            "-o",
            str(binary),
            str(source),
            *spec.libs,
        ]

    def _folder(self, key: str, content_hash: str) -> Path:
        return self.build_dir / f"{key}-{content_hash[:12]}"

    def build(self, shape: Shape, candidate: Candidate) -> BuildOutcome:
        spec = self.manifest.dsl(candidate.dsl)
        refused = self.rule_refusal(shape, candidate)
        if refused is not None:
            return refused
        folder = self._folder(shape.key, candidate.content_hash)
        binary = folder / "gemm"
        if binary.exists():
            return self.built(shape, candidate, binary.read_bytes(), "(cached)")
        with self.build_disk():
            folder.mkdir(parents=True, exist_ok=True)
            source = write_sources(folder, candidate)
        command = self.compile_command(candidate, source, folder / "gemm.tmp")
        if shutil.which(command[0]) is None:
            raise HostError(f"{command[0]} not found on this build host (install the CUDA toolkit)")
        timeout_s = max(self.settings.compile_timeout_s, spec.build.compile_timeout_s or 0.0)
        started = time.monotonic()
        run = run_process(command, timeout_s, env={"TMPDIR": str(folder.resolve())})
        seconds = round(time.monotonic() - started, 3)
        text = (run.stdout + run.stderr)[-LOG_TAIL:]
        if run.returncode != 0:  # a failed compile's partial output only takes space
            (folder / "gemm.tmp").unlink(missing_ok=True)
            self.check_compiler_disk(candidate, text)
        with self.build_disk():
            (folder / "build.log").write_text(text)
        if run.returncode is None:
            reason = f"compile timed out after {timeout_s:.0f}s"
            return BuildOutcome(ok=False, reason=reason, log=text, seconds=seconds)
        if run.returncode != 0:
            return BuildOutcome(ok=False, reason=first_error(text), log=text, seconds=seconds)
        with self.build_disk():
            os.replace(folder / "gemm.tmp", binary)
        return self.built(shape, candidate, binary.read_bytes(), text, seconds)

    def artifact_binary(self, artifact: str) -> str:
        """Where this build host compiled the artifact's binary (for `croqq kernels`; GPU steps fetch)."""
        ref = KernelRef.model_validate_json(artifact)
        return str((self._folder(ref.key, ref.content_hash) / "gemm").resolve())

    def _binary(self, shape: Shape, artifact: str) -> Path:
        """The artifact's binary, from the artifact store (verified), executable; never compiled here."""
        path = self.fetch_file(shape, artifact)
        mode = path.stat().st_mode
        if mode & EXEC != EXEC:
            path.chmod(mode | EXEC)
        return path

    # -- measure --------------------------------------------------------------------------------------

    def harness_args(self, gpu: GpuContext, shape: Shape) -> list[str]:
        spec = self.manifest.dtypes[shape.dtype]
        return [
            "--atol",
            str(spec.atol),
            "--rtol",
            str(spec.rtol),
            "--peak-tflops",
            str(self.peak_tflops(gpu.gpu_type, shape.dtype)),
        ]

    def _env(self, gpu: GpuContext) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": gpu.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        if self.settings.cublaslt:  # the harness reads it (kernels/README.md)
            env["CROQQ_CUBLASLT"] = self.settings.cublaslt
        return env

    def run_harness(
        self, gpu: GpuContext, shape: Shape, binary: Path, extra: Sequence[str] = ()
    ) -> Measurement:
        start = gpu.probe.snapshot(gpu.uuid)
        run = run_process(
            [str(binary), *self.harness_args(gpu, shape), *extra],
            self.settings.run_timeout_s,
            env=self._env(gpu),
        )
        end = gpu.probe.snapshot(gpu.uuid)
        raw = (run.stdout + "\n" + run.stderr)[-LOG_TAIL:]
        if run.returncode is None:
            detail = f"killed after {self.settings.run_timeout_s:.0f}s"
            return Measurement(outcome="hang", detail=detail, start=start, end=end, raw=raw)
        try:
            data = parse_harness(run.stdout)
        except InvalidRecordError as exc:
            why = f"exit {run.returncode}" if run.returncode >= 0 else f"signal {-run.returncode}"
            detail = f"{why}: {exc}; {run.stderr.strip()[-200:]}"
            return Measurement(outcome="crash", detail=detail, start=start, end=end, raw=raw)
        return self._measurement(gpu, shape, data, start, end, raw)

    def _measurement(
        self,
        gpu: GpuContext,
        shape: Shape,
        data: dict[str, object],
        start: GpuSnapshot,
        end: GpuSnapshot,
        raw: str,
    ) -> Measurement:
        outcome = STATUS_OUTCOME.get(str(data.get("status")), "crash")
        tflops = _num(data, "tflops") if outcome == "ok" else 0.0
        return Measurement(
            outcome=outcome,
            tflops=tflops,
            hw_eff_pct=self.hw_eff_pct(gpu.gpu_type, shape.dtype, tflops),
            median_ms=_num(data, "median_ms"),
            min_ms=_num(data, "min_ms"),
            max_ms=_num(data, "max_ms"),
            repeats=int(_num(data, "repeats")),
            verified=bool(data.get("verified")),
            detail=str(data.get("detail") or ""),
            start=start,
            end=end,
            raw=raw,
        )

    def run_self_timed(self, gpu: GpuContext, shape: Shape, binary: Path, spec: RunSpec) -> Measurement:
        """A self-timed family's binary, run with its counts set, its own output read."""
        start = gpu.probe.snapshot(gpu.uuid)
        run = run_process(
            [str(binary)], self.settings.run_timeout_s, env=self._env(gpu) | selftimed.env(spec)
        )
        end = gpu.probe.snapshot(gpu.uuid)
        raw = (run.stdout + "\n" + run.stderr)[-LOG_TAIL:]
        fields = {"timing": "self-reported", "start": start, "end": end, "raw": raw}
        if run.returncode is None:
            return Measurement(
                outcome="hang", detail=f"killed after {self.settings.run_timeout_s:.0f}s", **fields
            )
        if run.returncode != 0:
            why = f"exit {run.returncode}" if run.returncode > 0 else f"signal {-run.returncode}"
            return Measurement(outcome="crash", detail=f"{why}: {run.stderr.strip()[-200:]}", **fields)
        peak = self.peak_tflops(gpu.gpu_type, shape.dtype)
        try:
            return selftimed.measurement(run.stdout, spec, shape.flops, peak, (start, end), raw)
        except InvalidRecordError as exc:
            return Measurement(outcome="crash", detail=str(exc), **fields)

    def _run_spec(self, artifact: str) -> RunSpec:
        return self.manifest.dsl(KernelRef.model_validate_json(artifact).dsl).run

    def measure(self, gpu: GpuContext, shape: Shape, artifacts: Sequence[str]) -> list[Measurement]:
        runs = [(self._binary(shape, a), self._run_spec(a)) for a in artifacts]
        self._last_binary = runs[0][0] if runs[0][1].kind == "harness" else None  # cuBLAS: the harness's
        return [
            self.run_harness(gpu, shape, b)
            if spec.kind == "harness"
            else self.run_self_timed(gpu, shape, b, spec)
            for b, spec in runs
        ]

    def vendor_tflops(self, gpu: GpuContext, shape: Shape) -> float | None:
        binary = self._last_binary
        if binary is None:
            return None
        result = self.run_harness(gpu, shape, binary, ["--cublas", "--no-verify"])
        return result.tflops if result.outcome == "ok" else None

    # -- profile --------------------------------------------------------------------------------------

    def profile(self, gpu: GpuContext, shape: Shape, artifact: str) -> Profile:
        binary, spec = self._binary(shape, artifact), self._run_spec(artifact)
        ncu = shutil.which("ncu")
        if ncu is None:
            return Profile(bottleneck="unknown", raw="ncu not found on this GPU host")
        argv = [ncu, "--csv", "--metrics", ",".join(NCU_METRICS)]
        env = self._env(gpu)
        if spec.kind == "harness":  # croqq's kernel by name, one run of it
            argv += ["-k", KERNEL_NAME, "-c", "1", str(binary)]
            argv += ["--warmup", "0", "--repeats", "1", "--no-verify", "--seeds", "1"]
        else:  # the first kernel a self-timed binary launches, with no warm-up
            argv += ["-c", "1", str(binary)]
            env |= selftimed.env(spec, warmup=0, repeats=1)
        run = run_process(argv, self.settings.run_timeout_s * 4, env=env)
        text = run.stdout + run.stderr
        try:
            metrics = parse_ncu_csv(run.stdout)
        except InvalidRecordError as exc:
            log.warning("%s: profile failed: %s", shape.key, exc)
            return Profile(bottleneck="unknown", raw=text[-LOG_TAIL:])
        return Profile(bottleneck=classify(metrics), metrics=metrics, raw=text[-LOG_TAIL:])


def build_references(
    backend: CudaBackend, dims: tuple[int, int, int], seed: str = "reference", dsls: Sequence[str] = ("cuda",)
) -> dict[tuple[str, str], BuildOutcome]:
    """Compile every dtype's kernel of each dsl for one shape with its ``seed`` knobs ('reference' or
    'naive'), in parallel: (dsl, dtype) -> outcome (`make kernels`, `make gpu-check`)."""
    manifest = backend.manifest
    jobs = {}
    for dsl in dsls:
        for dtype in manifest.dsl(dsl).kernels:
            shape = Shape(dtype=dtype, m=dims[0], n=dims[1], k=dims[2])
            knobs = seed_knobs(manifest, dsl, dtype, seed)
            jobs[dsl, dtype] = (shape, knob_candidate(manifest, backend.settings, dsl, shape, knobs))
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(backend.build, *job) for key, job in jobs.items()}
    return {key: future.result() for key, future in futures.items()}
