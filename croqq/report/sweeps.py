"""Scenario sweep lines from the manifest (``scenarios.<name>.shapes``): which stored shapes lie on each.

A pattern with one free variable is one line over that variable: ``["S", 8192, 8192]`` over S, and a
pattern whose positions share one variable, ``["T", "T", 4096]`` or ``["S", "S", "S"]``, is one line over
it too. A pattern with no variable or with two different ones is not a line. A point is a stored shape of
the line's dtype whose (M, N, K) the pattern gives for that value: membership comes from the sizes, so a
shape stored under several scenarios is drawn on each of their lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from croqq.domain.manifest import Dim, Manifest
from croqq.report.model import ShapeData


@dataclass(frozen=True)
class SweepLine:
    scenario: str
    pattern: tuple[Dim, Dim, Dim]
    var: str
    values: tuple[int, ...]

    @property
    def label(self) -> str:
        return "(" + ", ".join(str(d) for d in self.pattern) + ")"

    def dims(self, value: int) -> tuple[int, int, int]:
        m, n, k = (value if isinstance(d, str) else d for d in self.pattern)
        return (m, n, k)


def sweep_lines(manifest: Manifest) -> list[SweepLine]:
    """Every sweep line of the manifest, in manifest order."""
    lines = []
    for name, scenario in manifest.scenarios.items():
        for pattern in scenario.shapes:
            names = {d for d in pattern if isinstance(d, str)}
            if len(names) == 1:
                var = names.pop()
                lines.append(SweepLine(name, pattern, var, tuple(sorted(scenario.vars[var]))))
    return lines


def points(line: SweepLine, shapes: dict[tuple[int, int, int], ShapeData]) -> list[tuple[int, ShapeData]]:
    """(swept value, shape) for each value of the line with a stored shape; ``shapes`` by (M, N, K)."""
    found = [(value, shapes.get(line.dims(value))) for value in line.values]
    return [(value, shape) for value, shape in found if shape is not None]
