"""Candidates as sources: the content hash covers what it must, the stored form compiles from the repo
alone, and it reads back to the same candidate."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from croqq.backends.toolchain import knob_candidate
from croqq.domain import source as src
from croqq.domain.knobs import include_resolver, seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.phases import next_phase
from croqq.domain.records import HistoryEntry
from croqq.domain.shapes import Shape
from croqq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = load_manifest(ROOT / "kernels" / "manifest.json")
SHAPE = Shape(dtype="f16", m=256, n=256, k=256)
RUN = "tuning/sm90_Simulated_H100_SXM/cuda"


def reference():  # type: ignore[no-untyped-def]
    return knob_candidate(
        MANIFEST, Settings(), "cuda", SHAPE, seed_knobs(MANIFEST, "cuda", "f16", "reference")
    )


def test_the_closure_holds_every_header_included_transitively() -> None:
    cand = reference()
    assert set(cand.headers) == {"gemm_f16.cuh", "gemm_core.cuh", "harness.cuh", "sparse_layout.cuh"}
    assert cand.headers["gemm_core.cuh"] == (ROOT / "kernels/cuda/gemm_core.cuh").read_text()


def test_the_hash_ignores_comments_and_blanks_but_not_headers_flags_or_compiler() -> None:
    cand = reference()
    h = src.content_hash(cand.source, cand.headers, cand.flags, cand.toolchain)
    assert h == cand.content_hash
    reformatted = "// a comment\n\n" + cand.source.replace(" ", "   ") + "/* tail */\n"
    assert src.content_hash(reformatted, cand.headers, cand.flags, cand.toolchain) == h
    edited = {**cand.headers, "harness.cuh": cand.headers["harness.cuh"] + "\n// edit\nint x;\n"}
    assert src.content_hash(cand.source, edited, cand.flags, cand.toolchain) != h
    assert src.content_hash(cand.source, cand.headers, [*cand.flags, "-G"], cand.toolchain) != h
    assert src.content_hash(cand.source, cand.headers, cand.flags, "release 13.1, V13.1.1") != h


def test_an_include_outside_the_include_folders_is_a_source_error() -> None:
    read = src.read_from(include_resolver(MANIFEST, "cuda", ROOT))
    for bad in ('"../../croqq/settings.py"', '"/etc/passwd"', '"nothere.cuh"'):
        with pytest.raises(src.SourceError, match="not a header of the include folders"):
            src.header_closure(f"#include {bad}\n", read)


def test_stored_files_are_content_addressed_and_read_back_to_the_same_candidate(tmp_path: Path) -> None:
    cand = reference()
    kernel = f"{RUN}/shapes/{SHAPE.key}/srcs/iter003_x.cu"
    files = src.stored_files(RUN, kernel, cand.source, cand.headers)
    headers = sorted(p for p in files if p != kernel)
    assert len(headers) == 4 and all(p.startswith(f"{RUN}/headers/") for p in headers)
    assert '#include "../../../headers/' in files[kernel]
    again = src.stored_files(RUN, f"{RUN}/shapes/{SHAPE.key}/srcs/iter004_y.cu", cand.source, cand.headers)
    assert sorted(p for p in again if "/headers/" in p) == headers  # once per distinct content
    edited = {**cand.headers, "gemm_core.cuh": cand.headers["gemm_core.cuh"] + "\n"}
    changed = src.stored_files(RUN, kernel, cand.source, edited)
    assert len(set(changed) - set(files)) == 2  # gemm_core.cuh and gemm_f16.cuh, which includes it
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    source, back = src.load_stored(str(tmp_path / kernel), src.read_file)
    assert back == cand.headers and src.normalize(source) == src.normalize(cand.source)
    assert src.content_hash(source, back, cand.flags, cand.toolchain) == cand.content_hash


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CUDA toolkit)")
@pytest.mark.timeout(3600)  # one real compile: many minutes on a loaded 2-core host
def test_a_stored_candidate_compiles_from_the_repo_alone(tmp_path: Path) -> None:
    cand = reference()
    kernel = f"{RUN}/shapes/{SHAPE.key}/srcs/iter000_baseline.cu"
    for path, text in src.stored_files(RUN, kernel, cand.source, cand.headers).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    result = subprocess.run(
        ["nvcc", *cand.flags, "-c", "-o", str(tmp_path / "k.o"), kernel],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_knob_values_and_structure_tell_knob_edits_from_structural_ones() -> None:
    source = reference().source
    knobs = list(MANIFEST.dsl("cuda").knobs)
    retuned = source.replace("#define STAGES 4", "#define STAGES 5")
    assert src.knob_values(retuned, knobs)["STAGES"] == 5
    assert src.structure(retuned, knobs) == src.structure(source, knobs)
    edited = retuned.replace('#include "gemm_f16.cuh"', '#define EXTRA 1\n#include "gemm_f16.cuh"')
    assert src.structure(edited, knobs) != src.structure(source, knobs)


def _entry(i: int, change: str) -> HistoryEntry:
    return HistoryEntry(iteration=i, summary=f"idea {i}", decision="DISCARD", change=change)


def test_two_knob_only_changes_in_a_row_ask_for_a_structural_one() -> None:
    base = [HistoryEntry(iteration=0, summary="baseline", decision="BASELINE")]
    assert next_phase("refine", base, False)[0] == "knobs"
    assert next_phase("refine", [*base, _entry(1, "knobs")], False)[0] == "knobs"
    assert next_phase("refine", [*base, _entry(1, "knobs"), _entry(2, "knobs")], False)[0] == "structural"
    after = [*base, _entry(1, "knobs"), _entry(2, "structural")]
    assert next_phase("refine", after, False)[0] == "knobs"
    assert next_phase("refine", after, True)[0] == "micro"
    assert next_phase("escalate", after, False)[0] == "structural"
    assert next_phase("radical", after, False)[0] == "regenerate"
