"""The seed's phase discipline, as data: which kind of change the next IDEATE asks for.

- ``knobs``: tiles and pipeline depth first (the template's macros);
- ``structural``: CUDA edits (CTA scheduling, shared-memory layout, barrier wait depths,
  ``__launch_bounds__``, the epilogue): asked for after two knob-only changes in a row, and whenever the
  strategy signal says escalate;
- ``regenerate``: a new kernel (from a DSL or from scratch), when the strategy goes radical;
- ``micro``: profile-guided micro-optimizations, right after a fresh profile of a kernel that already
  carries structural changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from croqq.domain.records import HistoryEntry, Strategy, TuningPhase

KNOB_RUN = 2  # knob-only changes in a row before a structural change is asked for


def next_phase(
    strategy: Strategy, history: Sequence[HistoryEntry], profile_fresh: bool
) -> tuple[TuningPhase, str]:
    """(phase, the reason in words) for the next candidate of a shape."""
    if strategy == "radical":
        return "regenerate", "10+ iterations without a win: try a different kernel design"
    if strategy == "escalate":
        return "structural", "5+ iterations without a win: knob moves are exhausted, change the code"
    changes = [e.change for e in history if e.iteration is not None and e.candidate is None and e.change]
    if len(changes) >= KNOB_RUN and all(c == "knobs" for c in changes[-KNOB_RUN:]):
        return "structural", f"the last {KNOB_RUN} changes were knob-only: make a structural change"
    if profile_fresh and changes and changes[-1] == "structural":
        return "micro", "a fresh profile of a structurally edited kernel: act on its metrics"
    return "knobs", "tune the template's knobs (tiles, pipeline depth, warps, swizzle, split-K)"
