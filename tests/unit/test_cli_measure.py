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
    dsl = "cuda"


class _CutlassState(_State):
    dsl = "cutlass"


def _measure(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "croqq", "measure", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "CROQQ_PROBE": "sim", "CROQQ_RUN_DIR": str(cwd / "run"), **env},
    )


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
    assert argv[:2] == ["croqq", "measure"] and "--source" in argv and "--requires" not in argv
    result = _measure(repo, *argv[2:])  # in the results repo: nothing of croqq's checkout is included
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["content_hash"] == cand.content_hash
    assert out["knobs"] == cand.knobs and out["outcome"] == "ok" and out["tflops"] > 0


def test_a_stored_cutlass_kernel_names_the_package_version_it_needs_and_another_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    manifest = load_manifest(ROOT / "kernels" / "manifest.json")
    pin = manifest.dsl("cutlass").build.pins
    assert pin == ["nvidia-cutlass==4.2.0.0"]
    kernel = RunPaths(_State.gpu_type, "cutlass").src(_State.key, 3, "cluster2", "cu")
    argv = shlex.split(run_command(_CutlassState(), kernel, pin))  # type: ignore[arg-type]
    assert argv[argv.index("--dsl") + 1] == "cutlass" and argv[argv.index("--requires") + 1] == pin[0]
    site = tmp_path / "site"  # an older nvidia-cutlass, found before the installed one
    info = site / "nvidia_cutlass-4.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cutlass\nVersion: 4.1.0\n")
    result = _measure(tmp_path, *argv[2:], PYTHONPATH=str(site))
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"croqq: error: {kernel} needs nvidia-cutlass 4.2.0.0, this host has 4.1.0: "
        "pip install 'nvidia-cutlass==4.2.0.0'"
    )  # refused before reading the source: the stored kernel is not even there
    assert not (tmp_path / "run" / "build").exists()


def test_measure_refuses_a_malformed_requirement_in_one_line(tmp_path: Path) -> None:
    result = _measure(tmp_path, "--key", "f16_256x256x256", "--requires", "nvidia-cutlass>=4")
    assert result.returncode == 2
    assert "--requires: 'nvidia-cutlass>=4' is not NAME==VERSION" in error_line(result.stderr)


def test_measure_refuses_a_missing_source_in_one_line(tmp_path: Path) -> None:
    result = _measure(tmp_path, "--key", "f16_256x256x256", "--source", "nope.cu")
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "--source" in line and "nope.cu" in line, result.stderr
