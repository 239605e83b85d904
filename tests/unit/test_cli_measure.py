"""`croqq measure` reproduces one measurement on this host: the run_command stored in results.tsv is real."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from croqq.backends.sim import SimBackend
from croqq.domain.knobs import make_candidate, seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.shapes import parse_key
from croqq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_stored_run_command_runs_and_measures_the_same_candidate() -> None:
    manifest = load_manifest(ROOT / "kernels" / "manifest.json")
    shape = parse_key("f16_4096x8192x4096")
    knobs = seed_knobs(manifest, "cuda", "f16", "reference") | {"STAGES": 5}
    cand = make_candidate(manifest, "cuda", shape, knobs)
    command = SimBackend(manifest, Settings()).run_command(shape, cand)
    argv = shlex.split(command)
    assert argv[:2] == ["croqq", "measure"]
    result = subprocess.run(
        [sys.executable, "-m", "croqq", *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "CROQQ_PROBE": "sim"},
    )
    out = json.loads(result.stdout)
    assert out["knobs"] == cand.knobs and out["outcome"] == "ok" and out["tflops"] > 0
