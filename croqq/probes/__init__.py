"""GPU health probes: NVML on real hardware, a simulated twin with injectable faults."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from croqq.probes._base import GpuProbe
    from croqq.settings import Settings


def make_probe(settings: Settings, redis_client: Any = None) -> GpuProbe:
    """NVML when asked for (or, with probe=auto, when NVML finds a GPU); else the simulated probe,
    whose faults live in Redis (so tests and `croqq stress` can inject them) when a client is given."""
    from croqq.probes._base import Thresholds

    thresholds = Thresholds.from_settings(settings)
    if settings.probe in ("nvml", "auto"):
        from croqq.probes.nvml import NvmlProbe, nvml_available

        if settings.probe == "nvml" or nvml_available():
            return NvmlProbe(thresholds)
    from croqq.probes.sim import RedisFaults, SimProbe

    faults = RedisFaults(redis_client) if redis_client is not None else None
    return SimProbe(
        thresholds,
        count=settings.sim_gpus,
        gpu_type=settings.sim_gpu_type,
        faults=faults,
        host=settings.sim_machine or None,
    )
