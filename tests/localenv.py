"""What tests and benchmarks need to run croqq locally: the CROQQ_* settings of a cluster kept in one folder,
and the `croqq` command line run as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Short leases and health waits: a killed worker's step is dispatched again, and a lost GPU noticed, within
# seconds, so a test that kills things finishes in minutes.
FAST_RECOVERY = {
    "CROQQ_LEASE_TTL_S": "3",
    "CROQQ_RECONCILE_EVERY_S": "0.5",
    "CROQQ_HEALTH_WAIT_S": "2",
    "CROQQ_GPU_OFFLINE_S": "8",
    "CROQQ_RECHECK_EVERY_S": "2",
}


def run_dirs(root: Path) -> dict[str, str]:
    """The run folder (sockets, logs, health) and the results repo of a cluster kept under ``root``."""
    return {"CROQQ_RUN_DIR": str(root / "run"), "CROQQ_RESULTS_REPO": str(root / "results")}


def run_croqq(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`croqq *args` in a fresh process in the checkout with only the system PATH and ``env``; the finished
    process (exit code, stdout, stderr) once it exits, killed after ``timeout`` wall seconds."""
    return subprocess.run(
        [sys.executable, "-m", "croqq", *args],
        check=False,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
