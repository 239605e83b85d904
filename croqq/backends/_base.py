"""The backend interface: ``build``, ``measure`` and ``profile`` a candidate.

A build's bytes never travel as a path: ``build`` puts them in the artifact store
(:mod:`croqq.delivery.artifacts`) and the artifact string in step state is a small :class:`KernelRef`
(what was built, for which shape, and the content reference of its bytes). ``measure`` and ``profile``
get the bytes back by that reference, verified, and never build: a missing or corrupt artifact raises
:class:`~croqq.errors.ArtifactMissingError` naming the artifact string, and a build host rebuilds it.

The measurement protocol that does not depend on the hardware (re-measure the best after a migration,
confirm an apparent win by interleaving candidate and best on the same GPU, the 0.5x/1.5x sanity rule)
is a concrete helper here, so the simulated and the CUDA backend follow it identically.
"""

from __future__ import annotations

import contextlib
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from croqq import diskspace
from croqq.backends.toolchain import package_includes, really_compiles
from croqq.delivery.artifacts import ArtifactRef, ArtifactStore
from croqq.domain.decide import needs_confirmation
from croqq.domain.knobs import Candidate, render_source
from croqq.domain.manifest import Manifest
from croqq.domain.records import BuildOutcome, Confirmation, Measurement, MeasureResult, Profile
from croqq.domain.shapes import Shape
from croqq.errors import (
    ArtifactMissingError,
    ArtifactTooLargeError,
    ConfigError,
    CroqqError,
    HostError,
    InvalidRecordError,
)
from croqq.probes._base import GpuProbe
from croqq.settings import Settings

CONFIRM_ROUNDS = 3
T = TypeVar("T")
A = TypeVar("A", bound=BaseModel)


@dataclass(frozen=True)
class GpuContext:
    """The claimed GPU a step runs on."""

    uuid: str
    index: int
    gpu_type: str
    probe: GpuProbe


@dataclass(frozen=True)
class Batch:
    """MEASURE of several candidates: the index of the one chosen, its result, every candidate's run."""

    chosen: int
    result: MeasureResult
    runs: list[Measurement]


class KernelRef(BaseModel):
    """The artifact string a build hands on in step state (a few hundred bytes, whatever was built)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str
    key: str
    dsl: str
    content_hash: str
    artifact: ArtifactRef


class Backend(ABC):
    """Implementations: :class:`croqq.backends.sim.SimBackend`, :class:`croqq.backends.cuda.CudaBackend`.

    ``artifacts`` is where builds put their bytes and GPU steps get them; without one, this host's
    folder-only store (single-host tools and tests)."""

    name: str = "base"

    def __init__(
        self, manifest: Manifest, settings: Settings, artifacts: ArtifactStore | None = None
    ) -> None:
        self.manifest = manifest
        self.settings = settings
        self.artifacts = artifacts or ArtifactStore(settings)

    def check_dsl(self, dsl: str) -> None:  # noqa: B027 (a hook: most backends tune every family)
        """Refuse (ConfigError, one line) a kernel family this backend cannot tune; every one by default."""

    def rule_refusal(self, shape: Shape, candidate: Candidate) -> BuildOutcome | None:
        """The attempt ``knob rule: <why>`` for a knob candidate (the family's template rendered) that
        breaks one of its rules, with no compile; None otherwise (an edited source is the compiler's)."""
        spec = self.manifest.dsl(candidate.dsl)
        if not set(spec.knobs) <= set(candidate.knobs):  # a knob left undefined: the compiler's to say
            return None
        if candidate.source != render_source(self.manifest, candidate.dsl, shape, candidate.knobs):
            return None
        dims = (shape.m, shape.n, shape.k)
        broken = spec.broken_rule(candidate.knobs, dims, self.manifest.dtypes[shape.dtype])
        return BuildOutcome(ok=False, reason=f"knob rule: {broken}", log="(not compiled)") if broken else None

    def build_problems(self) -> dict[str, CroqqError]:
        """Why this host cannot build each kernel family it cannot: the backend does not tune it
        (ConfigError), or a package its headers come from is missing or another version (HostError, when
        it really compiles). A build worker consumes no other family's queue."""
        problems: dict[str, CroqqError] = {}
        for dsl in self.manifest.dsls:
            try:
                self.check_dsl(dsl)
                if really_compiles(self.settings):
                    package_includes(self.manifest.dsl(dsl).build, dsl)
            except (ConfigError, HostError) as exc:
                problems[dsl] = exc
        return problems

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

    # -- the build folder ---------------------------------------------------------------------------

    @property
    def build_dir(self) -> Path:
        """Where this build host compiles (its own disk: a full one is the host's fault)."""
        return self.settings.resolved_build_dir()

    def build_disk(self) -> contextlib.AbstractContextManager[None]:
        """Around a build's writes to the build folder: a full disk raises DiskFullError."""
        return diskspace.guard(self.build_dir, "the build folder", self.settings.disk_retry_s)

    def check_compiler_disk(self, candidate: Candidate, log_text: str) -> None:
        """A compile that failed because the build folder's disk filled up is the host's fault, not the
        candidate's: DiskFullError (unless the candidate's own text carries those words, so that a
        candidate cannot pass off its failure as the disk's)."""
        texts = (candidate.source, *candidate.headers.values())
        if diskspace.says_full(log_text) and not any(diskspace.says_full(t) for t in texts):
            line = next((ln for ln in log_text.splitlines() if diskspace.says_full(ln)), "")
            retry_s = self.settings.disk_retry_s
            raise diskspace.full_error(self.build_dir, "the build folder", retry_s, detail=line)

    # -- artifacts ----------------------------------------------------------------------------------

    def built(
        self, shape: Shape, candidate: Candidate, payload: bytes, log: str, seconds: float = 0.0
    ) -> BuildOutcome:
        """A successful build's outcome: ``payload`` put in the artifact store, its reference in the
        artifact string (a payload over the store's cap is a failed build, with the reason)."""
        try:
            ref = self.artifacts.put(payload)
        except ArtifactTooLargeError as exc:
            return BuildOutcome(ok=False, reason=str(exc), log=log, seconds=seconds)
        kernel = KernelRef(
            backend=self.name,
            key=shape.key,
            dsl=candidate.dsl,
            content_hash=candidate.content_hash,
            artifact=ref,
        )
        return BuildOutcome(ok=True, artifact=kernel.model_dump_json(), log=log, seconds=seconds)

    def kernel_ref(self, shape: Shape, artifact: str) -> KernelRef:
        """The reference in an artifact string; one this backend cannot use (another format, another
        backend) is missing, so that a build host builds it again."""
        try:
            ref = KernelRef.model_validate_json(artifact)
        except ValidationError as exc:
            raise ArtifactMissingError(
                f"{shape.key}: {artifact[:80]!r} is not a reference to a stored artifact", artifact
            ) from exc
        if ref.backend != self.name:
            raise ArtifactMissingError(
                f"{shape.key}: artifact {ref.artifact.short} was built by the {ref.backend} backend, "
                f"not {self.name}",
                artifact,
            )
        if ref.key != shape.key:
            raise InvalidRecordError(
                f"artifact {ref.artifact.short} was built for {ref.key}, not {shape.key}"
            )
        return ref

    def binary_digest(self, shape: Shape, artifact: str) -> str:
        """The built bytes' hash (two candidates that compile to the same binary are one kernel)."""
        return self.kernel_ref(shape, artifact).artifact.sha256

    def fetch(self, shape: Shape, artifact: str) -> bytes:
        """GPU side: an artifact's verified bytes (this host's cache, else Redis); never builds."""
        return self._fetched(shape, artifact, self.artifacts.get)

    def fetch_file(self, shape: Shape, artifact: str) -> Path:
        """GPU side: the verified local file of an artifact (fetched when this host has none)."""
        return self._fetched(shape, artifact, self.artifacts.path)

    def decoded(self, shape: Shape, artifact: str, model: type[A]) -> A:
        """GPU side: a JSON payload's model (``key`` and ``hash`` fields), fetched and checked to be for
        this shape (the sim's and the replay backend's artifacts)."""
        payload = self.fetch(shape, artifact)
        try:
            art = model.model_validate_json(payload)
        except ValidationError as exc:
            raise InvalidRecordError(f"not a {self.name} artifact: {payload[:80]!r}") from exc
        if art.key != shape.key:  # type: ignore[attr-defined]
            raise InvalidRecordError(
                f"artifact {art.hash[:12]} was built for {art.key}, not {shape.key}"  # type: ignore[attr-defined]
            )
        return art

    def _fetched(self, shape: Shape, artifact: str, get: Callable[[ArtifactRef], T]) -> T:
        ref = self.kernel_ref(shape, artifact)
        try:
            return get(ref.artifact)
        except ArtifactMissingError as exc:
            raise ArtifactMissingError(f"{shape.key}: {exc}", artifact) from exc

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
        """MEASURE of one candidate (:meth:`measure_candidates` with a batch of one)."""
        return self.measure_candidates(gpu, shape, [artifact], best_artifact, best_tflops, rebase).result

    def measure_candidates(
        self,
        gpu: GpuContext,
        shape: Shape,
        artifacts: Sequence[str],
        best_artifact: str | None,
        best_tflops: float,
        rebase: bool = False,
    ) -> Batch:
        """MEASURE: optional re-measure of the best (after a migration), the candidates in one interleaved
        batch, then for the best of them (ok, highest TFLOPS; else the first) the interleaved confirmation
        when it looks like a win or fails the sanity rule."""
        rebased: float | None = None
        if rebase and best_artifact is not None:
            (best_run,) = self.measure(gpu, shape, [best_artifact])
            if best_run.outcome == "ok":
                rebased = best_run.tflops
                best_tflops = rebased
        runs = self.measure(gpu, shape, list(artifacts))
        ok = [i for i, run in enumerate(runs) if run.outcome == "ok"]
        chosen = max(ok, key=lambda i: runs[i].tflops) if ok else 0
        cand = runs[chosen]
        confirmation = None
        if best_artifact is not None and needs_confirmation(cand, best_tflops, self.settings.noise_margin):
            confirmation = self.confirm(gpu, shape, artifacts[chosen], best_artifact)
        result = MeasureResult(
            candidate=cand, confirmation=confirmation, rebased_best_tflops=rebased, gpu_uuid=gpu.uuid
        )
        return Batch(chosen=chosen, result=result, runs=runs)

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
