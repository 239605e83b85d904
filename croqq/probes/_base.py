"""The probe interface: ``discover()`` the host's GPUs and ``read(uuid)`` one GPU's raw state.

Judging health is shared: :meth:`GpuProbe.health` turns a raw :class:`Reading` into a verdict with the
same thresholds for the NVML probe and its simulated twin, so one contract suite covers both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import BaseModel, ConfigDict

from croqq.domain.records import GpuSnapshot

# XIDs a faulty *application* causes (illegal address, MMU fault, robust channel reset after a crash,
# preemptive cleanup): a crashing candidate, not a sick GPU. Every other XID marks the GPU unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})

# Clock-event reasons that mean "throttled for power or heat" (names as NVML documents them).
BAD_THROTTLE = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


class GpuInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str
    index: int
    name: str
    gpu_type: str  # sm<cc>_<name with spaces as _>
    memory_mib: int


class Reading(BaseModel):
    """Raw state of one GPU; fields a device does not support stay at their neutral value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str
    util_pct: int = 0
    mem_used_mib: int = 0
    temp_c: int = 0
    sm_clock_mhz: int = 0
    mem_clock_mhz: int = 0
    power_w: float = 0.0
    throttle_reasons: list[str] = []
    foreign_pids: list[int] = []
    xid_events: list[int] = []
    ecc_uncorrected: int = 0
    retired_pending: bool = False
    responsive: bool = True

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(
            sm_clock_mhz=self.sm_clock_mhz,
            mem_clock_mhz=self.mem_clock_mhz,
            temp_c=self.temp_c,
            power_w=self.power_w,
            throttle_reasons=list(self.throttle_reasons),
        )


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    problems: list[str]
    snapshot: GpuSnapshot


class Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_temp_c: int = 85
    max_idle_util_pct: int = 10
    max_idle_mem_mib: int = 2048

    @classmethod
    def from_settings(cls, settings: object) -> Thresholds:
        return cls(**{name: getattr(settings, name) for name in cls.model_fields})


def judge(reading: Reading, limits: Thresholds) -> list[str]:
    """Every reason this GPU must not be measured on right now (empty: healthy)."""
    problems: list[str] = []
    if not reading.responsive:
        problems.append("GPU is not responding")
    if reading.foreign_pids:
        problems.append(f"foreign compute process(es) {sorted(reading.foreign_pids)}")
    if reading.util_pct > limits.max_idle_util_pct:
        problems.append(f"utilization {reading.util_pct}% > {limits.max_idle_util_pct}% while idle")
    if reading.mem_used_mib > limits.max_idle_mem_mib:
        used, limit = reading.mem_used_mib, limits.max_idle_mem_mib
        problems.append(f"memory in use {used} MiB > {limit} MiB while idle")
    if reading.temp_c > limits.max_temp_c:
        problems.append(f"temperature {reading.temp_c} C > {limits.max_temp_c} C")
    gpu_xids = [x for x in reading.xid_events if x not in APPLICATION_XIDS]
    if gpu_xids:
        problems.append(f"XID error(s) {gpu_xids}")
    if reading.ecc_uncorrected:
        problems.append(f"{reading.ecc_uncorrected} uncorrected ECC error(s)")
    if reading.retired_pending:
        problems.append("row remapping / page retirement pending (reset needed)")
    bad = sorted(BAD_THROTTLE.intersection(reading.throttle_reasons))
    if bad:
        problems.append(f"clocks throttled ({', '.join(bad)})")
    return problems


class GpuProbe(ABC):
    """A host's GPUs: :class:`croqq.probes.nvml.NvmlProbe` and :class:`croqq.probes.sim.SimProbe`."""

    kind: str = "base"

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()

    @abstractmethod
    def discover(self) -> list[GpuInfo]:
        """The GPUs of this host, in index order."""

    @abstractmethod
    def read(self, uuid: str) -> Reading:
        """Raw state of one GPU."""

    def health(self, uuid: str) -> Health:
        reading = self.read(uuid)
        problems = judge(reading, self.thresholds)
        return Health(ok=not problems, problems=problems, snapshot=reading.snapshot())

    def snapshot(self, uuid: str) -> GpuSnapshot:
        return self.read(uuid).snapshot()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release library handles (NVML shutdown)."""


def gpu_type_name(compute_capability: tuple[int, int], name: str) -> str:
    """``(9, 0), "NVIDIA H100 80GB HBM3"`` -> ``sm90_NVIDIA_H100_80GB_HBM3``."""
    major, minor = compute_capability
    return f"sm{major}{minor}_{'_'.join(name.split())}"
