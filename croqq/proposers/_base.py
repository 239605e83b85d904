"""The proposer interface: ``propose(context) -> Idea``.

The context carries what an agent resuming cold would need: the shape, the knob space, the best source
and its figures, the strategy signal (refine / escalate / radical from consecutive non-KEEPs) and the
phase asked for, the last profile, the shape's history, the content hashes already tried (an idea is
never repeated) and the best kernels of its nearest advanced neighbours (what won next door). A proposer
answers with an :class:`Idea` (a candidate source), or a :class:`Rejection` when it produced nothing
buildable (stored as an attempt; the shape goes on).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

from pydantic import BaseModel, ConfigDict

from croqq.backends.toolchain import knob_candidate
from croqq.domain.manifest import Manifest
from croqq.domain.records import HistoryEntry, Idea, NeighbourKernel, Rejection, Strategy, TuningPhase
from croqq.domain.shapes import Shape
from croqq.settings import Settings


class ProposeContext(BaseModel):
    """Everything an IDEATE step knows about its shape (what an agent's workspace is built from)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: Shape
    dsl: str
    gpu_type: str
    iteration: int  # the iteration id this idea would become
    knob_space: dict[str, list[int]]
    best_knobs: dict[str, int]
    best_source: str
    best_iter: int = 0
    best_tflops: float
    baseline_tflops: float = 0.0
    vendor_tflops: float | None = None
    peak_tflops: float
    strategy: Strategy
    consecutive_discards: int
    phase: TuningPhase = "knobs"
    phase_reason: str = ""
    bottleneck: str
    profile_metrics: dict[str, float] = {}
    tried: list[str]  # content hashes already proposed for this shape
    history: list[HistoryEntry] = []
    candidate: int = 1  # this call's candidate among the iteration's (1..candidates)
    candidates: int = 1  # how many candidates the iteration gathers (``croqq submit --candidates``)
    neighbours: list[NeighbourKernel] = []  # the nearest advanced neighbours' best kernels, re-targeted here
    seed: int = 0  # varies a seeded proposer's draws between runs on one shape (benchmarks); 0 in a cluster


def slug(text: str) -> str:
    """A file-name-safe tag (``iter<NNN>_<tag>.cu``)."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (cleaned or "idea")[:40].rstrip("-")


SMEM_BUDGET_BYTES = 227 * 1024  # sm90's per-block shared memory: the back-of-envelope check
MIN_WARP_TILE_N = 32  # one MMA fragment
MAX_ACC_REGS = 256  # fp32 accumulator registers per thread


def over_budget(knobs: dict[str, int], a_bytes: int, k: int) -> bool:
    """The engineer's envelope check: pipeline buffers beyond shared memory, an fp32 accumulator beyond
    the register file, a warp tile narrower than one MMA fragment, or a split-K slice that TILE_K does not
    divide. Knob sets without these knobs pass."""
    try:
        if k % (knobs["SPLIT_K"] * knobs["TILE_K"]):
            return True
        smem = (knobs["TILE_M"] + knobs["TILE_N"]) * knobs["TILE_K"] * a_bytes * knobs["STAGES"]
        warps = knobs["WARPS_M"] * knobs["WARPS_N"]
        acc_regs = knobs["TILE_M"] * knobs["TILE_N"] // (warps * 32)
        warp_n = knobs["TILE_N"] // knobs["WARPS_N"]
    except KeyError:
        return False
    return smem > SMEM_BUDGET_BYTES or acc_regs > MAX_ACC_REGS or warp_n < MIN_WARP_TILE_N


class Proposer(ABC):
    """Where ideas come from: :class:`~croqq.proposers.search.SearchProposer` (a search strategy) or
    :class:`~croqq.proposers.agent.proposer.AgentProposer` (a coding agent that writes sources)."""

    name: str = "base"
    is_agent: bool = False  # agents have a health (back-off) and a budget; a search strategy has neither

    def __init__(self, manifest: Manifest, settings: Settings) -> None:
        self.manifest = manifest
        self.settings = settings

    @abstractmethod
    def propose(self, ctx: ProposeContext) -> Idea | Rejection:
        """A new idea for this shape (its content hash not in ``ctx.tried``), or why there is none."""

    def for_candidate(self, candidate: int) -> Proposer:
        """Who makes candidate ``candidate`` (1..N) of an iteration: this proposer (a list of agents
        spreads the candidates over its agents)."""
        return self

    def check_ready(self) -> None:  # noqa: B027 (most proposers need nothing)
        """Raise ConfigError (one line) when this proposer cannot run on this host (worker start-up)."""

    def refused(self, ctx: ProposeContext, knobs: dict[str, int]) -> bool:
        """True when the engineer's envelope check (:func:`over_budget`) or a rule of the family
        (``dsls.<dsl>.rules``, which croqq would record as an attempt without a compile) refuses these
        knobs on this shape: a knob proposer does not offer them."""
        spec, dtype = self.manifest.dsls.get(ctx.dsl), self.manifest.dtypes.get(ctx.shape.dtype)
        if dtype is None:
            return False
        dims = (ctx.shape.m, ctx.shape.n, ctx.shape.k)
        broken = spec is not None and spec.broken_rule(knobs, dims, dtype) is not None
        return broken or over_budget(knobs, dtype.a_bytes, ctx.shape.k)

    def make_idea(
        self, ctx: ProposeContext, knobs: dict[str, int], summary: str, tag: str | None = None
    ) -> Idea:
        """Validate the knobs and turn them into a knob candidate's Idea with its content hash."""
        cand = knob_candidate(self.manifest, self.settings, ctx.dsl, ctx.shape, knobs)
        return Idea(
            summary=summary[:300] or "idea",
            tag=slug(tag or summary),
            knobs=cand.knobs,
            content_hash=cand.content_hash,
            strategy=ctx.strategy,
            proposer=self.name,
            source=cand.source,
            change="knobs",
            phase=ctx.phase,
        )
