"""The GPU probe contract, run against every probe this host can run.

The simulated probe always runs; the NVML probe only where NVML finds a GPU (marked ``gpu``), so the
same promises hold for the twin that CI exercises and for the real hardware.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from croqq.errors import CroqqError
from croqq.probes._base import GpuProbe
from croqq.probes.nvml import NvmlProbe, nvml_available
from croqq.probes.sim import SimProbe

NO_NVML = (
    "NVML finds no GPU on this host (no NVIDIA driver): the NVML probe's contract is checked on GPU hosts"
)


def _make_probe(kind: str) -> GpuProbe:
    if kind == "nvml":
        return NvmlProbe()
    return SimProbe(count=4, host="contract-host")


@pytest.fixture(
    params=[
        pytest.param("sim", id="sim"),
        pytest.param(
            "nvml",
            id="nvml",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not nvml_available(), reason=NO_NVML)],
        ),
    ]
)
def probe(request: pytest.FixtureRequest) -> Iterator[GpuProbe]:
    probe = _make_probe(request.param)
    yield probe
    probe.close()


def test_discover_lists_gpus_with_stable_unique_uuids(probe: GpuProbe) -> None:
    first, second = probe.discover(), probe.discover()
    assert first, "a probe on this host must find at least one GPU"
    assert [gpu.uuid for gpu in first] == [gpu.uuid for gpu in second]
    assert len({gpu.uuid for gpu in first}) == len(first)
    assert [gpu.index for gpu in first] == list(range(len(first)))


def test_gpu_type_is_compute_capability_and_name(probe: GpuProbe) -> None:
    for gpu in probe.discover():
        assert re.fullmatch(r"sm\d+_\S+", gpu.gpu_type), gpu.gpu_type
        assert gpu.memory_mib > 0


def test_idle_gpu_is_healthy(probe: GpuProbe) -> None:
    for gpu in probe.discover():
        reading = probe.read(gpu.uuid)
        assert reading.uuid == gpu.uuid
        assert reading.responsive
        health = probe.health(gpu.uuid)
        assert health.ok, health.problems
        assert health.problems == []


def test_snapshot_has_clocks_and_temperature(probe: GpuProbe) -> None:
    gpu = probe.discover()[0]
    snapshot = probe.snapshot(gpu.uuid)
    assert snapshot.sm_clock_mhz > 0
    assert snapshot.mem_clock_mhz > 0
    assert snapshot.temp_c > 0


def test_unknown_uuid_raises_a_croqq_error(probe: GpuProbe) -> None:
    with pytest.raises(CroqqError, match="GPU-00000000-0000-0000-0000-000000000000"):
        probe.read("GPU-00000000-0000-0000-0000-000000000000")
