"""A real local cluster with the replay backend tunes a shape on a recorded landscape: every process (the
`croqq submit` command, coordinator, build and GPU workers, the writer) works from the cache file's knob
space, configurations the cache does not hold are stored as attempts, and the results repo validates."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.backends.landscape import load_landscape
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths
from croqq.store.render import parse_tsv
from croqq.store.validate import validate_repo

pytestmark = pytest.mark.slow
XGEMM = Path(__file__).resolve().parents[2] / "landscapes" / "xgemm_4096_rtx2080ti.kerneltuner.json.gz"
KEY = "f16_4096x4096x4096"
RUN = "tuning/sm90_Simulated_H100_SXM/replay"
PATHS = RunPaths("sm90_Simulated_H100_SXM", "replay")
Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture


@pytest.mark.timeout(1800)
def test_a_replay_cluster_tunes_a_shape_on_the_recorded_landscape(
    cluster_env: dict[str, str], croqq: Cli
) -> None:
    env = {**cluster_env, "CROQQ_BACKEND": "replay", "CROQQ_REPLAY_CACHE": str(XGEMM), "CROQQ_SIM_GPUS": "1"}
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        done = croqq(env, "submit", "--dtype", "f16", "--shape", "4096x4096x4096", "--max-iter", "10")
        assert done.returncode == 0, done.stderr
        submission = re.search(r"\bas (sub-\S+):", done.stdout)
        assert submission is not None and "/replay as" in done.stdout, done.stdout
        snap = cluster.wait_done(submission.group(1), timeout_s=600)
        assert snap.total.done == 1 and snap.total.iters_done == 11
    repo = Path(env["CROQQ_RESULTS_REPO"])
    rows = parse_tsv((repo / PATHS.results_tsv(KEY)).read_text())
    assert [r.iter for r in rows] == list(range(11)) and rows[0].decision == "BASELINE"
    landscape = load_landscape(XGEMM)
    worst, best = max(r.time_ms for r in landscape.records.values()), landscape.optimum[1]
    flops = 2.0 * 4096**3
    for row in rows:
        if row.decision in ("BASELINE", "KEEP", "DISCARD"):
            assert flops / (worst * 1.5e9) <= row.tflops <= flops / (best * 0.5e9)  # a recorded time
    attempts = [json.loads(line) for line in (repo / PATHS.attempts(KEY)).read_text().splitlines()]
    assert attempts and all("not in the recorded landscape" in json.dumps(a) for a in attempts)
    srcs = sorted((repo / PATHS.srcs_dir(KEY)).glob("iter*.h"))
    assert len(srcs) == 11 and "#define MWG" in srcs[0].read_text()
    assert validate_repo(repo, "replay") == []
    check = croqq(env, "validate", "--dsl", "replay")
    assert check.returncode == 0 and "results repo is valid" in check.stdout, check.stdout + check.stderr
