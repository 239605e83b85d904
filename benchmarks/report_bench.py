"""`croqq report` on a full results repo (every scheduled shape, 30 iterations each), as a user runs it.

    python -m benchmarks.report_bench <work dir>      # prints one JSON object; reuses <work dir>'s fixture

The fixture goes through the real writer (:func:`tests.samples.sample_requests`, each request given what a
GPU worker adds: :func:`as_measured`); it takes minutes, so it is built once per work dir. The figure is the
wall time of ``python -m croqq report`` in a fresh interpreter, best of ``ROUNDS``, pinned to two CPUs
where the machine has more."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from croqq.store.gitrepo import GitRepo
from croqq.store.schema import StoreRequest
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests, schedule_keys

log = logging.getLogger(__name__)

GPU = "sm90_NVIDIA_H200"
DSL = "cuda"
ITERS = 30
GPUS = 8
SEED = 11
ROUNDS = 2


def as_measured(
    requests: Iterable[StoreRequest], gpus: int = GPUS, seed: int = SEED
) -> Iterator[StoreRequest]:
    """The requests as a fleet of ``gpus`` GPUs would have sent them: each shape on one GPU (by its
    order), the baseline's vendor TFLOPS, and each measurement's (and profile's) GPU interval, ending
    at the round's timestamp and filling most of the time since that GPU's previous step."""
    rng = random.Random(seed)
    gpu_of: dict[str, str] = {}
    last: dict[str, float] = {}
    for req in requests:
        rnd = req.round
        if rnd is None:
            yield req
            continue
        uuid = gpu_of.setdefault(req.key, f"GPU-{len(gpu_of) % gpus:08x}-0000-4000-8000-sim")
        end = dt.datetime.fromisoformat(rnd.timestamp).timestamp()
        busy = max(1.0, (end - last.get(uuid, end - 60.0)) * rng.uniform(0.55, 0.95))
        last[uuid] = end
        vendor = round(rnd.tflops * rng.uniform(1.1, 1.7), 3) if rnd.iteration == 0 else None
        measure = rnd.measure.model_copy(
            update={
                "gpu_uuid": uuid,
                "vendor_tflops": vendor,
                "gpu_started_at": end - busy,
                "gpu_busy_s": busy,
            }
        )
        update: dict[str, object] = {"gpu_uuid": uuid, "measure": measure}
        if rnd.profile is not None:  # the PROFILE step just before this measurement
            spans = {"gpu_started_at": end - 1.25 * busy, "gpu_busy_s": 0.2 * busy}
            update["profile"] = rnd.profile.model_copy(update=spans)
        yield req.model_copy(update={"round": rnd.model_copy(update=update)})


def requests(
    keys: list[str], iters: int, seed: int = SEED, max_iter: int | None = None
) -> list[StoreRequest]:
    """``iters`` iterations of each key (by default the last one completes the shape)."""
    done_at = iters - 1 if max_iter is None else max_iter
    return list(as_measured(sample_requests(GPU, DSL, keys, iters, seed, max_iter=done_at)))


def write(path: Path, reqs: Iterable[StoreRequest]) -> None:
    """Store ``reqs`` through the real writer, one ``apply`` (one commit) each."""
    quiet = logging.getLogger("croqq.store")  # one INFO line per commit would flood the benchmark's log
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        writer = ResultsWriter(GitRepo(path, sync_worktree=False, fsync=False))
        for req in reqs:
            writer.apply(req)
        writer.close()
    finally:
        quiet.setLevel(level)


def fixture(path: Path, shapes: int = 268, iters: int = ITERS) -> dict[str, float]:
    """The benchmark's results repo at ``path`` (built unless a marker says it already is)."""
    marker = path.with_name(path.name + ".fixture.json")
    wanted = {"shapes": shapes, "iters": iters, "seed": SEED}
    if marker.exists() and path.is_dir():
        info: dict[str, float] = json.loads(marker.read_text())
        if {k: info.get(k) for k in wanted} == wanted:
            return info
    shutil.rmtree(path, ignore_errors=True)
    reqs = requests(schedule_keys(shapes), iters)
    started = time.perf_counter()
    write(path, reqs)
    info = {
        **wanted,
        "iterations": sum(r.kind == "iteration" for r in reqs),
        "attempts": sum(r.kind == "attempt" for r in reqs),
        "build_s": round(time.perf_counter() - started, 1),
        "git_bytes": sum(f.stat().st_size for f in (path / ".git").rglob("*") if f.is_file()),
    }
    marker.write_text(json.dumps(info))
    return info


def _two_cores() -> list[str]:
    taskset = shutil.which("taskset")
    return [taskset, "-c", "0,1"] if taskset and (os.cpu_count() or 1) > 2 else []


def time_report(repo: Path, out: Path) -> float:
    """Wall seconds of one `croqq report` in a fresh interpreter (its stderr is not a terminal)."""
    cmd = [*_two_cores(), sys.executable, "-m", "croqq", "report", "--repo", str(repo), "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def run(work_dir: Path) -> dict[str, float]:
    work_dir.mkdir(parents=True, exist_ok=True)
    repo, out = work_dir / "results", work_dir / "report"
    log.info(
        "report fixture: 268 shapes x %d iterations through the writer (minutes, once per work dir)", ITERS
    )
    info = fixture(repo)
    seconds = min(time_report(repo, out) for _ in range(ROUNDS))
    return {
        "report_seconds_268_shapes": round(seconds, 2),
        "report_fixture_shapes": info["shapes"],
        "report_fixture_iterations": info["iterations"],
        "report_fixture_attempts": info["attempts"],
        "report_fixture_git_bytes": info["git_bytes"],
        "report_fixture_build_s": info["build_s"],
        "report_html_bytes": (out / "index.html").stat().st_size,
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m benchmarks.report_bench <work dir>", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(run(Path(sys.argv[1])), indent=2))
