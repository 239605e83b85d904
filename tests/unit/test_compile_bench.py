"""The compile benchmark's space: the settings a family's rules accept (what it samples from)."""

from __future__ import annotations

from benchmarks.compile_bench import accepted
from croqq.domain.manifest import load_manifest
from croqq.settings import PROJECT_ROOT


def test_the_sampled_space_is_every_setting_the_rules_accept_and_holds_the_seeds() -> None:
    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    dims = manifest.reference_shape
    spec = manifest.dsl("cutlass")
    for dtype, kernel in spec.kernels.items():
        space = accepted(manifest, "cutlass", dtype, dims)
        total = 1
        for values in spec.knobs.values():
            total *= len(values)
        assert 0 < len(space) < total  # the rules refuse some settings, and accept many
        assert kernel.reference in space and kernel.naive in space
        assert all(spec.broken_rule(k, dims, manifest.dtypes[dtype]) is None for k in space[::997])
    assert not any(k["FAST_ACCUM"] for k in accepted(manifest, "cutlass", "f16", dims))
