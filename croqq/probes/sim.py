"""Simulated GPUs with injectable faults: the twin of :class:`croqq.probes.nvml.NvmlProbe`.

A :class:`SimProbe` reports ``count`` healthy, idle H100-class GPUs whose state a :class:`FaultSource`
can spoil. Faults live in process memory (:class:`MemoryFaults`) or, so that tests and ``croqq stress``
can inject them into running workers, in Redis (:class:`RedisFaults`, one hash per GPU under
``keys.simfault(uuid)``: field = kind, value = JSON ``{"until": epoch seconds | null, "value": int}``).

Fault kinds and what a read shows while one is active (``value`` defaults to 1):

================  ==========================================================================================
kind              effect
================  ==========================================================================================
foreign_process   ``value`` foreign compute processes (pids 70001...)
overheat          temperature ``value`` C if that is over the limit, else 7 C over it; hw/sw thermal reasons
xid               one XID event whose code is ``value`` (e.g. 79: fallen off the bus, 48: double-bit ECC)
ecc               ``value`` volatile uncorrected ECC errors
throttle          clocks capped for power (``sw_power_cap``), power at the cap
busy              utilization 100 % and 60 GiB of memory in use
hang              nothing yet: a one-shot "the next measurement hangs", consumed by :meth:`SimProbe.take_hang`
stuck             the GPU does not respond (what a consumed ``hang`` becomes, for the hang's remaining time)
================  ==========================================================================================

A fault with ``seconds`` expires on its own; without, it lasts until cleared. Expired entries are ignored
on read; in Redis they stay until cleared or overwritten (at most one field per kind, so the hash stays tiny).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from croqq.delivery import keys
from croqq.errors import ConfigError, InvalidRecordError
from croqq.probes._base import GpuInfo, GpuProbe, Reading, Thresholds

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger(__name__)

FAULT_KINDS = frozenset({"foreign_process", "overheat", "xid", "ecc", "throttle", "busy", "hang", "stuck"})

GPU_NAME = "Simulated H100 SXM"
MEMORY_MIB = 81559
SM_CLOCK_MHZ = 1980
MEM_CLOCK_MHZ = 2619
THERMAL_SM_CLOCK_MHZ = 1410
POWER_CAP_SM_CLOCK_MHZ = 1755
POWER_CAP_W = 700.0
BUSY_POWER_W = 640.0
BUSY_MEM_MIB = 61440
FOREIGN_PID_BASE = 70000
OVERHEAT_MARGIN_C = 7

_GPU_TYPE = re.compile(r"^sm\d+_\S+$")

Clock = Callable[[], float]


def check_kind(kind: str) -> None:
    """Refuse an unknown fault kind, listing the known ones."""
    if kind not in FAULT_KINDS:
        raise ConfigError(f"unknown simulated GPU fault {kind!r}; known: {', '.join(sorted(FAULT_KINDS))}")


def _text(raw: str | bytes) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class Fault:
    """One injected fault: active until ``until`` (epoch seconds; None: until cleared)."""

    until: float | None = None
    value: int = 1

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until

    def to_json(self) -> str:
        return json.dumps({"until": self.until, "value": self.value})

    @classmethod
    def from_json(cls, raw: str | bytes) -> Fault:
        data = json.loads(raw)
        until = data["until"]
        return cls(until=None if until is None else float(until), value=int(data["value"]))


class FaultSource(ABC):
    """Where a simulated GPU's faults live. ``clock`` (epoch seconds) is injectable for tests."""

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock

    @abstractmethod
    def faults(self, uuid: str) -> dict[str, Fault]:
        """The GPU's active (unexpired) faults, by kind."""

    @abstractmethod
    def set(self, uuid: str, kind: str, seconds: float | None = None, value: int = 1) -> None:
        """Inject (or replace) a fault lasting ``seconds`` (None: until cleared)."""

    @abstractmethod
    def clear(self, uuid: str, kind: str | None = None) -> None:
        """Remove one fault kind, or every fault of the GPU."""

    @abstractmethod
    def take(self, uuid: str, kind: str, becomes: str | None = None) -> bool:
        """Atomically consume an active one-shot fault; True if there was one.

        With ``becomes``, the consumed fault is re-stored under that kind in the same atomic step,
        keeping its expiry time and value (a ``hang`` becomes ``stuck``).
        """

    def _new_fault(self, kind: str, seconds: float | None, value: int) -> Fault:
        check_kind(kind)
        if seconds is not None and seconds <= 0:
            raise ConfigError(f"fault duration must be > 0 seconds (None: until cleared), got {seconds}")
        return Fault(until=None if seconds is None else self.clock() + seconds, value=int(value))


class MemoryFaults(FaultSource):
    """Faults in a process-local dict (thread-safe): the default of a :class:`SimProbe`."""

    def __init__(self, clock: Clock = time.time) -> None:
        super().__init__(clock)
        self._lock = threading.Lock()
        self._faults: dict[str, dict[str, Fault]] = {}

    def faults(self, uuid: str) -> dict[str, Fault]:
        now = self.clock()
        with self._lock:
            gpu = self._faults.get(uuid, {})
            for kind in [kind for kind, fault in gpu.items() if not fault.active(now)]:
                del gpu[kind]
            return dict(gpu)

    def set(self, uuid: str, kind: str, seconds: float | None = None, value: int = 1) -> None:
        fault = self._new_fault(kind, seconds, value)
        with self._lock:
            self._faults.setdefault(uuid, {})[kind] = fault

    def clear(self, uuid: str, kind: str | None = None) -> None:
        with self._lock:
            if kind is None:
                self._faults.pop(uuid, None)
            else:
                self._faults.get(uuid, {}).pop(kind, None)

    def take(self, uuid: str, kind: str, becomes: str | None = None) -> bool:
        check_kind(kind)
        if becomes is not None:
            check_kind(becomes)
        now = self.clock()
        with self._lock:
            gpu = self._faults.get(uuid, {})
            fault = gpu.pop(kind, None)
            if fault is None or not fault.active(now):
                return False
            if becomes is not None:
                gpu[becomes] = fault
            return True


# KEYS[1] = fault hash; ARGV = kind, now (epoch seconds), kind to re-store it under ('' for none).
_TAKE_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local expires = cjson.decode(raw)['until']
if expires ~= nil and expires ~= cjson.null and tonumber(expires) <= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], ARGV[3], raw) end
return 1
"""


class RedisFaults(FaultSource):
    """Faults in Redis, shared by every process that uses the same Redis (``keys.simfault(uuid)``)."""

    def __init__(self, client: Redis, clock: Clock | None = None) -> None:
        from croqq.delivery.clock import clock as redis_clock

        super().__init__(clock or redis_clock(client).now)  # shared by hosts: Redis's clock
        self.client = client
        self._take = client.register_script(_TAKE_LUA)

    def faults(self, uuid: str) -> dict[str, Fault]:
        key = keys.simfault(uuid)
        stored = self.client.hgetall(key)
        now = self.clock()
        active: dict[str, Fault] = {}
        for field, raw in stored.items():
            kind = _text(field)
            if kind not in FAULT_KINDS:
                log.debug("ignoring unknown simulated fault %r in %s", kind, key)
                continue
            fault = self._decode(key, kind, raw)
            if fault.active(now):
                active[kind] = fault
        return active

    @staticmethod
    def _decode(key: str, kind: str, raw: str | bytes) -> Fault:
        try:
            return Fault.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRecordError(
                f'{key} field {kind!r} is not {{"until": ts|null, "value": int}}: {raw!r}'
            ) from exc

    def set(self, uuid: str, kind: str, seconds: float | None = None, value: int = 1) -> None:
        fault = self._new_fault(kind, seconds, value)
        self.client.hset(keys.simfault(uuid), kind, fault.to_json())

    def clear(self, uuid: str, kind: str | None = None) -> None:
        if kind is None:
            self.client.delete(keys.simfault(uuid))
        else:
            self.client.hdel(keys.simfault(uuid), kind)

    def take(self, uuid: str, kind: str, becomes: str | None = None) -> bool:
        check_kind(kind)
        if becomes is not None:
            check_kind(becomes)
        args = [kind, repr(self.clock()), becomes or ""]
        return bool(self._take(keys=[keys.simfault(uuid)], args=args))


def inject_fault(redis: Redis, uuid: str, kind: str, seconds: float | None = None, value: int = 1) -> None:
    """Inject a fault into a simulated GPU served by any process using this Redis."""
    RedisFaults(redis).set(uuid, kind, seconds, value)


def clear_faults(redis: Redis, uuid: str) -> None:
    """Remove every injected fault of a simulated GPU."""
    RedisFaults(redis).clear(uuid)


# -- effects of active faults on an idle reading ------------------------------------------------

Effect = Callable[[Reading, Fault, Thresholds], Reading]


def _with_reasons(reading: Reading, *reasons: str) -> list[str]:
    return sorted({*reading.throttle_reasons, *reasons})


def _foreign_process(reading: Reading, fault: Fault, limits: Thresholds) -> Reading:
    pids = [FOREIGN_PID_BASE + n for n in range(1, max(1, fault.value) + 1)]
    return reading.model_copy(update={"foreign_pids": [*reading.foreign_pids, *pids]})


def _overheat(reading: Reading, fault: Fault, limits: Thresholds) -> Reading:
    temp = fault.value if fault.value > limits.max_temp_c else limits.max_temp_c + OVERHEAT_MARGIN_C
    return reading.model_copy(
        update={
            "temp_c": temp,
            "sm_clock_mhz": min(reading.sm_clock_mhz, THERMAL_SM_CLOCK_MHZ),
            "throttle_reasons": _with_reasons(reading, "hw_thermal", "sw_thermal"),
        }
    )


def _xid(reading: Reading, fault: Fault, limits: Thresholds) -> Reading:
    return reading.model_copy(update={"xid_events": [*reading.xid_events, fault.value]})


def _ecc(reading: Reading, fault: Fault, limits: Thresholds) -> Reading:
    return reading.model_copy(update={"ecc_uncorrected": reading.ecc_uncorrected + max(1, fault.value)})


def _throttle(reading: Reading, fault: Fault, limits: Thresholds) -> Reading:
    return reading.model_copy(
        update={
            "power_w": POWER_CAP_W,
            "sm_clock_mhz": min(reading.sm_clock_mhz, POWER_CAP_SM_CLOCK_MHZ),
            "throttle_reasons": _with_reasons(reading, "sw_power_cap"),
        }
    )


def _busy(reading: Reading, fault: Fault, limits: Thresholds) -> Reading:
    return reading.model_copy(
        update={
            "util_pct": 100,
            "mem_used_mib": max(reading.mem_used_mib, BUSY_MEM_MIB),
            "power_w": max(reading.power_w, BUSY_POWER_W),
        }
    )


EFFECTS: dict[str, Effect] = {
    "foreign_process": _foreign_process,
    "overheat": _overheat,
    "xid": _xid,
    "ecc": _ecc,
    "throttle": _throttle,
    "busy": _busy,
}


def sanitize_host(host: str) -> str:
    """A host name usable inside a GPU uuid and a queue name: only ``[A-Za-z0-9-]``."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", host).strip("-") or "localhost"


class SimProbe(GpuProbe):
    """``count`` simulated GPUs named ``GPU-sim-<host>-<i>``: healthy and idle unless a fault says so."""

    kind = "sim"

    def __init__(
        self,
        thresholds: Thresholds | None = None,
        count: int = 8,
        gpu_type: str = "sm90_Simulated_H100_SXM",
        faults: FaultSource | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__(thresholds)
        if count < 1:
            raise ConfigError(f"a simulated host needs at least one GPU, got count={count}")
        if not _GPU_TYPE.match(gpu_type):
            raise ConfigError(f"simulated gpu_type {gpu_type!r} must look like sm<digits>_<name> (sm90_H100)")
        self.gpu_type = gpu_type
        self.faults = faults if faults is not None else MemoryFaults()
        self.host = sanitize_host(host or socket.gethostname())
        self._gpus = [self._info(index) for index in range(count)]
        self._indexes = {gpu.uuid: gpu.index for gpu in self._gpus}
        self._reads: dict[str, int] = {}
        self._lock = threading.Lock()

    def _info(self, index: int) -> GpuInfo:
        uuid = f"GPU-sim-{self.host}-{index}"
        return GpuInfo(uuid=uuid, index=index, name=GPU_NAME, gpu_type=self.gpu_type, memory_mib=MEMORY_MIB)

    def discover(self) -> list[GpuInfo]:
        return list(self._gpus)

    def read(self, uuid: str) -> Reading:
        self._check(uuid)
        faults = self.faults.faults(uuid)
        if "stuck" in faults:
            return Reading(uuid=uuid, responsive=False)
        reading = self._idle(uuid)
        for kind, fault in sorted(faults.items()):
            effect = EFFECTS.get(kind)
            if effect is not None:
                reading = effect(reading, fault, self.thresholds)
        return reading

    def take_hang(self, uuid: str) -> bool:
        """Consume a pending ``hang`` fault: True if the measurement about to start must hang.

        The GPU then stops responding (a ``stuck`` fault) for what was left of the hang's duration.
        """
        self._check(uuid)
        taken = self.faults.take(uuid, "hang", becomes="stuck")
        if taken:
            log.warning("simulated GPU %s: injected hang consumed, GPU stops responding", uuid)
        return taken

    def _check(self, uuid: str) -> None:
        if uuid not in self._indexes:
            last = self._gpus[-1].uuid
            raise ConfigError(
                f"no simulated GPU {uuid!r} on this host (it has GPU-sim-{self.host}-0 ... {last})"
            )

    def _idle(self, uuid: str) -> Reading:
        """A healthy idle GPU, with a small jitter that is a pure function of (uuid, read number)."""
        with self._lock:
            count = self._reads[uuid] = self._reads.get(uuid, 0) + 1
        draw = hashlib.blake2b(f"{uuid}:{count}".encode(), digest_size=4).digest()
        return Reading(
            uuid=uuid,
            temp_c=38 + draw[0] % 8,
            sm_clock_mhz=SM_CLOCK_MHZ,
            mem_clock_mhz=MEM_CLOCK_MHZ,
            power_w=round(66.0 + draw[1] % 80 / 10, 1),
        )
