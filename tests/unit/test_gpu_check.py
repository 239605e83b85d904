"""`make gpu-check` on a host without an NVIDIA GPU says so in one line and exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from croqq.probes.nvml import nvml_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(nvml_available(), reason="this host has an NVIDIA GPU: gpu-check would really run")
def test_gpu_check_without_a_gpu_says_so_and_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "croqq.bench.gpu_check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    line = "gpu-check: no NVIDIA GPU found (NVML reports none); run it on a GPU host"
    assert line in done.stdout.splitlines(), done.stdout
