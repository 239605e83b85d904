"""Kernel families as manifest entries: knob rules (checked before any compile, grounded in what an H200
refused), headers from an installed package at the pinned version (part of the candidate's identity), and
the manifest refusing rules it cannot read or seeds that break them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from croqq.backends.cuda import CudaBackend
from croqq.backends.toolchain import knob_candidate, package_includes, toolchain_id
from croqq.domain import rules
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import Shape
from croqq.errors import ConfigError, HostError
from croqq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "kernels" / "manifest.json"
GPU_RUN = ROOT / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(MANIFEST)


def broken(manifest: Manifest, dtype: str, dims: tuple[int, int, int], knobs: dict[str, int]) -> str | None:
    spec = manifest.dsl("cutlass")
    return spec.broken_rule(
        seed_knobs(manifest, "cutlass", dtype, "reference") | knobs, dims, manifest.dtypes[dtype]
    )


# -- the rule language ---------------------------------------------------------------------------------


def test_a_rule_is_arithmetic_over_names_with_min_max_and_conditionals() -> None:
    env = {"TILE_M": 128, "TILE_N": 256, "SCHEDULE": 1, "STAGES": 0}
    assert rules.holds("TILE_M * TILE_N <= (32768 if SCHEDULE == 0 else 16384)", env) is False
    assert rules.holds("max(STAGES, 2) * 64 == 128 and not SCHEDULE == 0", env) is True
    assert rules.holds("1 < TILE_M // 64 <= 2", env) is True
    assert rules.names("max(STAGES, 2) * TILE_K <= M") == {"STAGES", "TILE_K", "M"}
    assert rules.first_broken([("TILE_M >= 256", "too small")], env) == "too small (rule: TILE_M >= 256)"
    assert rules.first_broken([("TILE_M // STAGES > 0", "needs stages")], env).startswith("needs stages")


@pytest.mark.parametrize(
    "text",
    ["__import__('os').system('true')", "TILE_M.bit_length() > 1", "'a' == 'a'", "[TILE_M][0] > 1", "open(1)",
     "2 ** 64 > TILE_M", "TILE_M >"],
)  # fmt: skip
def test_a_rule_that_is_not_plain_arithmetic_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="rule"):
        rules.parse(text)


def test_the_manifest_refuses_a_rule_it_cannot_read_and_a_seed_that_breaks_a_rule(tmp_path: Path) -> None:
    raw = json.loads(MANIFEST.read_text())
    cutlass = raw["dsls"]["cutlass"]
    for rule, message in (
        ({"require": "TILE_Q > 1", "why": "x"}, "reads ['TILE_Q']"),
        ({"require": "exec('1')", "why": "x"}, "only min"),
        (
            {"require": "TILE_M >= 256", "why": "tiles of 256 rows"},
            "the f16 reference knobs break a rule: tiles of 256 rows",
        ),
    ):
        cutlass["rules"] = [rule]
        path = tmp_path / "manifest.json"
        path.write_text(json.dumps(raw))
        with pytest.raises(ConfigError, match="cutlass") as err:
            load_manifest(path)
        assert message in str(err.value) and "\n" not in str(err.value)


def test_each_mode_names_its_family_cutlass_from_the_current_best_and_cuda_from_scratch(
    manifest: Manifest, tmp_path: Path
) -> None:
    assert manifest.family(None) == "cutlass"  # the default mode: from_current_best
    assert manifest.family(None, "from_scratch") == "cuda"  # the naive mma.sync seed
    assert manifest.family("cuda") == "cuda"  # one named (--dsl, CROQQ_DSL) wins
    with pytest.raises(ConfigError, match="unknown mode 'fast'"):
        manifest.family(None, "fast")
    raw = json.loads(MANIFEST.read_text())
    raw["modes"]["from_scratch"]["dsl"] = "triton"
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="mode 'from_scratch' names dsl 'triton', which 'dsls' does not"):
        load_manifest(path)


# -- the CUTLASS family's rules, against what the H200 ran -----------------------------------------------


def h200_outcomes() -> dict[str, tuple[str, dict[str, int], tuple[int, int, int], str]]:
    """case -> (dtype, knobs, shape, status of its first verified run) of the CUTLASS cases run on an H200."""
    cases = {}
    for line in (GPU_RUN / "cases.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, family, dtype, m, n, k, *knobs = line.split()
        if family == "cutlass":
            cases[name] = (
                dtype,
                {kv.split("=")[0]: int(kv.split("=")[1]) for kv in knobs},
                (int(m), int(n), int(k)),
            )
    status = {}
    for line in (GPU_RUN / "h200-2026-12-04.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kernel"] == "candidate" and "--atol 8" not in r["args"]:
            status.setdefault(r["case"], r["status"])
    return {name: (*case, status[name]) for name, case in cases.items() if name in status}


def test_every_cutlass_setting_that_ran_on_the_h200_passes_the_rules_and_the_one_it_refused_breaks_one(
    manifest: Manifest,
) -> None:
    ran = h200_outcomes()
    assert len(ran) >= 15
    spec = manifest.dsl("cutlass")
    for name, (dtype, knobs, dims, status) in ran.items():
        why = spec.broken_rule(knobs, dims, manifest.dtypes[dtype])
        if status == "error":  # the launch was refused: "invalid configuration argument"
            assert why is not None and "shared memory" in why, name
        else:  # ok, or wrong_answer (FP8 fast accumulation under croqq's e4m3 tolerance): it ran
            assert why is None, (name, why)
    assert [n for n, r in ran.items() if r[3] == "error"] == ["cl_f16_s5_n8"]


@pytest.mark.parametrize(
    ("dtype", "knobs", "reason"),
    [
        ("f16", {"TILE_M": 64}, "cooperative schedule"),
        ("e4m3", {"TILE_K": 64}, "128-byte TMA swizzle"),
        ("f16", {"FAST_ACCUM": 1}, "f16 has none"),
        ("f16", {"SCHEDULE": 1, "SCHEDULER": 1}, "ping-pong kernel does not support the stream-K"),
        ("f16", {"SPLITS": 2}, "split-K"),
        ("f16", {"CLUSTER_M": 4, "CLUSTER_N": 4}, "at most 8 CTAs"),
        ("f16", {"TILE_M": 256, "TILE_N": 256}, "accumulators"),
        ("f16", {"TILE_M": 256, "TILE_N": 256, "TILE_K": 128, "SCHEDULE": 1}, "accumulators"),
        ("f16", {"TILE_N": 128, "STAGES": 7}, "227 KiB"),
    ],
)
def test_knobs_the_hopper_kernel_cannot_run_break_a_rule_that_says_why(
    manifest: Manifest, dtype: str, knobs: dict[str, int], reason: str
) -> None:
    why = broken(manifest, dtype, (8192, 8192, 8192), knobs)
    assert why is not None and reason in why


def test_the_cuda_shared_memory_rule_counts_a_sparse_a_at_half_with_its_metadata(manifest: Manifest) -> None:
    """The kernel's own count (gemm_core.cuh's kStageBytes): 256x64x64 in 6 stages is 240 KiB of dense f16,
    which a rule that counted every A as sparse let through to a static_assert."""
    spec, dims = manifest.dsl("cuda"), (4096, 8192, 8192)
    knobs = {"TILE_M": 256, "TILE_N": 64, "TILE_K": 64, "STAGES": 6, "WARPS_M": 1, "WARPS_N": 4}
    knobs |= {"RASTER": 1, "SWIZZLE": 2, "SPLIT_K": 2, "EPI_VEC": 2}
    why = spec.broken_rule(knobs, dims, manifest.dtypes["f16"])
    assert why is not None and "227 KiB" in why
    assert spec.broken_rule(knobs, dims, manifest.dtypes["f16sp"]) is None  # 156 KiB


def test_direct_stores_free_the_epilogue_staging_for_mainloop_stages(manifest: Manifest) -> None:
    seven = {"TILE_N": 128, "STAGES": 7}  # 7 stages of 32 KiB: with the TMA epilogue's 32 KiB, over 227 KiB
    assert broken(manifest, "f16", (8192, 8192, 8192), seven | {"EPILOGUE": 0}) is not None
    assert broken(manifest, "f16", (8192, 8192, 8192), seven | {"EPILOGUE": 1}) is None


def test_a_knob_candidate_that_breaks_a_rule_is_a_failed_build_without_a_compile(
    manifest: Manifest, tmp_path: Path
) -> None:
    witness = tmp_path / "compiled"
    compiler = tmp_path / "cc"
    compiler.write_text(f"#!/bin/sh\ntouch {witness}\nexit 1\n")
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    spec = manifest.dsls["cutlass"]
    patched = manifest.model_copy(
        update={
            "dsls": {
                "cutlass": spec.model_copy(
                    update={"build": spec.build.model_copy(update={"compiler": str(compiler)})}
                )
            }
        }
    )
    shape = Shape(dtype="f16", m=8192, n=8192, k=8192)
    knobs = seed_knobs(patched, "cutlass", "f16", "reference") | {"STAGES": 5}
    cand = knob_candidate(patched, Settings(), "cutlass", shape, knobs)
    settings = Settings(build_dir=tmp_path / "build", run_dir=tmp_path / "run")
    outcome = CudaBackend(patched, settings).build(shape, cand)
    assert not outcome.ok and outcome.reason.startswith("knob rule: the mainloop stages")
    assert not witness.exists() and not (tmp_path / "build").exists()


# -- headers from an installed package ---------------------------------------------------------------


def fake_distribution(site: Path, version: str) -> None:
    info = site / f"nvidia_cutlass-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-cutlass\nVersion: {version}\n")


def test_the_installed_package_gives_the_include_folders_at_the_pinned_version(manifest: Manifest) -> None:
    flags = package_includes(manifest.dsl("cutlass").build, "cutlass")
    assert [f.rsplit("/source/", 1)[-1] for f in flags] == ["include", "tools/util/include"]
    assert all(Path(f[2:], "cutlass" if "util" not in f else "cutlass/util").is_dir() for f in flags)


def test_a_different_version_of_the_package_is_refused_in_one_line_naming_the_one_needed(
    manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_distribution(tmp_path, "4.1.0")
    monkeypatch.syspath_prepend(str(tmp_path))  # found first, as a real older install would be
    with pytest.raises(HostError) as err:
        package_includes(manifest.dsl("cutlass").build, "cutlass")
    assert str(err.value) == (
        "dsl 'cutlass' needs nvidia-cutlass 4.2.0.0, this host has 4.1.0: "
        "pip install 'nvidia-cutlass==4.2.0.0'"
    )


def test_a_missing_package_is_refused_in_one_line(manifest: Manifest) -> None:
    build = manifest.dsl("cutlass").build
    pins = {"croqq-no-such-package": build.packages["nvidia-cutlass"]}
    with pytest.raises(
        HostError, match=r"^dsl 'cutlass' needs croqq-no-such-package 4\.2\.0\.0, not installed"
    ):
        package_includes(build.model_copy(update={"packages": pins}), "cutlass")


def test_the_package_version_is_part_of_the_toolchain_and_so_of_every_candidate_hash(
    manifest: Manifest,
) -> None:
    real = Settings(backend="cuda")
    assert toolchain_id(real, manifest, "cutlass").endswith(" + nvidia-cutlass 4.2.0.0")
    assert "nvidia-cutlass" not in toolchain_id(real, manifest, "cuda")
    shape = Shape(dtype="f16", m=4096, n=4096, k=4096)
    knobs = seed_knobs(manifest, "cutlass", "f16", "reference")
    spec = manifest.dsls["cutlass"]
    repinned = spec.model_copy(
        update={
            "build": spec.build.model_copy(
                update={
                    "packages": {
                        "nvidia-cutlass": spec.build.packages["nvidia-cutlass"].model_copy(
                            update={"version": "4.3.0"}
                        )
                    }
                }
            )
        }
    )
    other = manifest.model_copy(update={"dsls": {**manifest.dsls, "cutlass": repinned}})
    a = knob_candidate(manifest, real, "cutlass", shape, knobs)
    b = knob_candidate(other, real, "cutlass", shape, knobs)
    assert a.source == b.source and a.headers == b.headers and a.content_hash != b.content_hash
    assert not any(name.startswith(("cutlass/", "cute/")) for name in a.headers)  # toolchain headers stay out


def test_the_simulated_gpu_refuses_a_family_it_does_not_model_in_one_line(manifest: Manifest) -> None:
    from croqq.backends.sim import SimBackend

    spec = manifest.dsls["cuda"]
    other = spec.model_copy(update={"knobs": {**spec.knobs, "UNROLL": [1, 2]}})  # a knob no model knows
    mixed = manifest.model_copy(update={"dsls": {**manifest.dsls, "other": other}})
    SimBackend(mixed, Settings()).check_dsl("cuda")
    SimBackend(mixed, Settings()).check_dsl("cutlass")
    CudaBackend(mixed, Settings()).check_dsl("other")
    with pytest.raises(
        ConfigError, match=r"dsl 'other' has .*: tune it with CROQQ_BACKEND=cuda on GPU hosts$"
    ):
        SimBackend(mixed, Settings()).check_dsl("other")


def test_a_family_with_a_longer_compile_timeout_gets_it_and_a_hanging_compile_is_still_killed(
    manifest: Manifest, tmp_path: Path
) -> None:
    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\nsleep 3600\n")
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    spec = manifest.dsls["cutlass"]
    build = spec.build.model_copy(update={"compiler": str(compiler), "compile_timeout_s": 2.0})
    patched = manifest.model_copy(update={"dsls": {"cutlass": spec.model_copy(update={"build": build})}})
    shape = Shape(dtype="f16", m=4096, n=4096, k=4096)
    cand = knob_candidate(
        patched, Settings(), "cutlass", shape, seed_knobs(patched, "cutlass", "f16", "reference")
    )
    settings = Settings(build_dir=tmp_path / "build", run_dir=tmp_path / "run", compile_timeout_s=1)
    outcome = CudaBackend(patched, settings).build(shape, cand)
    assert not outcome.ok and outcome.reason == "compile timed out after 2s" and outcome.seconds >= 2
    assert (
        manifest.dsl("cutlass").build.compile_timeout_s == 900
        and manifest.dsl("cuda").build.compile_timeout_s is None
    )
