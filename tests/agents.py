"""What the agent-proposer tests share: a shape, its IDEATE context, settings for the scripted agent, the
jail modes this host can run (each skipped with a reason where it cannot), and the fixture agents."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.records import HistoryEntry
from croqq.domain.shapes import Shape
from croqq.proposers._base import ProposeContext
from croqq.proposers.agent import jail
from croqq.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
SHAPE = Shape(dtype="f16", m=4096, n=8192, k=4096)
MANIFEST = load_manifest(ROOT / "kernels" / "manifest.json")
PASS_ENV = "CROQQ_SCRIPTED_MISBEHAVE,CROQQ_SCRIPTED_TARGET"

JAILS = [  # the jails; .ci/run installs bubblewrap, and runs as root (unshare)
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(not jail.bwrap_works(), reason="bubblewrap unusable here")
    ),
    pytest.param(
        "unshare", marks=pytest.mark.skipif(not jail.unshare_works(), reason="no mount/PID namespaces here")
    ),
]
MODES = ["none", *JAILS]


def settings(**kw: object) -> Settings:
    base: dict[str, object] = {"proposer": "agent", "agent": "scripted", "agent_env": PASS_ENV}
    return Settings(**(base | kw))  # type: ignore[arg-type]


def fixture_agent(script: str, *args: object, **kw: object) -> Settings:
    """Settings that run tests/fixtures/agents/<script> as the agent (``agent=command``)."""
    words = [sys.executable, "-I", str(FIXTURES / script), *map(str, args)]
    return settings(agent="command", agent_command=" ".join(words), **kw)


def context(
    phase: str = "knobs", tried: list[str] | None = None, dsl: str = "cuda", iteration: int = 2
) -> ProposeContext:
    knobs = seed_knobs(MANIFEST, dsl, "f16", "reference")
    best = knob_candidate(MANIFEST, Settings(), dsl, SHAPE, knobs)
    history = [
        HistoryEntry(iteration=0, summary="baseline (seed kernel)", decision="BASELINE", tflops=400.0),
        HistoryEntry(
            iteration=1, summary="raise STAGES 4->5", decision="DISCARD", tflops=390.0, change="knobs"
        ),
    ]
    return ProposeContext(
        shape=SHAPE,
        dsl=dsl,
        gpu_type="sm90_Simulated_H100_SXM",
        iteration=iteration,
        knob_space=MANIFEST.dsl(dsl).knobs,
        best_knobs=knobs,
        best_source=best.source,
        best_tflops=400.0,
        baseline_tflops=400.0,
        peak_tflops=989.4,
        strategy="refine",
        consecutive_discards=1,
        phase=phase,  # type: ignore[arg-type]
        phase_reason="test",
        bottleneck="memory",
        profile_metrics={"dram__throughput.avg.pct_of_peak_sustained_elapsed": 81.0},
        tried=tried or [best.content_hash],
        history=history,
    )
