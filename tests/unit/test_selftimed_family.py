"""The second kind of kernel family: self-timed (its own main and timer, as CroqTile/choreo-generated CUDA
has). The fixture family tests/fixtures/selftimed is a manifest entry plus one file, added with no change
to croqq's code; built by the real cuda backend with nvcc and run (a host loop: no GPU needed), its
output is read by the family's patterns, and every measurement says its timing is self-reported and
that croqq did not verify it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from croqq.backends import selftimed
from croqq.backends._base import GpuContext
from croqq.backends.cuda import CudaBackend
from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import include_resolver
from croqq.domain.manifest import DslSpec, Manifest, RunSpec, load_manifest
from croqq.domain.records import GpuSnapshot, Measurement
from croqq.domain.shapes import parse_key
from croqq.errors import InvalidRecordError
from croqq.probes.sim import SimProbe
from croqq.proposers.agent import workspace
from croqq.proposers.agent.checks import check_source
from croqq.settings import Settings
from tests.agents import context

ROOT = Path(__file__).resolve().parents[2]
FAMILY = json.loads((ROOT / "tests" / "fixtures" / "selftimed" / "family.json").read_text())
SPEC = RunSpec.model_validate(FAMILY["run"])
SHAPE = parse_key("f16_64x64x64")
GPU_TYPE = "sm90_Simulated_H100_SXM"
SNAPS = (GpuSnapshot(), GpuSnapshot())


def with_family() -> Manifest:
    manifest = load_manifest(ROOT / "kernels" / "manifest.json")
    return manifest.model_copy(
        update={"dsls": {**manifest.dsls, "selftimed": DslSpec.model_validate(FAMILY)}}
    )


def test_a_self_timed_run_is_read_by_the_family_patterns_and_marked_self_reported() -> None:
    out = "warmup: 2 repeats: 7\ntime: 0.5 ms\nTFLOPS: 1.0\nTFLOPS: 2.5\ncheck: PASS\n"
    m = selftimed.measurement(out, SPEC, SHAPE.flops, 989.4, SNAPS, out)
    assert (m.outcome, m.tflops, m.median_ms, m.repeats) == ("ok", 2.5, 0.5, 7)  # the last TFLOPS line
    assert m.timing == "self-reported" and m.verified is False
    assert (
        m.detail
        == "self-reported timing; croqq did not verify the result (the kernel says it checked its result)"
    )
    silent = selftimed.measurement("TFLOPS: 1.0\n", SPEC, SHAPE.flops, 989.4, SNAPS, "")
    assert "reports no check of its result" in silent.detail
    assert silent.median_ms == pytest.approx(SHAPE.flops / 1e12 * 1e3)  # no time line: from the TFLOPS


def test_no_tflops_line_and_a_figure_above_the_peak_are_refused_in_one_line() -> None:
    with pytest.raises(InvalidRecordError, match=r"printed no line matching 'TFLOPS:"):
        selftimed.read("time: 1 ms\n", SPEC)
    m = selftimed.measurement("TFLOPS: 5000\n", SPEC, SHAPE.flops, 989.4, SNAPS, "")
    assert m.outcome == "invalid" and "not within (0, 989.4]" in m.detail and m.tflops == 0


@pytest.mark.parametrize(
    ("run", "words"),
    [
        ({"kind": "self-timed"}, "names tflops, warmup_env and repeats_env"),
        ({**FAMILY["run"], "tflops": "TFLOPS: ("}, "is no regex"),
        ({**FAMILY["run"], "time_ms": "time: [0-9.]+ ms"}, "needs a group around the number"),
    ],
)
def test_a_self_timed_family_that_cannot_be_read_is_refused(run: dict[str, str], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        RunSpec.model_validate(run)


@pytest.mark.nvcc
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CUDA toolkit)")
def test_the_fixture_family_builds_runs_and_is_read_by_the_cuda_backend(tmp_path: Path) -> None:
    manifest = with_family()
    config = Settings(build_dir=tmp_path, compile_timeout_s=1800.0)
    backend = CudaBackend(manifest, config)
    probe = SimProbe(count=1)
    gpu = GpuContext(uuid=probe.discover()[0].uuid, index=0, gpu_type=GPU_TYPE, probe=probe)

    def run(mode: int) -> Measurement:
        cand = knob_candidate(manifest, config, "selftimed", SHAPE, {"UNROLL": 2, "MODE": mode})
        build = backend.build(SHAPE, cand)
        assert build.ok, build.reason
        (m,) = backend.measure(gpu, SHAPE, [build.artifact])
        return m

    good = run(0)
    assert good.outcome == "ok" and good.tflops > 0 and good.timing == "self-reported"
    assert not good.verified and "the kernel says it checked its result" in good.detail
    assert "warmup: 2 repeats: 7" in good.raw and good.repeats == 7  # counts set
    crashed, mute, absurd = run(1), run(2), run(3)
    assert crashed.outcome == "crash" and crashed.detail.startswith("exit 3")
    assert mute.outcome == "crash" and "printed no line matching" in mute.detail
    assert absurd.outcome == "invalid" and absurd.timing == "self-reported"
    assert backend.vendor_tflops(gpu, SHAPE) is None  # no harness: no cuBLAS reference run


def test_a_self_timed_candidate_may_bring_its_main_and_timer_but_not_the_reference() -> None:
    resolver = include_resolver(with_family(), "selftimed", Settings().kernels_dir)
    text = (ROOT / "tests" / "fixtures" / "selftimed" / "selftimed_f16.cuh").read_text()
    assert {f.rule for f in check_source(text, resolver)} >= {"main", "host-timing"}  # harness-linked: no
    assert check_source(text, resolver, self_timed=True) == []
    cheat = text + '\nvoid* lib = dlopen("libcublasLt.so", 2);\n'
    assert [f.rule for f in check_source(cheat, resolver, self_timed=True)] == ["reference-read"]


def test_an_agent_is_told_a_self_timed_kernel_keeps_its_own_main_and_timer() -> None:
    manifest = with_family()
    knobs = {"UNROLL": 1, "MODE": 0}
    best = knob_candidate(manifest, Settings(), "selftimed", SHAPE, knobs)
    ctx = context().model_copy(
        update={"dsl": "selftimed", "shape": SHAPE, "knob_space": FAMILY["knobs"], "best_knobs": knobs}
    )
    ctx = ctx.model_copy(update={"best_source": best.source})
    ws = workspace.build(ctx, manifest, include_resolver(manifest, "selftimed", Settings().kernels_dir))
    try:
        assert json.loads((ws.root / "context.json").read_text())["run"] == "self-timed"
        task = " ".join((ws.root / "TASK.md").read_text().split())
    finally:
        ws.remove()
    assert "Keep its own main() and timer" in task and "harness.cuh" not in task
