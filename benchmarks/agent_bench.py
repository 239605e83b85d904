"""Source-level tuning with the agent proposer.

- ``source_run``: a real local cluster with the scripted agent as a jailed subprocess per IDEATE and every
  candidate compiled by nvcc, so broken edits fail for real; reports what was stored, attempts by reason,
  structural edits, and the share of stored best kernels that compile from a bare ``git clone`` of the
  results repo (not measured without nvcc).
- ``overhead``: croqq's own time per IDEATE step around the agent (workspace, answer, checks, hash) for a
  large kernel with a long history, against a small knob candidate in the same run; the agent itself is
  replaced by writing its answer, so its time is not counted."""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.cluster_bench import _percentile
from croqq.backends.toolchain import knob_candidate, package_includes
from croqq.domain.knobs import compile_flags, include_resolver, seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.records import HistoryEntry, Idea
from croqq.domain.shapes import Shape
from croqq.processes.local import LocalCluster
from croqq.proposers._base import ProposeContext
from croqq.proposers.agent import contract, workspace
from croqq.proposers.agent.presets import AgentRun
from croqq.proposers.agent.proposer import AgentProposer
from croqq.settings import Settings
from croqq.work import stats
from tests.localenv import run_dirs

log = logging.getLogger(__name__)
KERNEL_LINES = 2000
HISTORY = 100


def source_run(work: Path, shapes: int = 8, iterations: int = 6, dsl: str = "cuda") -> dict[str, object]:
    """The scripted agent through the whole cluster on ``dsl``, half the shapes f16 and half e4m3, every
    candidate really compiled where nvcc is; then the share of the best kernels that compile from a fresh
    clone of the results repo (with only the family's packages' include folders)."""
    real = shutil.which("nvcc") is not None  # every candidate really compiled at IMPLEMENT (sim_compile=nvcc)
    env = {
        "CROQQ_SIM_COMPILE": "nvcc" if real else "model",
        **run_dirs(work),
        "CROQQ_SIM_GPUS": "8",
        "CROQQ_TIME_SCALE": "0",
        "CROQQ_PROPOSER": "agent",
        "CROQQ_AGENT": "scripted",
        "CROQQ_IDEATE_CONCURRENCY": "4",
        "CROQQ_DSL": dsl,
    }
    with LocalCluster(env, log_level="WARNING") as cluster:
        cluster.wait_gpus()
        start = time.monotonic()
        subs = [cluster.submit(d, max_iter=iterations, limit=shapes // 2, dsl=dsl) for d in ("f16", "e4m3")]
        snaps = [cluster.wait_done(s, timeout_s=1800) for s in subs]
        seconds = time.monotonic() - start
        counters = stats.counters(cluster.client)
    stored = sum(s.total.iters_done for s in snaps)
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(work / "results"), str(clone)], check=True)
    kernels = sorted((clone / "kernels").glob("*/*_best.cu"))
    compiled = _compile_all(clone, kernels, dsl)
    structural = _structural_share(clone)
    reasons = _attempt_reasons(clone)
    log.info(
        "source run: %d iterations stored in %.1fs; %d/%d best kernels compile",
        stored,
        seconds,
        sum(compiled.values()),
        len(compiled),
    )
    return {
        "source_run_shapes": sum(s.total.done for s in snaps),
        "source_run_iterations_stored": stored,
        "source_run_seconds": round(seconds, 1),
        "source_run_sim_compile": "nvcc" if real else "model",
        "source_run_attempts": {
            reason: counters.get(f"attempts:{reason}", 0)
            for reason in ("compile", "check", "agent", "repeat")
        },
        "source_run_attempt_reasons": reasons,
        "source_run_decisions": {d: counters.get(d, 0) for d in ("KEEP", "DISCARD", "FAIL")},
        "source_run_structural_share": structural,
        "source_run_best_kernels": len(compiled),
        "source_run_best_kernels_compiled": sum(compiled.values()) if compiled else None,
        "source_run_best_compile_fraction": (
            round(sum(compiled.values()) / len(compiled), 3) if compiled and shutil.which("nvcc") else None
        ),
    }


def cutlass_source_run(work: Path) -> dict[str, object]:
    """:func:`source_run` of the cutlass family, 4 shapes x 4 iterations (its figures named cutlass_*)."""
    return {f"cutlass_{k}": v for k, v in source_run(work, shapes=4, iterations=4, dsl="cutlass").items()}


def _compile_all(clone: Path, kernels: list[Path], dsl: str) -> dict[str, bool]:
    """registry file -> compiles (nvcc sm_90a, -c, from the clone and the family's installed packages
    alone); {} without nvcc."""
    if shutil.which("nvcc") is None:
        log.warning("nvcc not found: the compile-from-a-fresh-clone fraction is not measured")
        return {}
    manifest = load_manifest(Settings().manifest)
    packages = package_includes(manifest.dsl(dsl).build, dsl)  # e.g. nvidia-cutlass's, nothing of croqq's

    def one(path: Path) -> tuple[str, bool]:
        dtype = path.name.split("_", 1)[0]
        flags = [*compile_flags(manifest, dsl, dtype), *packages]
        argv = ["nvcc", *flags, "-c", "-o", "/dev/null", path.name]
        run = subprocess.run(argv, cwd=path.parent, capture_output=True, text=True, check=False, timeout=900)
        if run.returncode != 0:
            log.warning("%s does not compile: %s", path.name, run.stderr.strip().splitlines()[-1:])
        return str(path.relative_to(clone)), run.returncode == 0

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, kernels))


def _attempt_reasons(clone: Path) -> dict[str, int]:
    """The stored attempts by reason: a knob rule (refused before any compile, by its why), a simulated
    compile error, or the compiler's own first error line (its first words)."""
    found: dict[str, int] = {}
    for path in clone.glob("tuning/*/*/shapes/*/attempts.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            reason = str(record.get("reason", ""))
            if reason.startswith("knob rule: "):
                label = reason.split(" (rule:", 1)[0]
            elif reason.startswith("simulated nvcc: "):
                label = "simulated compile error"
            else:
                label = f"{record.get('kind')}: " + " ".join(reason.split()[:6])
            found[label] = found.get(label, 0) + 1
    return dict(sorted(found.items(), key=lambda item: -item[1]))


def _structural_share(clone: Path) -> float:
    changes = [
        json.loads(line).get("idea", {}) or {}
        for path in clone.glob("tuning/*/*/shapes/*/rounds.raw.jsonl")
        for line in path.read_text().splitlines()
    ]
    kinds = [c.get("change") for c in changes if c]
    return round(sum(1 for k in kinds if k == "structural") / len(kinds), 3) if kinds else 0.0


# -- overhead ---------------------------------------------------------------------------------------


def _big_source(base: str, lines: int) -> str:
    """The knob candidate taken over (kernel body inline) and grown to ``lines`` with device helpers."""
    core = (Settings().kernels_dir / "kernels" / "cuda" / "gemm_core.cuh").read_text()
    owned = base.replace('#include "gemm_f16.cuh"', f'#define CROQQ_F16 1\n{core}\n#include "harness.cuh"')
    extra: list[str] = []
    i = 0
    while len(owned.splitlines()) + len(extra) < lines:
        extra += [
            f"__device__ __forceinline__ float croqq_bench_helper_{i}(float x, float y) {{",
            f"  return fmaf(x, {i + 1}.0f, y);  // helper {i}",
            "}",
        ]
        i += 1
    return owned.replace('#include "harness.cuh"', "\n".join(extra) + '\n#include "harness.cuh"')


def _context(source: str, history: int) -> ProposeContext:
    manifest = load_manifest(Settings().manifest)
    shape = Shape(dtype="f16", m=4096, n=8192, k=4096)
    entries = [
        HistoryEntry(
            iteration=i,
            after_iter=i,
            summary=f"iteration {i}: unroll the k-slice loop twice to cut register pressure (memory bound)",
            decision="DISCARD" if i % 7 else "KEEP",
            tflops=400.0 + i,
            change="structural" if i % 3 else "knobs",
            proposer="scripted",
            error="" if i % 11 else "max |err| 3.1 > atol 0.05 at C[12,40]",
        )
        for i in range(history)
    ]
    return ProposeContext(
        shape=shape,
        dsl="cuda",
        gpu_type="sm90_Simulated_H100_SXM",
        iteration=history,
        knob_space=manifest.dsl("cuda").knobs,
        best_knobs=seed_knobs(manifest, "cuda", "f16", "reference"),
        best_source=source,
        best_tflops=500.0,
        baseline_tflops=400.0,
        peak_tflops=989.4,
        strategy="refine",
        consecutive_discards=2,
        phase="structural",
        phase_reason="bench",
        bottleneck="memory",
        profile_metrics={"dram__throughput.avg.pct_of_peak_sustained_elapsed": 81.0},
        tried=[f"{i:064x}" for i in range(history)],
        history=entries,
    )


def _step_ms(proposer: AgentProposer, ctx: ProposeContext) -> float:
    """croqq's own milliseconds for one IDEATE around an agent whose answer is written directly."""
    resolver = include_resolver(proposer.manifest, ctx.dsl, proposer.settings.kernels_dir)
    t0 = time.perf_counter()
    ws = workspace.build(ctx, proposer.manifest, resolver)
    t1 = time.perf_counter()
    edited = ctx.best_source.replace("#define STAGES 4", "#define STAGES 5")
    (ws.root / contract.CANDIDATE).write_text(edited)
    (ws.root / contract.SUMMARY).write_text("raise STAGES 4->5 to hide memory latency\n")
    t2 = time.perf_counter()
    answer = proposer.judge(ctx, ws, AgentRun(exit_code=0, stdout="", stderr="", wall_s=0.0), resolver)
    ws.remove()
    t3 = time.perf_counter()
    assert isinstance(answer, Idea), answer
    return 1000.0 * ((t1 - t0) + (t3 - t2))


def overhead(samples: int = 200) -> dict[str, float | int]:
    settings = Settings(proposer="agent", agent="scripted")
    manifest = load_manifest(settings.manifest)
    proposer = AgentProposer(manifest, settings)
    knobs = seed_knobs(manifest, "cuda", "f16", "reference")
    small = knob_candidate(manifest, settings, "cuda", Shape(dtype="f16", m=4096, n=8192, k=4096), knobs)
    big = _big_source(small.source, KERNEL_LINES)
    out: dict[str, float | int] = {"agent_overhead_kernel_lines": len(big.splitlines())}
    for name, source, history in (("big", big, HISTORY), ("small", small.source, 1)):
        ctx = _context(source, history)
        _step_ms(proposer, ctx)  # warm the header cache, as a running worker has it
        times = [_step_ms(proposer, ctx) for _ in range(samples)]
        out[f"agent_overhead_{name}_ms_p50"] = round(statistics.median(times), 2)
        out[f"agent_overhead_{name}_ms_p99"] = round(_percentile(times, 99), 2)
    log.info("agent overhead: %s", out)
    return out
