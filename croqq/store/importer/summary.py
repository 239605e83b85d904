"""One source log's figures for ``croqq import --json`` and its table.

``measured`` counts distinct canonical iteration ids (iter012, iter012b, 12 are one) with a numeric TFLOPS,
0 included. A repeated id keeps every measurement: the best is the highest of all, and the id of the row
that holds it is reported as written (the earliest such row on a tie). Reference rows never count toward the
best. Rows without a decision token count under ``"NONE"``. ``duplicate_ids`` are ids written more than
once (``38`` and ``iter038`` are one id; the marked re-run ``iter038b`` is another).
"""

from __future__ import annotations

import re
from collections import Counter

from croqq.store.importer.model import SourceLog

NO_DECISION = "NONE"


def summarize(log: SourceLog) -> dict[str, object]:
    tuned = [r for r in log.rows if not r.reference and r.tflops is not None]
    best = max(tuned, key=lambda r: r.tflops or 0.0, default=None)
    ids = Counter(_canonical(r.original_id, r.iteration, rerun=True) for r in log.rows)
    return {
        "source": log.source,
        "key": log.key.croqq_key,
        "imported_as": log.imported_as,
        "rows": len(log.rows),
        "measured": len({_canonical(r.original_id, r.iteration) for r in log.rows if r.tflops is not None}),
        "best_tflops": best.tflops if best else None,
        "best_iter": best.original_id if best else None,
        "reference_tflops": log.reference_tflops,
        "decisions": dict(sorted(Counter(r.decision or NO_DECISION for r in log.rows).items())),
        "duplicate_ids": sorted(i for i, n in ids.items() if n > 1),
        "problems": [{"line": p.line, "reason": p.reason} for p in log.problems],
    }


def _canonical(original_id: str, iteration: int | None, *, rerun: bool = False) -> str:
    """``iter012``, ``iter012b``, ``iter012_naive`` and ``12`` are all ``iter012`` (with ``rerun``, the
    re-run ``iter012b`` stays apart: a duplicate id is one written again, not a marked re-run); a baseline
    id stays as written."""
    if iteration is None:
        return original_id.lower()
    letter = re.match(r"iter\d+([a-z])", original_id, re.IGNORECASE) if rerun else None
    return f"iter{iteration:03d}{letter.group(1).lower() if letter else ''}"
