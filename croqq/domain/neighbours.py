"""Which shapes are a shape's neighbours: the same log2 space the schedule ranks shapes in.

A neighbour is another shape of the same dtype (and, where the caller asks, the same family and GPU type)
that has already advanced; the nearest come first. Pure: callers bring the candidate shapes (from the live
ledger in a cluster, from the visited shapes in a benchmark).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

from croqq.domain.fsm import STALL_ESCALATE
from croqq.domain.shapes import Shape

S = TypeVar("S")

TRANSFER_NEIGHBOURS = 4  # how many of the nearest advanced neighbours' best kernels a shape is offered
STALL_TRANSFER = STALL_ESCALATE  # consecutive non-KEEPs at which a stalled shape is offered them again


def transfer_due(current_iter: int, consecutive_discards: int) -> bool:
    """Whether an IDEATE offers the neighbours' kernels: for a shape's first ``TRANSFER_NEIGHBOURS``
    iterations (it starts), and when it stalls. A kernel already tried by the shape is never offered again
    (the caller skips content hashes the shape has tried), so a stall offers only what is new next door."""
    return current_iter < TRANSFER_NEIGHBOURS or consecutive_discards == STALL_TRANSFER


def log2_distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """Euclidean distance between two (M, N, K) in log2 space (the schedule's metric)."""
    return math.sqrt(sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b, strict=True)))


def dims(shape: Shape) -> tuple[int, int, int]:
    return (shape.m, shape.n, shape.k)


def nearest(
    shape: Shape, others: Iterable[tuple[Shape, S]], limit: int, max_distance: float = math.inf
) -> list[tuple[Shape, S]]:
    """The ``limit`` nearest of ``others`` (shape, payload) with ``shape``'s dtype, itself excluded, within
    ``max_distance``; ties by (M, N, K) so that the order is deterministic."""
    here = dims(shape)
    ranked = sorted(
        (
            (round(log2_distance(here, dims(other)), 9), dims(other), other, payload)
            for other, payload in others
            if other.dtype == shape.dtype and other.key != shape.key
        ),
        key=lambda row: (row[0], row[1]),
    )
    return [(other, payload) for dist, _, other, payload in ranked if dist <= max_distance][:limit]
