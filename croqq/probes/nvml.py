"""The real GPU probe: NVML through the ``pynvml`` module of the ``nvidia-ml-py`` package.

Nothing here touches the driver at import or construction time: NVML is initialized on the first
``discover()`` or ``read()``. GPU workers run Celery's prefork pool, and NVML (like CUDA) must not be
initialized in the prefork parent before it forks, so create and use the probe in the pool child only
(croqq's Runtime builds it lazily there). Should a probe be used across a fork anyway, the child notices
the new pid and initializes NVML afresh instead of reusing the parent's handles.

Each query tolerates a device that does not support it (the field keeps its neutral value). A lost GPU
(``NVML_ERROR_GPU_IS_LOST``) reads as not responding; so does any other unexpected NVML error, so that
a probe that cannot see a GPU's state never calls it healthy.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from croqq.errors import ConfigError, GpuUnavailableError
from croqq.probes._base import GpuInfo, GpuProbe, Reading, Thresholds, gpu_type_name

log = logging.getLogger(__name__)

NOT_FOUND = "NVML not found: no NVIDIA driver on this host (use CROQQ_PROBE=sim for simulated GPUs)"
MIB = 1024 * 1024
MAX_EVENTS_PER_READ = 64

# nvmlClocksEventReason* bits (same values as the older nvmlClocksThrottleReason* names).
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clock_setting"),
)
_KNOWN_REASON_BITS = sum(bit for bit, _ in CLOCK_EVENT_REASONS)

# Errors that mean "this device or driver cannot answer this query": the field stays neutral.
_NEUTRAL_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")

T = TypeVar("T")


def clock_reason_names(mask: int) -> list[str]:
    """A clock-event (throttle) reason bitmask as names; unknown bits as ``reason_0x...``."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    unknown = mask & ~_KNOWN_REASON_BITS
    names.extend(f"reason_{1 << shift:#x}" for shift in range(unknown.bit_length()) if unknown >> shift & 1)
    return names


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise ConfigError("the NVML probe needs NVML's Python bindings: pip install nvidia-ml-py") from exc
    return pynvml


def _init_nvml() -> Any:
    """Initialize NVML (reference-counted by the library) and return the ``pynvml`` module."""
    nv = _import_pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError_LibraryNotFound:
        raise ConfigError(NOT_FOUND) from None
    except nv.NVMLError_DriverNotLoaded:
        raise ConfigError(
            "NVIDIA driver not loaded: NVML cannot reach any GPU (use CROQQ_PROBE=sim for simulated GPUs)"
        ) from None
    except nv.NVMLError as exc:
        raise ConfigError(
            f"NVML failed to initialize: {exc} (use CROQQ_PROBE=sim for simulated GPUs)"
        ) from exc
    return nv


def nvml_available() -> bool:
    """True only if NVML initializes and reports at least one GPU; never raises."""
    try:
        nv = _init_nvml()
    except ConfigError as exc:
        log.debug("NVML unavailable: %s", exc)
        return False
    try:
        return int(nv.nvmlDeviceGetCount()) >= 1
    except Exception as exc:
        log.debug("NVML initialized but cannot count devices: %s", exc)
        return False
    finally:
        _shutdown(nv)


def _shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except nv.NVMLError as exc:
        log.debug("nvmlShutdown failed: %s", exc)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Device:
    """Queries on one NVML handle, each returning a neutral value where the device cannot answer."""

    def __init__(self, nv: Any, handle: Any) -> None:
        self.nv = nv
        self.handle = handle
        self.neutral_errors = tuple(getattr(nv, name) for name in _NEUTRAL_ERRORS if hasattr(nv, name))

    def ask(self, what: str, query: Callable[[], T], default: T) -> T:
        try:
            return query()
        except self.neutral_errors as exc:
            log.debug("NVML cannot report %s here: %s", what, exc)
            return default

    def util_pct(self) -> int:
        nv, handle = self.nv, self.handle
        return self.ask("utilization", lambda: int(nv.nvmlDeviceGetUtilizationRates(handle).gpu), 0)

    def mem_used_mib(self) -> int:
        nv, handle = self.nv, self.handle
        return self.ask("memory", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).used) // MIB, 0)

    def temp_c(self) -> int:
        nv, handle = self.nv, self.handle
        return self.ask(
            "temperature", lambda: int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)), 0
        )

    def clock_mhz(self, clock: int) -> int:
        nv, handle = self.nv, self.handle
        return self.ask("clocks", lambda: int(nv.nvmlDeviceGetClockInfo(handle, clock)), 0)

    def power_w(self) -> float:
        nv, handle = self.nv, self.handle
        return self.ask("power", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, 0.0)

    def clock_reasons(self) -> list[str]:
        return clock_reason_names(self.ask("clock event reasons", self._reason_mask, 0))

    def _reason_mask(self) -> int:
        events = getattr(self.nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if events is not None:
            try:
                return int(events(self.handle))
            except self.nv.NVMLError_FunctionNotFound:
                pass  # a driver older than the bindings: fall back to the deprecated name
        return int(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))

    def compute_pids(self) -> list[int]:
        nv, handle = self.nv, self.handle
        processes: list[Any] = self.ask(
            "compute processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle), []
        )
        return [int(process.pid) for process in processes]

    def ecc_uncorrected(self) -> int:
        nv, handle = self.nv, self.handle
        uncorrected, volatile = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        return self.ask(
            "ECC errors", lambda: int(nv.nvmlDeviceGetTotalEccErrors(handle, uncorrected, volatile)), 0
        )

    def retirement_pending(self) -> bool:
        """A row remap (Ampere+) or page retirement (older) waits for a reset, or remapping failed."""
        nv, handle = self.nv, self.handle
        rows = self.ask("remapped rows", lambda: nv.nvmlDeviceGetRemappedRows(handle), None)
        if rows is not None and (rows[2] or rows[3]):
            return True
        return bool(self.ask("retired pages", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle), 0))


class NvmlProbe(GpuProbe):
    """The GPUs NVML sees on this host. ``own_pids``: compute processes that are ours, not foreign
    (this process's pid is always treated as ours)."""

    kind = "nvml"

    def __init__(self, thresholds: Thresholds | None = None, own_pids: Iterable[int] = ()) -> None:
        super().__init__(thresholds)
        self.own_pids = frozenset(own_pids)
        self._lock = threading.RLock()
        self._nv: Any = None
        self._pid = 0
        self._handles: dict[str, Any] = {}
        self._events: dict[str, Any] = {}

    def _lib(self) -> Any:
        with self._lock:
            if self._nv is None or self._pid != os.getpid():
                self._handles.clear()
                self._events.clear()
                self._nv = _init_nvml()
                self._pid = os.getpid()
            return self._nv

    def discover(self) -> list[GpuInfo]:
        nv = self._lib()
        try:
            return [self._info(nv, index) for index in range(int(nv.nvmlDeviceGetCount()))]
        except nv.NVMLError as exc:
            raise GpuUnavailableError(f"NVML could not list this host's GPUs: {exc}") from exc

    def _info(self, nv: Any, index: int) -> GpuInfo:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        name = _text(nv.nvmlDeviceGetName(handle))
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
        memory_mib = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        with self._lock:
            self._handles[uuid] = handle
        gpu_type = gpu_type_name((int(major), int(minor)), name)
        return GpuInfo(uuid=uuid, index=index, name=name, gpu_type=gpu_type, memory_mib=memory_mib)

    def read(self, uuid: str) -> Reading:
        nv = self._lib()
        try:
            return self._read(nv, uuid, self._handle(nv, uuid))
        except nv.NVMLError_GpuIsLost:
            log.error("GPU %s is lost (NVML_ERROR_GPU_IS_LOST)", uuid)
        except nv.NVMLError as exc:
            log.error("NVML query on GPU %s failed, treating it as not responding: %s", uuid, exc)
        with self._lock:
            self._handles.pop(uuid, None)
        return Reading(uuid=uuid, responsive=False)

    def _handle(self, nv: Any, uuid: str) -> Any:
        with self._lock:
            handle = self._handles.get(uuid)
        if handle is not None:
            return handle
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
            raise ConfigError(f"no GPU with UUID {uuid!r} on this host (see `nvidia-smi -L`)") from None
        with self._lock:
            self._handles[uuid] = handle
        return handle

    def _read(self, nv: Any, uuid: str, handle: Any) -> Reading:
        device = _Device(nv, handle)
        own = self.own_pids | {os.getpid()}
        return Reading(
            uuid=uuid,
            util_pct=device.util_pct(),
            mem_used_mib=device.mem_used_mib(),
            temp_c=device.temp_c(),
            sm_clock_mhz=device.clock_mhz(nv.NVML_CLOCK_SM),
            mem_clock_mhz=device.clock_mhz(nv.NVML_CLOCK_MEM),
            power_w=device.power_w(),
            throttle_reasons=device.clock_reasons(),
            foreign_pids=[pid for pid in device.compute_pids() if pid not in own],
            xid_events=self._drain_xids(device, uuid),
            ecc_uncorrected=device.ecc_uncorrected(),
            retired_pending=device.retirement_pending(),
        )

    def _drain_xids(self, device: _Device, uuid: str) -> list[int]:
        """XID codes reported since the last read (0 ms wait: never blocks)."""
        event_set = self._event_set(device, uuid)
        if event_set is None:
            return []
        nv, xids = device.nv, []
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nv.nvmlEventSetWait(event_set, 0)
            except nv.NVMLError_Timeout:
                break
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                xids.append(int(data.eventData))
        if xids:
            log.warning("GPU %s reported XID error(s) %s", uuid, xids)
        return xids

    def _event_set(self, device: _Device, uuid: str) -> Any:
        """The device's XID event set, registered once (None where the device cannot report XIDs)."""
        with self._lock:
            if uuid in self._events:
                return self._events[uuid]
        nv = device.nv
        event_set = nv.nvmlEventSetCreate()
        try:
            nv.nvmlDeviceRegisterEvents(device.handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError as exc:
            self._free(nv, event_set)
            if not isinstance(exc, device.neutral_errors):
                raise
            log.info("GPU %s cannot report XID events (%s); relying on the other health signals", uuid, exc)
            event_set = None
        with self._lock:
            self._events[uuid] = event_set
        return event_set

    @staticmethod
    def _free(nv: Any, event_set: Any) -> None:
        try:
            nv.nvmlEventSetFree(event_set)
        except nv.NVMLError as exc:
            log.debug("nvmlEventSetFree failed: %s", exc)

    def close(self) -> None:
        """Free the event sets and shut NVML down (a no-op if it was never initialized in this process)."""
        with self._lock:
            nv, self._nv = self._nv, None
            events = [event_set for event_set in self._events.values() if event_set is not None]
            self._events.clear()
            self._handles.clear()
            if nv is None or self._pid != os.getpid():
                return
            for event_set in events:
                self._free(nv, event_set)
            _shutdown(nv)
