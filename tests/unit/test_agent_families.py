"""Agents get every kernel family: context.json names its rules and how its kernel is taken into a
candidate, TASK.md says it per family, the workspace's build command finds CUTLASS's headers, and the
scripted agent takes a CUTLASS kernel into its file and edits it (nvcc: those edits compile for sm_90a)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from croqq.backends.cuda import CudaBackend
from croqq.backends.toolchain import candidate_of
from croqq.domain.knobs import include_resolver
from croqq.domain.records import HistoryEntry, Idea
from croqq.proposers.agent import scripted, workspace
from croqq.proposers.agent.checks import check_source
from croqq.proposers.agent.proposer import AgentProposer
from croqq.proposers.agent.scripted import SWAPS
from croqq.settings import Settings
from tests.agents import MANIFEST, SHAPE, context, settings

CUTLASS_EDITS = ("float, float, void, LayoutC", "+ 32 * 1024")  # what each scripted CUTLASS edit writes


def context_json(dsl: str) -> tuple[dict[str, object], str, list[str]]:
    """(context.json, TASK.md, include/'s names) of a fresh workspace of ``dsl``."""
    resolver = include_resolver(MANIFEST, dsl, Settings().kernels_dir)
    ws = workspace.build(context(dsl=dsl), MANIFEST, resolver)
    try:
        ctx = json.loads((ws.root / "context.json").read_text())
        return ctx, (ws.root / "TASK.md").read_text(), sorted(p.name for p in (ws.root / "include").iterdir())
    finally:
        ws.remove()


def test_context_json_holds_the_cutlass_family_its_rules_and_how_to_take_its_kernel() -> None:
    ctx, task, included = context_json("cutlass")
    assert ctx["dsl"] == "cutlass" and set(ctx["knob_space"]) == set(MANIFEST.dsl("cutlass").knobs)
    assert ctx["rules"] == [r.model_dump() for r in MANIFEST.dsl("cutlass").rules] and ctx["rules"]
    assert ctx["family"] == {
        "header": "cutlass_f16.cuh",
        "define": "CROQQ_F16",
        "kernel": "cutlass_sm90.cuh",
        "after": ["cutlass_run.cuh", "harness.cuh"],
    }
    assert ctx["rule_env"] == {
        "M": SHAPE.m,
        "N": SHAPE.n,
        "K": SHAPE.k,
        "A_BYTES": 2,
        "C_BYTES": 2,
        "SPARSE": 0,
    }
    assert {"cutlass_sm90.cuh", "cutlass_run.cuh", "harness.cuh"} <= set(included)
    assert (
        'replace `#include "cutlass_f16.cuh"` by `#define CROQQ_F16 1`, the text of '
        '`include/cutlass_sm90.cuh` without its `#pragma once`, then `#include "cutlass_run.cuh"` and '
        '`#include "harness.cuh"`'
    ) in " ".join(task.split())
    flags = ctx["build_command"].split()  # type: ignore[union-attr]
    assert any(f.startswith("-I") and f.endswith("cutlass_library/source/include") for f in flags)


def test_context_json_of_the_cuda_family_names_its_core_header() -> None:
    ctx, task, _ = context_json("cuda")
    assert ctx["family"] == {
        "header": "gemm_f16.cuh",
        "define": "CROQQ_F16",
        "kernel": "gemm_core.cuh",
        "after": ["harness.cuh"],
    }
    assert "the text of `include/gemm_core.cuh`" in " ".join(task.split())


def cutlass_edits() -> dict[str, Idea]:
    """The scripted agent's first structural answer of each CUTLASS edit (by iteration)."""
    proposer = AgentProposer(MANIFEST, settings())
    found: dict[str, Idea] = {}
    for iteration in range(2, 30):
        idea = proposer.propose(context("structural", dsl="cutlass", iteration=iteration))
        assert isinstance(idea, Idea), idea.reason  # the inlined CUTLASS kernel passes every check
        for mark in CUTLASS_EDITS:
            if mark in idea.source and "GemmUniversalAdapter<Kernel>;" in idea.source:  # no slip in it
                found.setdefault(mark, idea)
        if len(found) == len(CUTLASS_EDITS):
            return found
    raise AssertionError(f"only {sorted(found)} of {CUTLASS_EDITS} in 28 iterations")


def test_the_scripted_agent_takes_a_cutlass_kernel_into_its_file_and_edits_it() -> None:
    resolver = include_resolver(MANIFEST, "cutlass", Settings().kernels_dir)
    for idea in cutlass_edits().values():
        assert idea.change == "structural" and "cutlass_sm90.cuh inlined" in idea.summary
        assert '#include "cutlass_f16.cuh"' not in idea.source and "#pragma once" not in idea.source
        assert idea.source.index("using Gemm =") < idea.source.index('#include "cutlass_run.cuh"')
        assert idea.source.rstrip().endswith('#include "harness.cuh"')
        assert check_source(idea.source, resolver) == []


@pytest.mark.nvcc
@pytest.mark.timeout(3600)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CUDA toolkit)")
def test_the_scripted_cutlass_edits_compile_for_sm90a(tmp_path: Path) -> None:
    config = Settings(build_dir=tmp_path, compile_timeout_s=3600.0)
    backend = CudaBackend(MANIFEST, config)
    for mark, idea in cutlass_edits().items():
        outcome = backend.build(SHAPE, candidate_of(MANIFEST, config, "cutlass", "f16", idea.source))
        assert outcome.ok, (mark, outcome.reason)
        assert b"wgmma" in Path(backend.artifact_binary(outcome.artifact)).read_bytes()


def test_the_scripted_agent_moves_cutlass_knobs_inside_the_family_rules() -> None:
    """The cutlass reference sits at the accumulator limit (128x256 cooperative): a memory-bound profile
    asks for larger tiles, which the rules refuse, so a careful agent reads them and moves other knobs."""
    proposer = AgentProposer(MANIFEST, settings())
    spec, dtype = MANIFEST.dsl("cutlass"), MANIFEST.dtypes[SHAPE.dtype]
    for iteration in range(2, 22):
        idea = proposer.propose(context(dsl="cutlass", iteration=iteration))
        assert isinstance(idea, Idea), idea.reason
        assert spec.broken_rule(idea.knobs, (SHAPE.m, SHAPE.n, SHAPE.k), dtype) is None, idea.summary


def test_once_every_cutlass_edit_was_tried_the_scripted_agent_moves_a_knob_instead_of_repeating_one() -> None:
    """The cutlass family offers two structural edits: once ideas.md lists both, either would be a
    candidate tried before (a repeat or the same compile error: an attempt, again and again)."""
    tried = [
        words
        for _, old, _, words in SWAPS
        if old in (Settings().kernels_dir / "kernels" / "cutlass" / "cutlass_sm90.cuh").read_text()
    ]
    assert len(tried) == 2
    proposer = AgentProposer(MANIFEST, settings())
    for iteration in range(2, 12):
        ctx = context("structural", dsl="cutlass", iteration=iteration)
        past = [
            HistoryEntry(iteration=1 + n, summary=w, decision="DISCARD", tflops=390.0, change="structural")
            for n, w in enumerate(tried)
        ]
        idea = proposer.propose(ctx.model_copy(update={"history": [*ctx.history, *past]}))
        assert isinstance(idea, Idea), idea.reason
        assert idea.summary.startswith("set ") and idea.knobs != ctx.best_knobs, idea.summary


@pytest.mark.parametrize(
    ("require", "holds"),
    [
        ("TILE_M * TILE_K * A_BYTES <= 16384", False),  # 128 * 128 * 2: broken, so the move is refused
        ("max(TILE_M, M) % TILE_M == 0", True),
        ("TILE_M.bit_length() > 99", True),  # an attribute: not plain arithmetic, croqq judges it
        ("(lambda: 0)()", True),  # nested code: croqq judges it
        ("UNKNOWN_KNOB > 1", True),  # a name the context lacks: croqq judges it
        ("TILE_M >", True),  # unreadable: croqq judges it
    ],
)
def test_the_scripted_agent_evaluates_only_plain_arithmetic_rules(require: str, holds: bool) -> None:
    ws = scripted.Workspace(
        {"rules": [{"require": require}], "rule_env": {"M": 4096, "A_BYTES": 2}}, "", "", 0
    )
    assert scripted.rules_hold(ws, {"TILE_M": 128, "TILE_K": 128}) is holds


def test_the_scripted_agent_starts_on_a_lean_standard_library() -> None:
    """It runs once per agent call: typing, dataclasses, pathlib and ast would cost it a third more CPU."""
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import scripted; "
        "print(sorted({'ast', 'dataclasses', 'pathlib', 'typing'} & set(sys.modules)))"
    )
    folder = str(Path(scripted.__file__).parent)
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, folder], check=False, capture_output=True, text=True
    )
    assert out.stdout.split() == ["[]"], out.stderr


def test_once_the_near_moves_were_tried_the_scripted_agent_widens_instead_of_repeating_one() -> None:
    """cutlass's rules leave about ten single moves around its reference kernel: once ideas.md lists them
    all, a one-knob draw can only repeat one (or break a rule): the agent moves one more knob instead."""
    spec = MANIFEST.dsl("cutlass")
    now = dict(spec.kernels["f16"].reference)
    space = {name: list(values) for name, values in spec.knobs.items()}
    ctx = {
        "knob_space": space,
        "best_knobs": now,
        "rules": [{"require": r.require} for r in spec.rules],
        "rule_env": {"M": 4096, "N": 8192, "K": 8192, "A_BYTES": 2, "C_BYTES": 2, "SPARSE": 0},
        "dtype": "f16",
        "k": 8192,
    }
    probe = scripted.Workspace(ctx, "", "", 0)
    singles = [
        {name: values[i + step]}
        for name, values in space.items()
        for i in [values.index(now[name])]
        for step in (-1, 1)
        if 0 <= i + step < len(values) and scripted.rules_hold(probe, {**now, name: values[i + step]})
    ]
    assert len(singles) >= 5
    tried = "".join(f"- set {scripted.describe(now, move)}\n" for move in singles)
    ws = scripted.Workspace(ctx, "", tried, 0)
    for seed in range(20):
        moves = scripted.knob_moves(ws, random.Random(seed), 1)
        knobs = {**now, **moves}
        assert scripted.rules_hold(ws, knobs) and scripted.fits(knobs, "f16", 8192), moves
        assert scripted.describe(now, moves) not in tried and len(moves) == 2, moves
