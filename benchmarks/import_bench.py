"""`croqq import` as a user runs it: wall time of ``python -m croqq import`` (a fresh interpreter) on a
2,000-row log of one shape and on a tree of 100 shapes x 20 rows (:mod:`tests.importer_trees`: resumable
f16 logs, each row's kernel source in the tree, every 12th row a compile failure), then the same tree
again (idempotent: nothing added).

    python -m benchmarks.import_bench <work dir>      # prints one JSON object
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.importer_trees import write_big_log, write_many_shapes

GPU = "sm90_NVIDIA_H200"
SRC_ROOT = Path(__file__).resolve().parents[1]


def _import(tree: Path, repo: Path) -> tuple[float, dict[str, int]]:
    """Seconds of one `croqq import --json`, and what it wrote (iterations, attempts, logs)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "croqq", "import", str(tree), "--into", str(repo), "--gpu", GPU, "--json"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC_ROOT)},
    )
    seconds = time.perf_counter() - started
    logs = json.loads(proc.stdout)
    written = {
        "logs": len(logs),
        "iterations": sum(log["written"]["iterations"] for log in logs),
        "attempts": sum(log["written"]["attempts"] for log in logs),
    }
    return seconds, written


def run(work_dir: Path) -> dict[str, float | int]:
    shutil.rmtree(work_dir, ignore_errors=True)
    big, many = work_dir / "big", work_dir / "many"
    write_big_log(big, rows=2000)
    write_many_shapes(many, shapes=100, rows=20)
    big_s, big_written = _import(big, work_dir / "repo-big")
    many_s, many_written = _import(many, work_dir / "repo-many")
    again_s, again_written = _import(many, work_dir / "repo-many")
    return {
        "import_2000_rows_s": round(big_s, 2),
        "import_2000_rows_iterations": big_written["iterations"],
        "import_2000_rows_attempts": big_written["attempts"],
        "import_100_shapes_s": round(many_s, 2),
        "import_100_shapes_iterations": many_written["iterations"],
        "import_100_shapes_attempts": many_written["attempts"],
        "reimport_100_shapes_s": round(again_s, 2),
        "reimport_100_shapes_records": again_written["iterations"] + again_written["attempts"],
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m benchmarks.import_bench <work dir>", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(run(Path(sys.argv[1])), indent=2))
