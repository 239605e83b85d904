"""`croqq up`: a whole local cluster in one command (the README's demo).

Starts an embedded Redis (AOF on) under the run folder unless CROQQ_BROKER_URL is set, then the
coordinator, the writer, beat, a build and an ideate worker and one worker per GPU (simulated GPUs when
NVML finds none), all supervised: restarted if they die, Redis included (same AOF and socket, so the
others reconnect), and killed with the supervisor if it is killed (parent-death signal). With --dtype it
submits and shows live progress; Ctrl-C stops everything cleanly, and running it again resumes where it
stopped. A second `croqq up` on the same run folder refuses while this one runs; after this one was
killed, it stops whatever was left running (named in one line) before starting its own.
"""

from __future__ import annotations

import time

import typer
from rich.console import Console

from croqq.cli import app
from croqq.cli.common import CANDIDATES_HELP, candidates_or_default, load_settings
from croqq.cli.live import stop_on_signals
from croqq.domain.manifest import DEFAULT_MODE
from croqq.processes.local import LocalCluster


@app.command()
def up(
    dtype: str | None = typer.Option(None, "--dtype", help="Also submit this dtype (f16 | e4m3 | all)."),
    shape: str | None = typer.Option(None, "--shape", help="With --dtype: only this MxNxK."),
    max_iter: int | None = typer.Option(
        None, "--max-iter", min=1, help="With --dtype: iterations per shape."
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="With --dtype: only the first N shapes of the schedule (by priority)."
    ),
    candidates: int | None = typer.Option(None, "--candidates", help="With --dtype: " + CANDIDATES_HELP),
    mode: str = typer.Option(
        DEFAULT_MODE, "--mode", help="With --dtype: from_current_best (cutlass) | from_scratch (cuda)."
    ),
    sim_gpus: int | None = typer.Option(
        None, "--sim-gpus", min=1, help="Simulated GPUs (when NVML finds none)."
    ),
    exit_when_done: bool = typer.Option(
        False, "--exit-when-done", help="Stop the cluster once the submission is done."
    ),
    log_level: str = typer.Option(
        "INFO", "--log-level", help="Level of the processes' logs (in <run dir>/logs)."
    ),
) -> None:
    """Start a whole local cluster (embedded Redis, simulated GPUs without NVML); optionally submit, watch."""
    from croqq.backends import backend_manifest
    from croqq.domain.schedule import build_schedule
    from croqq.domain.shapes import parse_dims

    settings = load_settings()
    count = candidates_or_default(candidates, settings)
    if dtype:  # refuse bad input before anything starts
        manifest = backend_manifest(settings)  # with backend=replay: the cache file is read here
        build_schedule(manifest, dtype, only=parse_dims(shape) if shape else None)
        manifest.mode(mode)
    env = {
        "CROQQ_RUN_DIR": str(settings.run_dir.resolve()),
        "CROQQ_RESULTS_REPO": str(settings.results_repo.resolve()),
        "CROQQ_MANIFEST": str(settings.manifest.resolve()),
    }
    if sim_gpus:
        env["CROQQ_SIM_GPUS"] = str(sim_gpus)
    cluster = LocalCluster(env, log_level)
    console = Console()
    stop_on_signals()
    interrupted = False
    cluster.start()  # refuses while a live cluster holds the run folder; stops a dead one's leftovers
    try:
        note = cluster.claim.note() if cluster.claim is not None else None
        if note:
            console.print(note)
        console.print(
            f"croqq cluster up: {len(cluster.gpu_names)} GPU worker(s), logs in "
            f"{cluster.settings.run_dir / 'logs'}; Ctrl-C stops it"
        )
        submission = None
        if dtype:
            cluster.wait_gpus()
            submission = cluster.submit(dtype, shape, max_iter, mode, limit=limit, candidates=count)
            console.print(f"submitted as {submission}")
            console.print(_expected(cluster, submission, count), soft_wrap=True)
        interrupted = _watch(cluster, submission, exit_when_done, console)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        console.print("stopping the cluster ...")
        cluster.stop()
    if interrupted:
        console.print("stopped; run the same command again to resume where it stopped")


def _expected(cluster: LocalCluster, submission: str, candidates: int) -> str:
    """The line that says how long the submission should take (:func:`croqq.work.progress.expected_s`)."""
    from croqq.cli.view import duration
    from croqq.work.progress import CPU_S_PER_ITERATION, expected_s

    total = cluster.snapshot(submission).total
    left = total.iters_total - total.iters_done
    seconds = expected_s(cluster.settings, left, len(cluster.gpu_names), candidates)
    if seconds is None:
        return f"{left} iterations to store; the ETA follows the measured rate once there is one"
    return (
        f"{left} iterations to store: expected duration about {duration(seconds)} "
        f"(~{CPU_S_PER_ITERATION:g} CPU s per iteration over this machine's cores, or the simulated GPU "
        "time if longer); the ETA then follows the measured rate"
    )


def _watch(cluster: LocalCluster, submission: str | None, exit_when_done: bool, console: Console) -> bool:
    """Live progress until done (with exit_when_done) or Ctrl-C; returns True if interrupted."""
    from croqq.cli.live import LiveProgress
    from croqq.cli.view import summary_table
    from croqq.work.progress import RateMeter

    meter = RateMeter()
    snap = cluster.snapshot(submission)
    log = cluster.settings.run_dir / "logs" / "progress.log"
    progress = LiveProgress(console, cluster.settings.progress_every_s, log)
    try:
        with progress:
            while True:
                meter.add(snap)
                done = exit_when_done and snap.finished
                progress.update(snap, meter, title=f"croqq ({progress.elapsed_s:.0f}s)", final=done)
                if done:
                    break
                time.sleep(0.5)
                cluster.poll()
                snap = cluster.snapshot(submission)
    except KeyboardInterrupt:
        return True
    console.print(summary_table(snap))
    console.print(f"done in {progress.elapsed_s:.1f}s: {snap.total.iters_done} iterations stored")
    return False
