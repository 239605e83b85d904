"""The backend contract, run against every member of the family: the simulated GPU, the replay of a
recorded landscape, and CUDA.

``cuda`` runs everywhere: a stand-in compiler "builds" a harness script (its output names the source it
was built from), so the build, artifact and measure paths are the real backend's. ``cuda-gpu`` is the real
thing (nvcc, an NVIDIA GPU, marked ``gpu`` and ``nvcc``) and skips with the reason elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path

import pytest

from croqq.backends._base import Backend, GpuContext, KernelRef
from croqq.backends.cuda import CudaBackend
from croqq.backends.landscape import load_landscape
from croqq.backends.replay import REPLAY_DSL, ReplayBackend, replay_manifest
from croqq.backends.sim import SimBackend
from croqq.backends.toolchain import knob_candidate
from croqq.domain.knobs import Candidate, seed_knobs, source_candidate
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.records import BuildOutcome
from croqq.domain.shapes import Shape, parse_key
from croqq.errors import ArtifactMissingError
from croqq.probes.nvml import NvmlProbe, nvml_available
from croqq.probes.sim import SimProbe
from croqq.settings import PROJECT_ROOT, Settings

XGEMM = PROJECT_ROOT / "landscapes" / "xgemm_4096_rtx2080ti.kerneltuner.json.gz"
NO_GPU = "needs an NVIDIA GPU that NVML finds and nvcc: the real cuda backend's contract runs on GPU hosts"
HARNESS_LINE = {"status": "ok", "verified": True, "tflops": 500.0, "median_ms": 0.5, "min_ms": 0.49}


@cache
def base_manifest() -> Manifest:
    return load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")


@dataclass
class Subject:
    """One backend under contract: its candidates (``good`` and ``other`` build, ``bad`` does not), a GPU,
    and the text by which a measurement names the candidate it timed (``tag``; None: it does not)."""

    name: str
    make: Callable[[Path], Backend]  # a backend whose host folders are under the given path
    shape: Shape
    gpu: GpuContext
    cands: dict[str, Candidate]
    tag: Callable[[Candidate], str] | None
    folder: Path
    builds: dict[str, BuildOutcome] = field(default_factory=dict)

    @cached_property
    def backend(self) -> Backend:
        return self.make(self.folder)

    def build(self, which: str) -> BuildOutcome:
        if which not in self.builds:
            self.builds[which] = self.backend.build(self.shape, self.cands[which])
        return self.builds[which]

    def artifact(self, which: str) -> str:
        outcome = self.build(which)
        assert outcome.ok, outcome.reason
        return outcome.artifact


def sim_gpu(gpu_type: str) -> GpuContext:
    probe = SimProbe(count=1, host="contract")
    return GpuContext(uuid=probe.discover()[0].uuid, index=0, gpu_type=gpu_type, probe=probe)


def by_hash(cand: Candidate) -> str:
    return f"cand={cand.content_hash[:12]}"


def sim_subject(folder: Path) -> Subject:
    manifest, shape = base_manifest(), parse_key("f16_4096x8192x4096")
    ref = seed_knobs(manifest, "cuda", "f16", "reference")
    knobs = {
        "good": ref,
        "other": seed_knobs(manifest, "cuda", "f16", "naive"),
        "bad": {**ref, "TILE_M": 256, "TILE_N": 256, "STAGES": 4},  # over the shared memory
    }
    cands = {k: knob_candidate(manifest, Settings(), "cuda", shape, v) for k, v in knobs.items()}
    return Subject(
        "sim",
        lambda f: SimBackend(manifest, Settings(run_dir=f / "run")),
        shape,
        sim_gpu("sm90_Simulated_H100_SXM"),
        tag=by_hash,
        folder=folder,
        cands=cands,
    )


def replay_subject(folder: Path) -> Subject:
    landscape = load_landscape(XGEMM)
    manifest, shape = replay_manifest(base_manifest(), landscape), parse_key("f16_4096x4096x4096")
    absent = {**landscape.first_valid, "MDIMC": 32}  # MWG=16 is not a multiple of MDIMC*VWM: not recorded
    assert landscape.record(absent) is None
    knobs = {"good": landscape.first_valid, "other": landscape.optimum[0], "bad": absent}
    cands = {k: knob_candidate(manifest, Settings(), REPLAY_DSL, shape, v) for k, v in knobs.items()}
    return Subject(
        "replay",
        lambda f: ReplayBackend(manifest, Settings(run_dir=f / "run"), landscape=landscape),
        shape,
        sim_gpu("sm90_Simulated_H100_SXM"),
        tag=by_hash,
        folder=folder,
        cands=cands,
    )


def _executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def stand_in_compiler(folder: Path) -> Path:
    """Fails on a source with ``#error``, else writes a harness script that prints the source's sha256
    prefix and a result line."""
    folder.mkdir(parents=True, exist_ok=True)
    line = folder / "result.json"
    line.write_text(json.dumps(HARNESS_LINE) + "\n")
    body = f"""
src=""; out=""
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; *.cu) src="$1";; esac; shift; done
if grep -q '^#error' "$src"; then echo "$src(2): error: croqq contract: does not compile" >&2; exit 1; fi
tag=$(sha256sum "$src" | cut -c1-12)
printf '#!/bin/sh\\necho cand=%s\\ncat %s\\n' "$tag" "{line}" > "$out"
chmod +x "$out"
"""
    return _executable(folder / "nvcc-stand-in", body)


def cuda_candidates(manifest: Manifest, shape: Shape) -> dict[str, Candidate]:
    good = knob_candidate(
        manifest, Settings(), "cuda", shape, seed_knobs(manifest, "cuda", "f16", "reference")
    )
    other = knob_candidate(manifest, Settings(), "cuda", shape, seed_knobs(manifest, "cuda", "f16", "naive"))
    broken = good.source.replace("#define GEMM_K", "#error croqq contract: does not compile\n#define GEMM_K")
    bad = source_candidate(manifest, "cuda", "f16", broken, good.headers, good.toolchain)
    return {"good": good, "other": other, "bad": bad}


def cuda_subject(folder: Path) -> Subject:
    base, shape = base_manifest(), parse_key("f16_4096x8192x4096")
    build = base.dsls["cuda"].build.model_copy(update={"compiler": str(stand_in_compiler(folder / "cc"))})
    manifest = base.model_copy(
        update={"dsls": {"cuda": base.dsls["cuda"].model_copy(update={"build": build})}}
    )

    def make(f: Path) -> Backend:
        return CudaBackend(manifest, Settings(run_dir=f / "run", build_dir=f / "build"))

    return Subject(
        "cuda",
        make,
        shape,
        sim_gpu("sm90_NVIDIA_H100_80GB_HBM3"),
        tag=lambda c: f"cand={hashlib.sha256(c.source.encode()).hexdigest()[:12]}",
        folder=folder,
        cands=cuda_candidates(manifest, shape),
    )


def cuda_gpu_subject(folder: Path) -> Subject:
    manifest, shape = base_manifest(), parse_key("f16_2048x2048x2048")
    probe = NvmlProbe()
    info = probe.discover()[0]
    gpu = GpuContext(uuid=info.uuid, index=info.index, gpu_type=info.gpu_type, probe=probe)

    def make(f: Path) -> Backend:
        return CudaBackend(manifest, Settings(run_dir=f / "run", build_dir=f / "build", backend="cuda"))

    return Subject("cuda-gpu", make, shape, gpu, cuda_candidates(manifest, shape), tag=None, folder=folder)


REAL_GPU = nvml_available() and shutil.which("nvcc") is not None
SUBJECTS = {"sim": sim_subject, "replay": replay_subject, "cuda": cuda_subject, "cuda-gpu": cuda_gpu_subject}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sim", id="sim"),
        pytest.param("replay", id="replay"),
        pytest.param("cuda", id="cuda"),
        pytest.param(
            "cuda-gpu",
            id="cuda-gpu",
            marks=[pytest.mark.gpu, pytest.mark.nvcc, pytest.mark.skipif(not REAL_GPU, reason=NO_GPU)],
        ),
    ],
)
def subject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Subject:
    return SUBJECTS[request.param](tmp_path_factory.mktemp(request.param))


def test_build_hands_on_an_artifact_string_that_names_the_backend(subject: Subject) -> None:
    outcome = subject.build("good")
    assert outcome.ok and outcome.reason == "", outcome.reason
    ref = KernelRef.model_validate_json(outcome.artifact)
    assert ref.backend == subject.backend.name == subject.name.split("-")[0]
    assert ref.key == subject.shape.key and ref.content_hash == subject.cands["good"].content_hash
    assert "\n" not in outcome.artifact and len(outcome.artifact) < 1000


def test_a_failed_build_is_an_outcome_with_a_one_line_reason_not_an_exception(subject: Subject) -> None:
    outcome = subject.build("bad")
    assert not outcome.ok and outcome.artifact == ""
    assert outcome.reason and "\n" not in outcome.reason


def test_measure_returns_one_measurement_per_artifact_in_the_order_given(subject: Subject) -> None:
    order = ["good", "other", "good"]
    results = subject.backend.measure(subject.gpu, subject.shape, [subject.artifact(w) for w in order])
    assert len(results) == len(order)
    for which, m in zip(order, results, strict=True):
        assert m.outcome == "ok" and m.tflops > 0 and m.median_ms > 0 and m.verified, m.detail
        assert m.start is not None and m.end is not None
        if subject.tag is not None:
            assert subject.tag(subject.cands[which]) in m.raw


def test_an_artifact_this_host_cannot_get_raises_artifact_missing(subject: Subject, tmp_path: Path) -> None:
    artifact = subject.artifact("good")
    elsewhere = subject.make(tmp_path)  # another host: an empty artifact store, nothing shared
    with pytest.raises(ArtifactMissingError):
        elsewhere.measure(subject.gpu, subject.shape, [artifact])
    with pytest.raises(ArtifactMissingError):
        elsewhere.profile(subject.gpu, subject.shape, artifact)
    foreign = json.loads(artifact) | {"backend": "elsewhere"}
    with pytest.raises(ArtifactMissingError):
        subject.backend.measure(subject.gpu, subject.shape, [json.dumps(foreign)])
    with pytest.raises(ArtifactMissingError):
        subject.backend.measure(subject.gpu, subject.shape, ["/tmp/a/path/is/not/an/artifact"])


def test_an_apparent_win_is_confirmed_interleaved_and_a_migrated_best_is_remeasured(subject: Subject) -> None:
    be, gpu, shape = subject.backend, subject.gpu, subject.shape
    best, cand = subject.artifact("good"), subject.artifact("other")
    (best_run,) = be.measure(gpu, shape, [best])
    result = be.measure_candidate(gpu, shape, cand, best, best_run.tflops / 10, rebase=False)
    assert result.candidate.outcome == "ok" and result.gpu_uuid == gpu.uuid
    assert result.confirmation is not None and result.confirmation.rounds == 3  # >1.5x: re-measured
    assert result.confirmation.candidate_tflops > 0 and result.confirmation.best_tflops > 0
    rebased = be.measure_candidate(gpu, shape, cand, best, best_run.tflops / 10, rebase=True)
    assert rebased.rebased_best_tflops is not None and rebased.rebased_best_tflops > 0
    first = be.measure_candidate(gpu, shape, best, None, 0.0)  # no best yet: nothing to confirm against
    assert first.confirmation is None and first.candidate.outcome == "ok"


def test_profile_returns_a_profile_with_a_bottleneck_class(subject: Subject) -> None:
    prof = subject.backend.profile(subject.gpu, subject.shape, subject.artifact("good"))
    assert prof.bottleneck in ("memory", "compute", "latency", "launch", "unknown")
    assert isinstance(prof.metrics, dict) and prof.raw
