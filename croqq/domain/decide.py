"""DECIDE and the measurement sanity rules, as pure functions."""

from __future__ import annotations

from croqq.domain.records import Measurement, MeasureResult

KEEP = "KEEP"
DISCARD = "DISCARD"
BASELINE = "BASELINE"
SIBLING = "SIBLING"  # a candidate measured beside the iteration's chosen one (history, ideas.jsonl)
SANITY_HIGH = 1.5
SANITY_LOW = 0.5


def fail_decision(outcome: str) -> str:
    return f"FAIL_{outcome}"


def needs_confirmation(candidate: Measurement, best_tflops: float, margin: float) -> bool:
    """A verified candidate that looks like a win, or lies outside [0.5x, 1.5x] of the best, is re-measured
    interleaved with the best before it counts."""
    if candidate.outcome != "ok" or best_tflops <= 0:
        return False
    ratio = candidate.tflops / best_tflops
    return ratio > 1.0 + margin or ratio > SANITY_HIGH or ratio < SANITY_LOW


def counted_tflops(result: MeasureResult) -> float:
    """The figure that is recorded: the interleaved re-measure when there was one."""
    if result.confirmation is not None:
        return result.confirmation.candidate_tflops
    return result.candidate.tflops


def decide(result: MeasureResult, best_tflops: float, margin: float) -> str:
    """KEEP only if the candidate beats the best by more than the margin *and* the interleaved
    confirmation agrees; runtime failures are FAIL_<reason>; everything else is DISCARD."""
    cand = result.candidate
    if cand.outcome != "ok":
        return fail_decision(cand.outcome)
    if best_tflops <= 0:
        return KEEP  # nothing valid to beat yet (the baseline failed)
    if cand.tflops <= best_tflops * (1.0 + margin):
        return DISCARD
    conf = result.confirmation
    if conf is None:
        return DISCARD  # an unconfirmed win never counts
    if conf.candidate_tflops > conf.best_tflops * (1.0 + margin):
        return KEEP
    return DISCARD
