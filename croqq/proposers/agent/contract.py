"""The file contract between croqq and a coding agent (documented with a worked example in
``kernels/AGENTS.md``).

croqq lays out a fresh workspace per IDEATE step (cwd of the agent)::

    TASK.md          the task prompt (also passed on the command line where the CLI takes one)
    best.cu          the current best source of this shape (logical form: #include "gemm_f16.cuh")
    context.json     machine-readable context (:class:`WorkspaceContext`)
    history.md       every iteration and attempt of this shape: idea, decision, TFLOPS, compile error
    ideas.md         the ideas already tried, in words
    BUILD.md         the exact build command
    include/         read-only copies of the headers a candidate may include (by plain name)
    neighbours/      the best kernels of the nearest advanced neighbours, re-targeted to this shape
                     (``<key>.cu``; listed with their figures in context.json ``neighbours``)

The agent answers with exactly two new files and writes nothing else:

    candidate.cu     one self-contained candidate source (``CANDIDATE`` below)
    SUMMARY.txt      its idea in words: the first non-empty line, at most 300 characters

Scratch space that is not part of the answer: ``.agent-home/`` (the agent's HOME inside the jail).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from croqq.domain.manifest import Rule
from croqq.domain.records import Strategy, TuningPhase

TASK = "TASK.md"
BEST = "best.cu"
CONTEXT = "context.json"
HISTORY = "history.md"
IDEAS = "ideas.md"
BUILD = "BUILD.md"
INCLUDE = "include"
NEIGHBOURS = "neighbours"
CANDIDATE = "candidate.cu"
SUMMARY = "SUMMARY.txt"
SCRATCH = ".agent-home"
PROVIDED = (TASK, BEST, CONTEXT, HISTORY, IDEAS, BUILD)
ANSWER = (CANDIDATE, SUMMARY)


class NeighbourEntry(BaseModel):
    """One nearest advanced neighbour in context.json: what won next door."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    distance: float  # in log2 space, as the schedule ranks shapes
    best_tflops: float  # measured there
    peak_fraction: float  # of the GPU type's dense peak
    knobs: dict[str, int]
    change: str  # knobs: the template with its knobs; structural: an agent-written kernel
    source: str  # neighbours/<key>.cu, re-targeted to this shape ('' when it cannot be: see reason)
    reason: str


class FamilyLayout(BaseModel):
    """How a candidate of this family takes the kernel into its own file (a structural edit): replace
    ``#include "<header>"`` by ``#define <define> 1``, the text of ``include/<kernel>`` without its
    ``#pragma once``, then ``#include`` each of ``after``, in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: str  # what best.cu includes after its knob macros, e.g. cutlass_f16.cuh
    define: str  # e.g. CROQQ_F16
    kernel: str  # the header whose text becomes the candidate's own, e.g. cutlass_sm90.cuh
    after: list[str]  # still included after it, e.g. ["cutlass_run.cuh", "harness.cuh"]


class WorkspaceContext(BaseModel):
    """context.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    dtype: str
    m: int
    n: int
    k: int
    dsl: str
    gpu_type: str
    peak_tflops: float
    iteration: int  # the iteration id this candidate would become
    candidate: int = 1  # this call's candidate among the iteration's (1..candidates)
    candidates: int = 1  # how many candidates the iteration gathers (make each one different)
    baseline_tflops: float
    best_tflops: float
    best_iter: int
    vendor_tflops: float | None
    strategy: Strategy  # refine / escalate / radical, from consecutive discards
    consecutive_discards: int
    phase: TuningPhase  # what kind of change is asked for (see TASK.md)
    phase_reason: str
    bottleneck: str
    profile_metrics: dict[str, float]
    knob_space: dict[str, list[int]]  # every knob must be #defined by the candidate, to one of these
    rules: list[Rule] = []  # knob combinations the hardware cannot run: refused before any compile
    rule_env: dict[str, int] = {}  # what the rules read besides the knobs: M, N, K, A_BYTES, C_BYTES, SPARSE
    run: Literal["harness", "self-timed"] = "harness"  # who owns main and the timer: croqq's or the kernel
    best_knobs: dict[str, int]
    family: FamilyLayout | None = None  # None: the family header includes no kernel header
    headers: list[str]  # what a candidate may include with quotes
    build_command: str
    neighbours: list[NeighbourEntry] = []  # nearest first
