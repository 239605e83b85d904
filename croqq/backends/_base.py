"""The backend interface: ``build``, ``measure`` and ``profile`` a candidate.

The measurement protocol that does not depend on the hardware (re-measure the best after a migration,
confirm an apparent win by interleaving candidate and best on the same GPU, the 0.5x/1.5x sanity rule)
is a concrete helper here, so the simulated and the CUDA backend follow it identically.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from croqq.domain.decide import needs_confirmation
from croqq.domain.knobs import Candidate
from croqq.domain.manifest import Manifest
from croqq.domain.records import BuildOutcome, Confirmation, Measurement, MeasureResult, Profile
from croqq.domain.shapes import Shape
from croqq.probes._base import GpuProbe
from croqq.settings import Settings

CONFIRM_ROUNDS = 3


@dataclass(frozen=True)
class GpuContext:
    """The claimed GPU a step runs on."""

    uuid: str
    index: int
    gpu_type: str
    probe: GpuProbe


class Backend(ABC):
    """Implementations: :class:`croqq.backends.sim.SimBackend`, :class:`croqq.backends.cuda.CudaBackend`."""

    name: str = "base"

    def __init__(self, manifest: Manifest, settings: Settings) -> None:
        self.manifest = manifest
        self.settings = settings

    @abstractmethod
    def build(self, shape: Shape, candidate: Candidate) -> BuildOutcome:
        """Materialize and compile; a compile error is an outcome with ``ok=False``, not an exception."""

    @abstractmethod
    def measure(self, gpu: GpuContext, shape: Shape, artifacts: Sequence[str]) -> list[Measurement]:
        """Verify, then time each artifact (interleaved when several); one Measurement per artifact."""

    @abstractmethod
    def profile(self, gpu: GpuContext, shape: Shape, artifact: str) -> Profile:
        """Profile one artifact and classify its bottleneck."""

    def vendor_tflops(self, gpu: GpuContext, shape: Shape) -> float | None:
        """The vendor library's figure for this shape (cuBLAS), where the backend has one."""
        return None

    # -- shared protocol ----------------------------------------------------------------------------

    def peak_tflops(self, gpu_type: str, dtype: str) -> float:
        return self.manifest.gpu(gpu_type).peak_tflops[dtype]

    def hw_eff_pct(self, gpu_type: str, dtype: str, tflops: float) -> float:
        return round(100.0 * tflops / self.peak_tflops(gpu_type, dtype), 3)

    def measure_candidate(
        self,
        gpu: GpuContext,
        shape: Shape,
        artifact: str,
        best_artifact: str | None,
        best_tflops: float,
        rebase: bool = False,
    ) -> MeasureResult:
        """MEASURE: optional re-measure of the best (after a migration), the candidate, then the
        interleaved confirmation when the candidate looks like a win or fails the sanity rule."""
        rebased: float | None = None
        if rebase and best_artifact is not None:
            (best_run,) = self.measure(gpu, shape, [best_artifact])
            if best_run.outcome == "ok":
                rebased = best_run.tflops
                best_tflops = rebased
        (cand,) = self.measure(gpu, shape, [artifact])
        confirmation = None
        if best_artifact is not None and needs_confirmation(cand, best_tflops, self.settings.noise_margin):
            confirmation = self.confirm(gpu, shape, artifact, best_artifact)
        return MeasureResult(
            candidate=cand, confirmation=confirmation, rebased_best_tflops=rebased, gpu_uuid=gpu.uuid
        )

    def confirm(self, gpu: GpuContext, shape: Shape, artifact: str, best_artifact: str) -> Confirmation:
        cand_runs: list[float] = []
        best_runs: list[float] = []
        for _ in range(CONFIRM_ROUNDS):
            cand, best = self.measure(gpu, shape, [artifact, best_artifact])
            cand_runs.append(cand.tflops if cand.outcome == "ok" else 0.0)
            best_runs.append(best.tflops if best.outcome == "ok" else 0.0)
        return Confirmation(
            candidate_tflops=statistics.median(cand_runs),
            best_tflops=statistics.median(best_runs),
            rounds=CONFIRM_ROUNDS,
        )
