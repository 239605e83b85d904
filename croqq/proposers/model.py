"""The ``model`` proposer: model-guided search over any knob space (names and values from the manifest or a
recorded landscape; nothing here knows what a knob means).

Every IDEATE reads the shape's history (each measured knob set with its TFLOPS, each knob set that did not
build) and:

1. **starts** with ``INITIAL`` spread-out knob sets (each knob drawn uniformly, the first near the middle
   of every value list) when fewer have been measured;
2. then **models** the measurements the way a Parzen-estimator search does, with one change that matters
   for kernels: knob values are ordered (tile 64 < 128 < 256), so a measurement lends weight to its
   neighbouring values too. The best ``GOOD`` fraction of the measured knob sets forms a density per knob,
   the rest another; a candidate's score is the sum over knobs of ``log good(v) - log bad(v)``;
3. **learns what builds**: per knob value, the share of the knob sets with that value that built, and
   adds ``log`` of it to the score, so ideas near known compile failures rank low (for the GEMM knobs, the
   engineer's resource check of :func:`croqq.proposers._base.over_budget` and the family's rules
   also apply);
4. **ranks** ``DRAWS`` candidates drawn from the good density together with the one-knob neighbours of the
   best measured knob set, and returns the best-scoring one not tried yet (few draws, as in TPE: the
   argmax over many would only circle the best).

The balance between the good and the bad density decides how far it looks, so ``ctx.strategy`` is not
used. On a stall it also stays with the whole history: widening the draws (as the ``search`` proposer
does), fewer ranked draws, a larger good set, joint (product-kernel) densities, modelling only the
measurements far from the best, and restarting from fresh spread-out knob sets after a stall or at a local
optimum of the one-knob moves: none let more runs get near the optimum in the tuning benchmark, most let
fewer (a run caught in a wide second-best basin needs a jump of four knobs or more, and a restart costs
more measurements than it saves). The draw is seeded by (shape key, iteration, hashes tried, ``ctx.seed``):
the same context always gives the same idea.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from croqq.domain.decide import BASELINE, DISCARD, KEEP, SIBLING
from croqq.domain.records import HistoryEntry, Idea
from croqq.errors import TerminalError
from croqq.proposers._base import ProposeContext, Proposer

INITIAL = 4  # spread-out knob sets before the model is trusted
GOOD = 0.15  # share of the measured knob sets that count as good
MAX_GOOD = 12
# in steps of a knob's value list: 0.5 gets stuck more often by 150 measurements, 0.85 is worse at 30
BANDWIDTH = 0.7
PRIOR = 1.0  # pseudo-count spread uniformly over a knob's values
SPREAD_DRAWS = 24  # uniform draws ranked by how likely they are to build, before the model
FALLBACK_DRAWS = 2000  # uniform draws once every ranked candidate was tried
DRAWS = 24  # candidates drawn from the good density per idea
MEASURED = (BASELINE, KEEP, DISCARD, SIBLING)


Knobs = dict[str, int]
Key = tuple[int, ...]


@dataclass(frozen=True)
class Seen:
    """What the history says: measured knob sets (best first), knob sets that failed to build."""

    measured: list[tuple[Knobs, float]]
    failed: list[Knobs]
    tried: set[Key]


def _rng(ctx: ProposeContext) -> random.Random:
    text = f"model|{ctx.shape.key}|{ctx.iteration}|{len(ctx.tried)}|{ctx.seed}"
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))


def _key(space: dict[str, list[int]], knobs: Knobs) -> Key:
    return tuple(knobs.get(k, -1) for k in space)


def seen(ctx: ProposeContext) -> Seen:
    space = ctx.knob_space
    complete = [e for e in ctx.history if set(e.knobs) == set(space)]
    measured = [(e.knobs, e.tflops) for e in complete if e.decision in MEASURED and e.tflops > 0]
    measured.sort(key=lambda item: -item[1])
    failed = [e.knobs for e in complete if _failed(e)]
    tried = {_key(space, e.knobs) for e in complete}
    return Seen(measured, failed, tried)


def _failed(entry: HistoryEntry) -> bool:
    return entry.decision == "ATTEMPT_compile" or entry.decision.startswith(("FAIL_", f"{SIBLING}_FAIL_"))


@functools.cache
def _kernel(size: int) -> list[list[float]]:
    """How much weight a point at value index i lends to index j of a list of ``size`` values."""
    return [[math.exp(-0.5 * ((i - j) / BANDWIDTH) ** 2) for j in range(size)] for i in range(size)]


class Density:
    """Per knob, a smoothed density over its values (each point also lends weight to the neighbouring
    values of its ordered list); ``log`` is kept per value."""

    def __init__(self, space: dict[str, list[int]], points: list[Knobs]) -> None:
        self.values: dict[str, list[int]] = space
        self.cumulative: dict[str, list[float]] = {}
        self.logs: dict[str, dict[int, float]] = {}
        for name, values in space.items():
            counts = [0] * len(values)
            for point in points:
                counts[values.index(point[name])] += 1
            spread = _kernel(len(values))
            weights = [
                PRIOR / len(values) + sum(c * row[j] for c, row in zip(counts, spread, strict=True) if c)
                for j in range(len(values))
            ]
            total = sum(weights)
            self.cumulative[name] = list(itertools.accumulate(weights))
            self.logs[name] = {v: math.log(w / total) for v, w in zip(values, weights, strict=True)}

    def log(self, knobs: Knobs) -> float:
        return sum(self.logs[k][v] for k, v in knobs.items())

    def draw(self, rng: random.Random) -> Knobs:
        return {k: rng.choices(v, cum_weights=self.cumulative[k])[0] for k, v in self.values.items()}


class Builds:
    """Per knob value, the log share of the knob sets with that value that built (Laplace-smoothed)."""

    def __init__(self, space: dict[str, list[int]], built: list[Knobs], failed: list[Knobs]) -> None:
        ok = {(k, v): 1 for k, values in space.items() for v in values}
        total = dict.fromkeys(ok, 2)
        for point in built:
            for key in point.items():
                ok[key] += 1
                total[key] += 1
        for point in failed:
            for key in point.items():
                total[key] += 1
        self.logs = {key: math.log(ok[key] / total[key]) for key in ok}

    def log(self, knobs: Knobs) -> float:
        return sum(self.logs[key] for key in knobs.items())


def _neighbours(space: dict[str, list[int]], knobs: Knobs) -> list[Knobs]:
    out = []
    for name, values in space.items():
        i = values.index(knobs[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                out.append({**knobs, name: values[j]})
    return out


def _uniform(space: dict[str, list[int]], rng: random.Random) -> Knobs:
    return {k: rng.choice(v) for k, v in space.items()}


def describe(best: Knobs, knobs: Knobs) -> tuple[str, str]:
    """A one-line summary of the change from the best and a file-name tag."""
    changed = [k for k in sorted(knobs) if knobs[k] != best.get(k)]
    if not changed:
        return "re-measure the best configuration", "best"
    moves = [f"{k} {best.get(k)}->{knobs[k]}" for k in changed]
    tag = "-".join(f"{k.lower().replace('_', '-')}{knobs[k]}" for k in changed[:2])
    if len(changed) > 4:
        return f"model-guided jump: {len(changed)} knobs ({', '.join(moves[:4])}, ...)", tag
    return f"model-guided: {', '.join(moves)}", tag


class ModelProposer(Proposer):
    """Model-guided search over the manifest's (or a landscape's) knob space (see the module docstring)."""

    name = "model"

    def propose(self, ctx: ProposeContext) -> Idea:
        rng = _rng(ctx)
        space = ctx.knob_space
        state = seen(ctx)
        best = state.measured[0][0] if state.measured else dict(ctx.best_knobs)
        for knobs in self._ranked(ctx, state, rng):
            if _key(space, knobs) in state.tried or self.refused(ctx, knobs):
                continue
            summary, tag = describe(best, knobs)
            idea = self.make_idea(ctx, knobs, summary, tag)
            if idea.content_hash not in ctx.tried:
                return idea
        raise TerminalError(f"model proposer: no untried idea left for {ctx.shape.key}")

    def _ranked(self, ctx: ProposeContext, state: Seen, rng: random.Random) -> Iterator[Knobs]:
        space = ctx.knob_space
        if len(state.measured) < INITIAL:
            return self._spread(space, state, rng)
        n_good = min(MAX_GOOD, max(1, math.ceil(GOOD * len(state.measured))))
        good = Density(space, [k for k, _ in state.measured[:n_good]])
        bad = Density(space, [k for k, _ in state.measured[n_good:]])
        builds = Builds(space, [k for k, _ in state.measured], state.failed)
        pool = [good.draw(rng) for _ in range(DRAWS)] + _neighbours(space, state.measured[0][0])
        unique = {_key(space, k): k for k in pool}
        scored = sorted(
            unique.values(),
            key=lambda k: good.log(k) - bad.log(k) + builds.log(k),
            reverse=True,
        )
        return itertools.chain(scored, self._fallback(space, rng))

    def _spread(self, space: dict[str, list[int]], state: Seen, rng: random.Random) -> Iterator[Knobs]:
        """Before the model: spread-out knob sets, the likelier to build first."""
        builds = Builds(space, [k for k, _ in state.measured], state.failed)
        middle = {k: v[len(v) // 2] for k, v in space.items()}
        pool = [_uniform(space, rng) for _ in range(SPREAD_DRAWS)]
        pool.sort(key=builds.log, reverse=True)
        return itertools.chain([middle, *pool], self._fallback(space, rng))

    def _fallback(self, space: dict[str, list[int]], rng: random.Random) -> Iterator[Knobs]:
        return (_uniform(space, rng) for _ in range(FALLBACK_DRAWS))
