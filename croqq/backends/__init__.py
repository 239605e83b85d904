"""Measurement backends: the simulated GPU, real CUDA and a recorded landscape's replay, behind one small
interface."""

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
    if settings.backend == "replay":
        from croqq.backends.replay import ReplayBackend

        return ReplayBackend(manifest, settings, artifacts)
    from croqq.backends.sim import SimBackend

    return SimBackend(manifest, settings, artifacts)


def backend_manifest(settings: Settings) -> Manifest:
    """The manifest every process of a cluster works from: ``CROQQ_MANIFEST``'s, plus (backend=replay) the
    replay dsl whose knob space is ``CROQQ_REPLAY_CACHE``'s (loaded once per process)."""
    from croqq.domain.manifest import cached_manifest

    manifest = cached_manifest(str(settings.manifest))
    if settings.backend != "replay":
        return manifest
    from croqq.backends.replay import replay_manifest, settings_landscape

    return replay_manifest(manifest, settings_landscape(settings))
