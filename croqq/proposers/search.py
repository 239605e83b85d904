"""The ``search`` proposer: a local search from the current best, the way an engineer tunes by hand.

- **refine** (fewer than 5 consecutive non-KEEPs): change one knob to a neighbouring value. Moves that
  address the last profile's bottleneck are twice as likely (memory: bigger tiles, swizzle, raster,
  stages; latency: stages, split-K, TILE_K, warps; compute: warps, epilogue width, TILE_K; launch: less
  split-K and smaller tiles), and three times when they also go the helpful direction.
- **escalate** (5+): change two or three knobs by one step; a tile change usually drags the matching
  warp count along so the per-warp tile (and its registers) stays the same.
- **radical** (10+): a restart from a coherent configuration (tile, warps sized for ~64x64 warp tiles,
  any stages, swizzle, split-K) or four to five knobs moved up to two steps at once.

Like an engineer it does a back-of-envelope resource check (shared memory, accumulator registers, MMA
fragment width, split-K slice) on every idea, and never proposes one the check catches.

An idea whose content hash is in ``ctx.tried`` is never returned; when a strategy finds nothing new
it widens to the next one. The draw is seeded by (shape key, iteration, number of hashes tried), so the
same context always gives the same idea.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from croqq.domain.knobs import knobs_summary, seed_knobs
from croqq.domain.records import Idea
from croqq.errors import TerminalError
from croqq.proposers._base import ProposeContext, Proposer

log = logging.getLogger(__name__)

DRAWS = 200
RADICAL_MIN_CHANGES = 3
PREFERRED = 2.0
HELPFUL = 1.5
# bottleneck -> {knob: helpful direction (+1 up, -1 down, 0 either)}
GUIDANCE: dict[str, dict[str, int]] = {
    "memory": {"TILE_M": 1, "TILE_N": 1, "SWIZZLE": 1, "RASTER": 0, "STAGES": 1},
    "latency": {"STAGES": 1, "SPLIT_K": 1, "TILE_K": 0, "WARPS_M": 1, "WARPS_N": 1},
    "compute": {"WARPS_M": 0, "WARPS_N": 0, "EPI_VEC": 1, "TILE_K": 1},
    "launch": {"SPLIT_K": -1, "TILE_M": -1, "TILE_N": -1, "STAGES": -1},
}
PAIRED = {"TILE_M": "WARPS_M", "TILE_N": "WARPS_N"}
GEMM_TILE_KNOBS = frozenset({"TILE_M", "TILE_N", "TILE_K", "STAGES", "WARPS_M", "WARPS_N", "SPLIT_K"})
DEFAULT_REASONS = ("to explore upward", "to explore downward")
REASONS: dict[str, tuple[str, str]] = {  # knob -> (reason going up, reason going down)
    "TILE_M": ("for more operand reuse per CTA", "to put more CTAs in flight"),
    "TILE_N": ("for more operand reuse per CTA", "to put more CTAs in flight"),
    "TILE_K": ("to halve main-loop barriers", "to free shared memory for deeper pipelining"),
    "STAGES": ("to hide memory latency", "to lift occupancy"),
    "WARPS_M": ("to spread the tile over more warps", "for bigger warp tiles"),
    "WARPS_N": ("to spread the tile over more warps", "for bigger warp tiles"),
    "RASTER": ("to raster CTAs along N for L2 reuse", "to raster CTAs along M for L2 reuse"),
    "SWIZZLE": ("to raise the L2 hit rate", "to cut CTA-remap overhead"),
    "SPLIT_K": ("to fill idle SMs", "to cut split-K reduction traffic"),
    "EPI_VEC": ("for wider epilogue stores", "to ease epilogue register pressure"),
}


@dataclass(frozen=True)
class Move:
    knob: str
    old: int
    new: int
    up: bool

    @property
    def text(self) -> str:
        return f"{self.knob} {self.old}->{self.new}"

    @property
    def tag(self) -> str:
        return f"{self.knob.lower().replace('_', '-')}{self.new}"


def _rng(ctx: ProposeContext) -> random.Random:
    digest = hashlib.sha256(f"{ctx.shape.key}|{ctx.iteration}|{len(ctx.tried)}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _shift(space: dict[str, list[int]], knobs: dict[str, int], knob: str, steps: int) -> Move | None:
    values = space[knob]
    i = values.index(knobs[knob]) + steps
    if not 0 <= i < len(values) or steps == 0:
        return None
    return Move(knob, knobs[knob], values[i], steps > 0)


def _weight(move: Move, bottleneck: str) -> float:
    helpful = GUIDANCE.get(bottleneck, {})
    if move.knob not in helpful:
        return 1.0
    direction = helpful[move.knob]
    return PREFERRED * (HELPFUL if direction == 0 or (direction > 0) == move.up else 1.0)


def _apply(knobs: dict[str, int], moves: list[Move]) -> dict[str, int]:
    return {**knobs, **{m.knob: m.new for m in moves}}


class SearchProposer(Proposer):
    """Local search over the manifest's knob space (see the module docstring)."""

    name = "search"

    def propose(self, ctx: ProposeContext) -> Idea:
        rng = _rng(ctx)
        tried = set(ctx.tried)
        ladder: list[Callable[[ProposeContext, random.Random, set[str]], Idea | None]] = [
            self._refine,
            self._escalate,
            self._radical,
        ]
        start = {"refine": 0, "escalate": 1, "radical": 2}[ctx.strategy]
        for step in ladder[start:]:
            idea = step(ctx, rng, tried)
            if idea is not None:
                log.debug("search %s iter %d: %s", ctx.shape.key, ctx.iteration, idea.summary)
                return idea
            log.info("search %s: no new %s idea left, widening", ctx.shape.key, step.__name__.strip("_"))
        raise TerminalError(
            f"search proposer: no untried idea left for {ctx.shape.key} after {len(tried)} tries"
        )

    def _base(self, ctx: ProposeContext) -> dict[str, int]:
        if set(ctx.best_knobs) == set(ctx.knob_space):
            return dict(ctx.best_knobs)
        return seed_knobs(self.manifest, ctx.dsl, ctx.shape.dtype, "reference")

    def _fresh(
        self,
        ctx: ProposeContext,
        rng: random.Random,
        tried: set[str],
        knobs: dict[str, int],
        *,
        summary: str,
        tag: str,
    ) -> Idea | None:
        """The idea, unless it was tried or the envelope check catches it."""
        if self.caught(ctx, knobs, rng):
            return None
        idea = self.make_idea(ctx, knobs, summary, tag)
        return None if idea.content_hash in tried else idea

    def caught(self, ctx: ProposeContext, knobs: dict[str, int], rng: random.Random) -> bool:
        """True when the envelope check or a rule of the family drops ``knobs`` before they are proposed.
        ``rng`` is the idea's seeded draw, for a subclass that imitates a less careful proposer (the
        simulator's tests)."""
        return self.refused(ctx, knobs)

    # -- refine: one knob, one step ---------------------------------------------------------------

    def _refine(self, ctx: ProposeContext, rng: random.Random, tried: set[str]) -> Idea | None:
        base = self._base(ctx)
        moves = [
            m
            for knob in sorted(ctx.knob_space)
            for s in (-1, 1)
            if (m := _shift(ctx.knob_space, base, knob, s)) is not None
        ]
        rng.shuffle(moves)
        weights = [_weight(m, ctx.bottleneck) for m in moves]
        while moves:
            i = rng.choices(range(len(moves)), weights=weights)[0]
            move = moves.pop(i)
            weights.pop(i)
            verb = "raise" if move.up else "lower"
            reason = REASONS.get(move.knob, DEFAULT_REASONS)[0 if move.up else 1]
            summary = f"{verb} {move.text} {reason}"
            idea = self._fresh(ctx, rng, tried, _apply(base, [move]), summary=summary, tag=move.tag)
            if idea is not None:
                return idea
        return None

    # -- escalate: two or three knobs -------------------------------------------------------------

    def _combo(self, ctx: ProposeContext, rng: random.Random, base: dict[str, int], count: int) -> list[Move]:
        knobs = sorted(ctx.knob_space)
        moves: list[Move] = []
        for knob in rng.sample(knobs, len(knobs)):
            if len(moves) >= count or any(m.knob == knob for m in moves):
                continue
            move = _shift(ctx.knob_space, base, knob, rng.choice((-1, 1)))
            if move is None:
                continue
            moves.append(move)
            partner = PAIRED.get(knob) if PAIRED.get(knob) in ctx.knob_space else None
            if (
                partner
                and len(moves) < count
                and rng.random() < 0.7
                and all(m.knob != partner for m in moves)
            ):
                paired = _shift(ctx.knob_space, base, partner, 1 if move.up else -1)
                if paired is not None:
                    moves.append(paired)
        return moves

    def _escalate(self, ctx: ProposeContext, rng: random.Random, tried: set[str]) -> Idea | None:
        base = self._base(ctx)
        for _ in range(DRAWS):
            moves = self._combo(ctx, rng, base, rng.choice((2, 2, 3)))
            if len(moves) < 2:
                continue
            lead = moves[0]
            reason = REASONS.get(lead.knob, DEFAULT_REASONS)[0 if lead.up else 1]
            summary = f"combine {' + '.join(m.text for m in moves)} ({lead.knob.lower()} {reason})"
            tag = "-".join(m.tag for m in moves[:2])
            idea = self._fresh(ctx, rng, tried, _apply(base, moves), summary=summary, tag=tag)
            if idea is not None:
                return idea
        return None

    # -- radical: restart or a big jump ------------------------------------------------------------

    def _restart(self, ctx: ProposeContext, rng: random.Random) -> tuple[dict[str, int], str, str]:
        """A fresh, coherent configuration: random values, warps sized for ~64x64 warp tiles."""
        space = ctx.knob_space
        knobs = {name: rng.choice(values) for name, values in space.items()}
        if not GEMM_TILE_KNOBS.issubset(space):
            return knobs, f"restart from {knobs_summary(knobs)}", "restart"
        tm, tn = knobs["TILE_M"], knobs["TILE_N"]
        knobs["WARPS_M"] = min(space["WARPS_M"], key=lambda w: abs(tm // w - 64))
        knobs["WARPS_N"] = min(space["WARPS_N"], key=lambda w: abs(tn // w - 64))
        summary = (
            f"restart from a {tm}x{tn}x{knobs['TILE_K']} tile, {knobs['STAGES']} stages, "
            f"{knobs['WARPS_M']}x{knobs['WARPS_N']} warps, split-K {knobs['SPLIT_K']}"
        )
        return knobs, summary, f"restart-{tm}x{tn}"

    def _jump(
        self, ctx: ProposeContext, rng: random.Random, base: dict[str, int]
    ) -> tuple[dict[str, int], str, str]:
        moves: list[Move] = []
        for knob in rng.sample(sorted(ctx.knob_space), min(len(ctx.knob_space), rng.choice((4, 5)))):
            move = _shift(ctx.knob_space, base, knob, rng.choice((-2, -1, 1, 2)))
            move = move or _shift(ctx.knob_space, base, knob, rng.choice((-1, 1)))
            if move is not None:
                moves.append(move)
        return (
            _apply(base, moves),
            f"radical jump: {', '.join(m.text for m in moves)}",
            "jump-" + "-".join(m.tag for m in moves[:2]),
        )

    def _radical(self, ctx: ProposeContext, rng: random.Random, tried: set[str]) -> Idea | None:
        base = self._base(ctx)
        for _ in range(DRAWS):
            knobs, summary, tag = (
                self._restart(ctx, rng) if rng.random() < 0.5 else self._jump(ctx, rng, base)
            )
            if sum(knobs[k] != base[k] for k in base) < RADICAL_MIN_CHANGES:
                continue
            idea = self._fresh(ctx, rng, tried, knobs, summary=summary, tag=tag)
            if idea is not None:
                return idea
        return None
