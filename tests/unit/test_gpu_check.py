"""`croqq gpu-check` on a host without an NVIDIA GPU refuses in one line and exits 2; its help says what it
checks and what it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from croqq.probes.nvml import nvml_available
from tests.output import error_line


def croqq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "croqq", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.skipif(nvml_available(), reason="this host has an NVIDIA GPU: gpu-check would really run")
def test_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = croqq("gpu-check", "--out", str(out))
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "croqq: error: no NVIDIA GPU found (NVML reports none): run gpu-check on a host with an NVIDIA GPU "
        "and its driver"
    )
    assert not out.exists()


def test_gpu_check_help_says_what_it_checks_and_what_it_needs() -> None:
    done = croqq("gpu-check", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for promise in ("cuBLAS", "tuning loop", "NVIDIA GPU", "--out"):
        assert promise in text, text
