"""A small `croqq stress` run, every fault kind, through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from croqq.chaos.faults import KINDS

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(3600)  # the run's own --timeout stretches with the machine's load
def test_stress_run_with_every_fault_kind_loses_and_duplicates_nothing(short_tmp: Path) -> None:
    stale = short_tmp / "ci" / "cluster" / "results" / "left-by-an-earlier-run"
    stale.parent.mkdir(parents=True)
    stale.write_text("a rerun of the same name starts afresh")
    args = [
        "stress",
        "--agents-per-dsl",
        "16",
        "--round-target",
        "8",
        "--seed",
        "3",
        "--run-name",
        "ci",
        "--fault-count",
        str(len(KINDS)),
        "--sim-gpus",
        "4",
        "--lease-ttl",
        "3",
        "--timeout",  # unloaded seconds (croqq.patience): fails only a run that never finishes
        "900",
        "--out",
        str(short_tmp),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "croqq", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((short_tmp / "ci" / "summary.json").read_text())
    assert (summary["rounds_stored"], summary["rounds_lost"], summary["duplicates"]) == (128, 0, 0)
    assert summary["validate_ok"] is True and summary["ok"] is True
    assert sum(summary["faults_injected"].values()) + len(summary["faults_not_landed"]) == len(KINDS)
    assert set(summary["faults_injected"]) == set(KINDS), summary["faults_not_landed"]
    rows = (short_tmp / "ci" / "summary.tsv").read_text().splitlines()
    assert rows[0].startswith("index\tat_round\tkind") and len(rows) == len(KINDS) + 1
    assert "every invariant held" in (short_tmp / "ci" / "analysis.md").read_text()
    assert not stale.exists()
