"""The NVML probe without a driver (the real library, genuinely absent here), its clock-reason mapping,
and its reading logic against a small stand-in for a driver."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from croqq.errors import ConfigError
from croqq.probes import nvml
from croqq.probes._base import BAD_THROTTLE
from croqq.probes.nvml import NOT_FOUND, NvmlProbe, clock_reason_names, nvml_available

HAS_NVML = nvml_available()
needs_no_driver = pytest.mark.skipif(
    HAS_NVML, reason="this host has an NVIDIA driver; the no-driver path is moot"
)


# -- no driver -------------------------------------------------------------------------------------


@needs_no_driver
def test_nvml_is_unavailable_without_a_driver() -> None:
    assert nvml_available() is False


@needs_no_driver
def test_discover_without_a_driver_says_so_in_one_line() -> None:
    probe = NvmlProbe()
    with pytest.raises(ConfigError) as caught:
        probe.discover()
    assert str(caught.value) == NOT_FOUND
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="NVML not found"):
        probe.read("GPU-00000000-0000-0000-0000-000000000000")
    probe.close()


def test_constructing_and_closing_a_probe_never_touches_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for name in dir(pynvml):
        if name.startswith("nvml") and callable(getattr(pynvml, name)):
            monkeypatch.setattr(pynvml, name, lambda *_, name=name: calls.append(name))
    NvmlProbe().close()
    assert calls == []
    nvml_available()  # the recorder sees a call that does reach the driver
    assert calls[0] == "nvmlInit"


def test_missing_bindings_give_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml_available() is False
    with pytest.raises(ConfigError, match="pip install nvidia-ml-py"):
        NvmlProbe().discover()


# -- clock event reasons -----------------------------------------------------------------------------


def test_clock_reason_bits_match_nvml() -> None:
    names = {
        "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
        "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
        "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
        "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
        "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
        "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
        "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
        "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
    }
    for name, bit in names.items():
        assert clock_reason_names(bit) == [name]
    assert set(BAD_THROTTLE) <= set(names)


def test_clock_reason_mask_maps_to_names() -> None:
    assert clock_reason_names(0) == []
    assert clock_reason_names(0x4 | 0x40 | 0x1) == ["gpu_idle", "sw_power_cap", "hw_thermal"]
    assert clock_reason_names(0x200 | 0x8) == ["hw_slowdown", "reason_0x200"]


# -- reading logic, against a stand-in driver ------------------------------------------------------

UUID = "GPU-3b2c6a1e-0000-4000-8000-000000000001"
GIB = 1024**3


class FakeNvml:
    """Enough of ``pynvml`` for one idle H100, with the real error classes and constants."""

    def __init__(self) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.unsupported: set[str] = set()
        self.lost = False
        self.xids: list[int] = []
        self.pids: list[int] = []
        self.reasons = pynvml.nvmlClocksEventReasonGpuIdle
        self.inits = self.shutdowns = 0

    def _query(self, name: str, value: Any) -> Any:
        if self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if name in self.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return value

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return "handle0"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != UUID:
            raise pynvml.NVMLError_NotFound()
        return "handle0"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return UUID

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetCudaComputeCapability(self, handle: str) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return self._query("memory", SimpleNamespace(total=80 * GIB, used=GIB // 2))

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return self._query("util", SimpleNamespace(gpu=0, memory=0))

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return self._query("temp", 34)

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        return self._query("clocks", 1980 if clock == pynvml.NVML_CLOCK_SM else 2619)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return self._query("power", 71_500)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return self._query("reasons", self.reasons)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        return self._query("processes", [SimpleNamespace(pid=pid, usedGpuMemory=0) for pid in self.pids])

    def nvmlDeviceGetTotalEccErrors(self, handle: str, error_type: int, counter: int) -> int:
        return self._query("ecc", 0)

    def nvmlDeviceGetRemappedRows(self, handle: str) -> tuple[int, int, int, int]:
        return self._query("rows", (0, 0, 0, 0))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: str) -> int:
        raise pynvml.NVMLError_NotSupported()

    def nvmlEventSetCreate(self) -> str:
        return "events0"

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, event_set: str) -> None:
        self._query("events", None)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0
        if not self.xids:
            raise pynvml.NVMLError_Timeout()
        return SimpleNamespace(eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=self.xids.pop(0))

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: fake)
    return fake


def test_discover_names_the_gpu_type_from_compute_capability(driver: FakeNvml) -> None:
    (gpu,) = NvmlProbe().discover()
    assert (gpu.uuid, gpu.index, gpu.gpu_type, gpu.memory_mib) == (
        UUID,
        0,
        "sm90_NVIDIA_H100_80GB_HBM3",
        81920,
    )


def test_idle_device_reads_healthy(driver: FakeNvml) -> None:
    probe = NvmlProbe()
    reading = probe.read(UUID)
    assert (reading.sm_clock_mhz, reading.mem_clock_mhz, reading.temp_c, reading.power_w) == (
        1980,
        2619,
        34,
        71.5,
    )
    assert reading.throttle_reasons == ["gpu_idle"]
    assert probe.health(UUID).ok
    assert driver.inits == 1


def test_unsupported_queries_stay_neutral(driver: FakeNvml) -> None:
    driver.unsupported = {"temp", "power", "ecc", "rows", "events", "processes"}
    reading = NvmlProbe().read(UUID)
    assert (reading.temp_c, reading.power_w, reading.ecc_uncorrected, reading.retired_pending) == (
        0,
        0.0,
        0,
        False,
    )
    assert reading.responsive


def test_a_lost_gpu_reads_as_not_responding(driver: FakeNvml) -> None:
    driver.lost = True
    health = NvmlProbe().health(UUID)
    assert not health.ok
    assert health.problems == ["GPU is not responding"]


def test_xid_events_are_drained_once(driver: FakeNvml) -> None:
    probe = NvmlProbe()
    driver.xids = [79, 48]
    assert probe.read(UUID).xid_events == [79, 48]
    assert probe.read(UUID).xid_events == []


def test_own_processes_are_not_foreign(driver: FakeNvml) -> None:
    driver.pids = [os.getpid(), 4242, 777]
    assert NvmlProbe(own_pids={777}).read(UUID).foreign_pids == [4242]


def test_power_and_thermal_throttling_is_reported(driver: FakeNvml) -> None:
    driver.reasons = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert "clocks throttled (hw_thermal, sw_power_cap)" in NvmlProbe().health(UUID).problems


def test_unknown_uuid_is_a_config_error(driver: FakeNvml) -> None:
    with pytest.raises(ConfigError, match="GPU-nope"):
        NvmlProbe().read("GPU-nope")


def test_close_shuts_nvml_down_once(driver: FakeNvml) -> None:
    probe = NvmlProbe()
    probe.read(UUID)
    probe.close()
    probe.close()
    assert driver.shutdowns == 1


def test_importing_the_probe_loads_no_nvml() -> None:
    code = "import sys, croqq.probes.nvml; sys.exit('pynvml' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
