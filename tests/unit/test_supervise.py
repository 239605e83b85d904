"""The supervisor restarts a child that died, but not one that refused its configuration (exit 2: an
ideate worker whose agent executable is missing would otherwise restart forever)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from croqq.processes.supervise import EXIT_CONFIG, Child, Supervisor


def test_a_crashed_child_is_restarted_a_refused_one_is_not(tmp_path: Path) -> None:
    crash = Child("crash", [sys.executable, "-c", "raise SystemExit(1)"], {}, tmp_path / "crash.log")
    refused = Child(
        "refused", [sys.executable, "-c", f"raise SystemExit({EXIT_CONFIG})"], {}, tmp_path / "r.log"
    )
    sup = Supervisor([crash, refused])
    sup.start_all()
    restarted: list[str] = []
    deadline = time.monotonic() + 10
    while "crash" not in restarted and time.monotonic() < deadline:
        time.sleep(0.2)
        restarted += sup.poll()
    time.sleep(1.0)
    restarted += sup.poll()
    assert "crash" in restarted and "refused" not in restarted
    assert refused.history == [EXIT_CONFIG] and not refused.restart
    sup.stop(grace_s=2.0)
