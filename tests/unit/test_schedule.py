"""The schedule: exactly the 134 shapes per dtype of DESIGN section 1, their scenarios, regions, priority."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from croqq.domain.manifest import load_manifest
from croqq.domain.schedule import build_schedule, is_complete
from croqq.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

# Written out from DESIGN.md independently of kernels/manifest.json.
SQ = [256, 512, 768, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
SM = [128, 256, 384, 512, 768, 1024, 2048, 3072, 4096, 6144, 8192, 16384]
SN = [256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768]
SK = [128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 32768]
T = [256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
K = [128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384]
N = [256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 32768]
M = [128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384]


def expected_shapes() -> dict[tuple[int, int, int], set[str]]:
    lists = {
        "square": [(s, s, s) for s in SQ],
        "sweep_m": [(s, 8192, 8192) for s in SM],
        "sweep_n": [(4096, s, 8192) for s in SN],
        "sweep_k": [(4096, 8192, s) for s in SK],
        "sweep_mn": [(t, t, 4096) for t in T]
        + [(t, t, 8192) for t in T]
        + [(4096, 4096, k) for k in K]
        + [(8192, 8192, k) for k in K],
        "sweep_mk": [(t, 4096, t) for t in T]
        + [(t, 8192, t) for t in T]
        + [(4096, n, 4096) for n in N]
        + [(8192, n, 8192) for n in N],
        "sweep_nk": [(4096, t, t) for t in T]
        + [(8192, t, t) for t in T]
        + [(m, 4096, 4096) for m in M]
        + [(m, 8192, 8192) for m in M],
    }
    out: dict[tuple[int, int, int], set[str]] = {}
    for name, shapes in lists.items():
        for m, n, k in shapes:
            if m >= 128 and n >= 256 and k >= 128:
                out.setdefault((m, n, k), set()).add(name)
    return out


@pytest.fixture(scope="module")
def manifest():  # type: ignore[no-untyped-def]
    return load_manifest(ROOT / "kernels" / "manifest.json")


def test_each_dtype_has_exactly_the_134_design_shapes_with_their_scenarios(manifest) -> None:  # type: ignore[no-untyped-def]
    expected = expected_shapes()
    assert len(expected) == 134
    for dtype in ("f16", "e4m3"):
        schedule = build_schedule(manifest, dtype)
        got = {(s.m, s.n, s.k): set(s.scenarios) for s in schedule}
        assert got == expected
        assert all(s.key == f"{dtype}_{s.m}x{s.n}x{s.k}" for s in schedule)


def test_all_is_268_unique_keys_ranked_0_to_267(manifest) -> None:  # type: ignore[no-untyped-def]
    schedule = build_schedule(manifest, "all")
    assert len({s.key for s in schedule}) == 268
    assert [s.rank for s in schedule] == list(range(268))


def test_region_is_near_only_inside_the_design_box(manifest) -> None:  # type: ignore[no-untyped-def]
    for s in build_schedule(manifest, "f16"):
        near = 2048 <= s.m <= 8192 and 4096 <= s.n <= 16384 and 4096 <= s.k <= 16384
        assert s.region == ("near" if near else "far")


def test_priority_is_log_distance_from_reference_then_deterministic(manifest) -> None:  # type: ignore[no-untyped-def]
    schedule = build_schedule(manifest, "f16")
    assert schedule[0].key == "f16_4096x8192x8192"

    def dist(s):  # type: ignore[no-untyped-def]
        return math.dist((math.log2(s.m), math.log2(s.n), math.log2(s.k)), (12, 13, 13))

    distances = [dist(s) for s in schedule]
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(distances))
    assert build_schedule(manifest, "f16") == schedule


def test_active_shapes_come_first(manifest) -> None:  # type: ignore[no-untyped-def]
    schedule = build_schedule(manifest, "f16", active=["f16_256x256x256", "f16_16384x16384x16384"])
    assert {s.key for s in schedule[:2]} == {"f16_256x256x256", "f16_16384x16384x16384"}


def test_single_shape_must_pass_constraints(manifest) -> None:  # type: ignore[no-untyped-def]
    (only,) = build_schedule(manifest, "f16", only=(4096, 4096, 4096))
    assert only.scenarios == ["square", "sweep_mk", "sweep_mn", "sweep_nk"]
    with pytest.raises(ConfigError, match="M=64 is below the minimum M>=128"):
        build_schedule(manifest, "f16", only=(64, 64, 64))


def test_unknown_dtype_is_refused_with_the_choices(manifest) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"unknown dtype 'fp32'; use --dtype f16\|e4m3\|f16sp\|all"):
        build_schedule(manifest, "fp32")


def test_done_shape_is_skipped_only_with_all_its_iterations() -> None:
    assert is_complete("done", 30, 30)
    assert not is_complete("done", 12, 30)
    assert not is_complete("active", 30, 30)


def test_manifest_with_unknown_field_is_refused(tmp_path: Path) -> None:
    raw = json.loads((ROOT / "kernels" / "manifest.json").read_text())
    raw["modes"]["from_scratch"]["speed"] = "fast"
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"manifest.json: modes.from_scratch.speed: Extra inputs"):
        load_manifest(bad)


def test_manifest_missing_a_scenario_is_refused(tmp_path: Path) -> None:
    raw = json.loads((ROOT / "kernels" / "manifest.json").read_text())
    del raw["scenarios"]["sweep_nk"]
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="missing scenario"):
        load_manifest(bad)


def test_sparse_dtype_is_asked_for_by_name_not_part_of_all(manifest) -> None:  # type: ignore[no-untyped-def]
    assert {s.dtype for s in build_schedule(manifest, "all")} == {"f16", "e4m3"}
    assert len(build_schedule(manifest, "f16sp")) == 134
