"""The proposer interface: ``propose(context) -> Idea``.

The context carries what an agent resuming cold would need: the shape, the knob space, the best so far,
the strategy signal (refine / escalate / radical from consecutive non-KEEPs), the last profile's
bottleneck, recent rounds, and the content hashes already tried (an idea is never repeated).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

from pydantic import BaseModel, ConfigDict

from croqq.domain.knobs import make_candidate
from croqq.domain.manifest import Manifest
from croqq.domain.records import Idea, Strategy
from croqq.domain.shapes import Shape
from croqq.settings import Settings


class RecentRound(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration: int
    knobs: dict[str, int]
    decision: str
    tflops: float


class ProposeContext(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: Shape
    dsl: str
    gpu_type: str
    iteration: int  # the iteration id this idea would become
    knob_space: dict[str, list[int]]
    best_knobs: dict[str, int]
    best_tflops: float
    peak_tflops: float
    strategy: Strategy
    consecutive_discards: int
    bottleneck: str
    tried: list[str]  # content hashes already proposed for this shape
    recent: list[RecentRound] = []


def slug(text: str) -> str:
    """A file-name-safe tag (``iter<NNN>_<tag>.cu``)."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (cleaned or "idea")[:40].rstrip("-")


class Proposer(ABC):
    """Where ideas come from: :class:`~croqq.proposers.search.SearchProposer` (a search strategy) or
    :class:`~croqq.proposers.command.CommandProposer` (an external agent command)."""

    name: str = "base"

    def __init__(self, manifest: Manifest, settings: Settings) -> None:
        self.manifest = manifest
        self.settings = settings

    @abstractmethod
    def propose(self, ctx: ProposeContext) -> Idea:
        """A new idea for this shape: its content hash must not be in ``ctx.tried``."""

    def make_idea(
        self, ctx: ProposeContext, knobs: dict[str, int], summary: str, tag: str | None = None
    ) -> Idea:
        """Validate the knobs and turn them into an Idea with its content hash."""
        cand = make_candidate(self.manifest, ctx.dsl, ctx.shape, knobs)
        return Idea(
            summary=summary[:300] or "idea",
            tag=slug(tag or summary),
            knobs=cand.knobs,
            content_hash=cand.content_hash,
            strategy=ctx.strategy,
            proposer=self.name,
        )
