"""The benchmark history: one JSON line per run of ``python -m benchmarks``, appended to
``benchmarks/history.jsonl`` and committed with the code it measured, so that a regression between two
commits is a diff of two lines, not a table copied into prose."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "benchmarks" / "history.jsonl"


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def source_state(root: Path = ROOT, history: Path = HISTORY) -> dict[str, Any]:
    """The commit measured and whether tracked files differ from it (the history file itself aside):
    a dirty line measured code that no commit holds. Both null outside a git checkout."""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    spec = (
        [".", f":(exclude){history.resolve().relative_to(root)}"] if history.is_relative_to(root) else ["."]
    )
    changes = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *spec)
    return {"commit": commit, "dirty": None if changes is None else bool(changes)}


def machine() -> dict[str, Any]:
    """What the figures depend on besides the code."""
    return {
        "machine": f"{platform.node()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def append(
    history: Path, parts: list[str], figures: dict[str, Any], root: Path = ROOT, date: str | None = None
) -> dict[str, Any]:
    """Append one line for a run of ``parts`` with its ``figures``; returns the line's object."""
    line = {
        **source_state(root, history),
        "date": date or utc_now(),
        **machine(),
        "parts": parts,
        "figures": figures,
    }
    history.parent.mkdir(parents=True, exist_ok=True)
    with history.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
    return line
