"""GPU duty over time: per GPU, the fraction of each time bin that its GPU steps held the GPU.

The intervals are the ones the GPU executor records with each measurement and profile
(``MeasureResult.gpu_started_at``/``gpu_busy_s``, ``Profile`` the same; Redis's clock, so hosts agree).
Steps whose interval was not recorded (records written before those fields existed) do not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from croqq.report.model import Busy

BINS = 80


@dataclass(frozen=True)
class Duty:
    start: float  # Unix seconds of the first bin's left edge
    bin_s: float
    gpus: list[str]  # row order
    fractions: list[list[float]]  # per GPU, per bin, in [0, 1]

    def mean(self, row: int) -> float:
        values = self.fractions[row]
        return sum(values) / len(values)


def duty(busy: list[Busy], bins: int = BINS) -> Duty | None:
    """Busy fraction per GPU and time bin over the span of ``busy``; None without any interval."""
    if not busy:
        return None
    start = min(b.start for b in busy)
    end = max(b.start + b.seconds for b in busy)
    bin_s = max(end - start, 1e-6) / bins
    gpus = sorted({b.gpu_uuid for b in busy})
    row = {uuid: i for i, uuid in enumerate(gpus)}
    acc = [[0.0] * bins for _ in gpus]
    for b in busy:
        values, lo, hi = acc[row[b.gpu_uuid]], b.start - start, b.start - start + b.seconds
        first, last = int(lo // bin_s), min(int(hi // bin_s), bins - 1)
        for i in range(first, last + 1):
            values[i] += max(0.0, min(hi, (i + 1) * bin_s) - max(lo, i * bin_s))
    fractions = [[min(1.0, v / bin_s) for v in values] for values in acc]
    return Duty(start, bin_s, gpus, fractions)
