"""Measurement backends: the simulated GPU and real CUDA, behind one small interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from croqq.backends._base import Backend
    from croqq.delivery.artifacts import ArtifactStore
    from croqq.domain.manifest import Manifest
    from croqq.settings import Settings


def make_backend(settings: Settings, manifest: Manifest, artifacts: ArtifactStore | None = None) -> Backend:
    """The configured backend; ``artifacts`` is the cluster's artifact store (default: this host only)."""
    if settings.backend == "cuda":
        from croqq.backends.cuda import CudaBackend

        return CudaBackend(manifest, settings, artifacts)
    from croqq.backends.sim import SimBackend

    return SimBackend(manifest, settings, artifacts)
