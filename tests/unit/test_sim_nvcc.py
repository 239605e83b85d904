"""CROQQ_SIM_COMPILE=nvcc: the sim backend really compiles each candidate for sm_90a, then models it.

Three real compiles (~20-40 s each on a small build host): the reference knob candidate, one scripted
structural edit, and one scripted edit with a slip in it (a typo'd identifier), which nvcc refuses.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from test_sim_source import BIG, layout, manifest, propose_in, reference, scripted

from croqq.backends.sim import SimBackend
from croqq.backends.toolchain import candidate_of, knob_candidate
from croqq.domain.knobs import Candidate
from croqq.domain.records import BuildOutcome
from croqq.settings import Settings

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (CROQQ_SIM_COMPILE=nvcc)"),
    pytest.mark.timeout(3600),
]
# a compile on a loaded 2-core host can take many times the product's 300 s default
SETTINGS = Settings(time_scale=0.0, sim_compile="nvcc", compile_timeout_s=3600.0)
TYPO = scripted().BROKEN[0][1]  # cp_async_wiat<


def build(cand: Candidate) -> BuildOutcome:
    started = time.monotonic()
    outcome = SimBackend(manifest(), SETTINGS).build(BIG, cand)
    print(f"nvcc build of {cand.short_hash}: {time.monotonic() - started:.1f} s, ok={outcome.ok}")
    return outcome


def scripted_edit(tmp_path: Path, broken: bool) -> Candidate:
    """The first scripted structural edit (by iteration) that has, or has not, a slip in it."""
    for i in range(1, 400):
        text, _ = propose_in(layout(tmp_path / str(i), "structural", iteration=i))
        slipped = any(slip in text for _, slip in scripted().BROKEN)
        if (TYPO in text) if broken else not slipped:
            return candidate_of(manifest(), SETTINGS, "cuda", BIG.dtype, text)
    raise AssertionError("no such scripted edit")


def test_the_reference_knob_candidate_compiles() -> None:
    cand = knob_candidate(manifest(), SETTINGS, "cuda", BIG, reference())
    assert cand.toolchain != "sim" and "-arch=sm_90a" in cand.flags
    outcome = build(cand)
    assert outcome.ok, outcome.log
    assert "-c -o cand.o cand.cu" in outcome.log
    assert SimBackend(manifest(), SETTINGS).decode(BIG, outcome.artifact).factor == 1.0


def test_a_scripted_structural_edit_compiles(tmp_path: Path) -> None:
    outcome = build(scripted_edit(tmp_path, broken=False))
    assert outcome.ok, outcome.log


def test_a_broken_edit_fails_with_the_real_nvcc_error(tmp_path: Path) -> None:
    outcome = build(scripted_edit(tmp_path, broken=True))
    assert not outcome.ok and outcome.artifact == ""
    assert "error" in outcome.reason and "cp_async_wiat" in outcome.reason, outcome.log
    assert outcome.reason in outcome.log
