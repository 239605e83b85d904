"""`croqq measure --source` reproduces a stored measurement from the results repo's files alone: the
run_command stored in results.tsv is real."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.shapes import parse_key
from croqq.domain.source import stored_files
from croqq.settings import Settings
from croqq.store.paths import RunPaths
from croqq.work.persist import run_command
from tests.output import error_line

ROOT = Path(__file__).resolve().parents[2]


class _State:
    gpu_type = "sm90_Simulated_H100_SXM"
    key = "f16_4096x8192x4096"


def test_stored_run_command_measures_the_same_candidate_from_the_repo_alone(tmp_path: Path) -> None:
    manifest = load_manifest(ROOT / "kernels" / "manifest.json")
    shape = parse_key(_State.key)
    knobs = seed_knobs(manifest, "cuda", "f16", "reference") | {"STAGES": 5}
    cand = knob_candidate(manifest, Settings(), "cuda", shape, knobs)
    root = f"tuning/{_State.gpu_type}/cuda"
    kernel = RunPaths(_State.gpu_type, "cuda").src(shape.key, 1, "stages5", "cu")
    repo = tmp_path / "results"
    for path, text in stored_files(root, kernel, cand.source, cand.headers).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    argv = shlex.split(run_command(_State(), kernel))  # type: ignore[arg-type]
    assert argv[:2] == ["croqq", "measure"] and "--source" in argv
    result = subprocess.run(
        [sys.executable, "-m", "croqq", *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,  # the results repo: nothing of croqq's checkout is included
        env={"PATH": "/usr/bin:/bin", "CROQQ_PROBE": "sim", "CROQQ_RUN_DIR": str(tmp_path / "run")},
    )
    out = json.loads(result.stdout)
    assert out["content_hash"] == cand.content_hash
    assert out["knobs"] == cand.knobs and out["outcome"] == "ok" and out["tflops"] > 0


def test_measure_refuses_a_missing_source_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "croqq", "measure", "--key", "f16_256x256x256", "--source", "nope.cu"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "CROQQ_PROBE": "sim", "CROQQ_RUN_DIR": str(tmp_path / "run")},
    )
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "--source" in line and "nope.cu" in line, result.stderr
