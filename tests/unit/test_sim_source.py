"""The sim backend measures a candidate by its source, and the scripted reference agent edits sources.

A pure knob candidate (the template rendering, modulo comments and blanks) measures exactly as the knob
model predicts; a structurally edited source gets a deterministic, hash-chosen fate in the bands the sim
module states. The scripted agent runs as a jailed agent would (``python -I``, cwd = a workspace this
file lays out like croqq's) and answers with exactly candidate.cu and SUMMARY.txt.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from croqq.backends._base import GpuContext
from croqq.backends.sim import (
    LOSS_FACTORS,
    MISCOMPILES,
    NOISE_SIGMA,
    SIMULATED,
    WIN_FACTORS,
    SimArtifact,
    SimBackend,
)
from croqq.domain import source as src
from croqq.domain.knobs import Candidate, make_candidate, render_source, resolve_candidate, seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import Shape, parse_key
from croqq.probes._base import GpuInfo, GpuProbe, Reading
from croqq.proposers.agent import contract
from croqq.proposers.agent.checks import check_source
from croqq.settings import PROJECT_ROOT, Settings

GPU_TYPE = "sm90_Simulated_H100_SXM"
BIG = parse_key("f16_8192x8192x8192")
SCRIPTED = PROJECT_ROOT / "croqq" / "proposers" / "agent" / "scripted.py"
FAMILY_INCLUDE = '#include "gemm_f16.cuh"'
VARIANTS = 400


class StubProbe(GpuProbe):
    kind = "stub"

    def discover(self) -> list[GpuInfo]:
        return [GpuInfo(uuid="GPU-0", index=0, name="Simulated H100", gpu_type=GPU_TYPE, memory_mib=81559)]

    def read(self, uuid: str) -> Reading:
        return Reading(uuid=uuid, temp_c=40, sm_clock_mhz=1980, mem_clock_mhz=2619, power_w=300.0)


@cache
def manifest() -> Manifest:
    return load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")


def backend() -> SimBackend:
    """The cuda family's model (the default family is cutlass: test_sim_cutlass.py models it)."""
    return SimBackend(manifest(), Settings(time_scale=0.0, dsl="cuda"))


def gpu() -> GpuContext:
    return GpuContext(uuid="GPU-0", index=0, gpu_type=GPU_TYPE, probe=StubProbe())


def reference(shape: Shape = BIG) -> dict[str, int]:
    return seed_knobs(manifest(), "cuda", shape.dtype, "reference")


def knob_cand(shape: Shape = BIG, **knobs: int) -> Candidate:
    return make_candidate(manifest(), "cuda", shape, {**reference(shape), **knobs}, PROJECT_ROOT, "sim")


def source_cand(text: str, shape: Shape = BIG) -> Candidate:
    return resolve_candidate(manifest(), "cuda", shape.dtype, text, PROJECT_ROOT, "sim")


def template(shape: Shape = BIG, **knobs: int) -> str:
    return render_source(manifest(), "cuda", shape, {**reference(shape), **knobs})


def variant(i: int, shape: Shape = BIG) -> str:
    """A structurally different source per ``i`` (a line the template does not have)."""
    return template(shape).replace(FAMILY_INCLUDE, f"#define CROQQ_VARIANT {i}\n{FAMILY_INCLUDE}")


def art_of(be: SimBackend, cand: Candidate, shape: Shape = BIG) -> SimArtifact:
    build = be.build(shape, cand)
    assert build.ok, build.reason
    return be.decode(shape, build.artifact)


# -- the sim measures sources ------------------------------------------------------------------------


@pytest.mark.parametrize("knobs", [{}, {"STAGES": 5}, {"SWIZZLE": 4, "RASTER": 1}, {"TILE_N": 256}])
def test_a_pure_knob_candidate_measures_as_the_knob_model_predicts(knobs: dict[str, int]) -> None:
    be = backend()
    cand = knob_cand(**knobs)
    art = art_of(be, cand)
    assert art.factor == 1.0 and art.fault is None
    (m,) = be.measure(gpu(), BIG, [be.build(BIG, cand).artifact])
    predicted = be.predicted_tflops(GPU_TYPE, BIG, cand.knobs)
    assert m.outcome == "ok" and abs(m.tflops / predicted - 1.0) < 4 * NOISE_SIGMA


def test_comments_and_blank_lines_do_not_make_a_structural_edit() -> None:
    be = backend()
    text = "// tuned by hand\n\n" + template(STAGES=5).replace("\n", "\n\n")
    assert art_of(be, source_cand(text)).factor == 1.0
    assert be.build(BIG, source_cand(text)).ok


def test_a_structural_edit_gets_a_deterministic_fate() -> None:
    text = next(variant(i) for i in range(VARIANTS) if backend().build(BIG, source_cand(variant(i))).ok)
    a, b = backend(), backend()
    fates = [be.build(BIG, source_cand(text)).model_dump(exclude={"seconds"}) for be in (a, b)]
    assert fates[0] == fates[1]  # all but the wall time the build took
    art = art_of(a, source_cand(text))
    assert art.factor != 1.0 or art.fault is not None
    if art.fault is None:
        (m,) = a.measure(gpu(), BIG, [a.build(BIG, source_cand(text)).artifact])
        predicted = a.predicted_tflops(GPU_TYPE, BIG, reference()) * art.factor
        assert abs(m.tflops / predicted - 1.0) < 4 * NOISE_SIGMA
        plain = a.profile(gpu(), BIG, a.build(BIG, knob_cand()).artifact)
        edited = a.profile(gpu(), BIG, a.build(BIG, source_cand(text)).artifact)
        ratio = plain.metrics["duration_us"] / edited.metrics["duration_us"]
        assert ratio == pytest.approx(art.factor, rel=1e-3)


def test_structural_outcome_mix_is_within_the_stated_bands() -> None:
    be = backend()
    tally: Counter[str] = Counter()
    for i in range(VARIANTS):
        build = be.build(BIG, source_cand(variant(i)))
        if not build.ok:
            assert build.reason.removeprefix(SIMULATED) in MISCOMPILES and build.reason.startswith(SIMULATED)
            tally["miscompile"] += 1
            continue
        art = be.decode(BIG, build.artifact)
        (m,) = be.measure(gpu(), BIG, [build.artifact])
        if art.fault is not None:
            assert m.outcome == art.fault
            tally[art.fault] += 1
        elif art.factor > 1.0:
            assert WIN_FACTORS[0] <= art.factor <= WIN_FACTORS[1] and m.outcome == "ok"
            tally["win"] += 1
        else:
            assert LOSS_FACTORS[0] <= art.factor <= LOSS_FACTORS[1] and m.outcome == "ok"
            tally["loss"] += 1
    share = {kind: n / VARIANTS for kind, n in tally.items()}
    print("structural outcome mix:", {k: f"{v:.1%}" for k, v in sorted(share.items())})
    assert 0.03 <= share.get("miscompile", 0) <= 0.10
    assert 0.005 <= share.get("wrong_answer", 0) <= 0.06
    assert 0.0 < share.get("crash", 0) <= 0.04
    assert 0.08 <= share.get("win", 0) <= 0.17
    assert 0.68 <= share.get("loss", 0) <= 0.86


def test_a_missing_knob_is_an_undefined_identifier() -> None:
    text = template().replace("#define TILE_M 128\n", "")
    build = backend().build(BIG, source_cand(text))
    assert not build.ok and build.reason == 'simulated nvcc: error: identifier "TILE_M" is undefined'
    assert build.reason in build.log


def test_a_knob_value_outside_the_space_is_a_static_assert() -> None:
    text = template().replace("#define TILE_M 128\n", "#define TILE_M 96\n")
    build = backend().build(BIG, source_cand(text))
    assert build.reason == "simulated nvcc: static_assert failed: TILE_M=96 is not one of 64,128,256"
    assert not build.ok


# -- the scripted agent ------------------------------------------------------------------------------


def layout(ws: Path, phase: str, iteration: int = 1, best: str = "", ideas: str = "") -> Path:
    """An agent workspace as croqq lays it out (contract.py) for BIG from its reference kernel."""
    ws.mkdir(parents=True, exist_ok=True)
    be = backend()
    knobs = reference()
    ctx = contract.WorkspaceContext(
        key=BIG.key,
        dtype=BIG.dtype,
        m=BIG.m,
        n=BIG.n,
        k=BIG.k,
        dsl="cuda",
        gpu_type=GPU_TYPE,
        peak_tflops=be.peak_tflops(GPU_TYPE, BIG.dtype),
        iteration=iteration,
        baseline_tflops=600.0,
        best_tflops=600.0,
        best_iter=0,
        vendor_tflops=700.0,
        strategy="refine" if phase in ("knobs", "micro") else "escalate",
        consecutive_discards=0,
        phase=phase,  # type: ignore[arg-type]
        phase_reason="test",
        bottleneck="memory",
        profile_metrics={"dram_throughput_pct": 80.0},
        knob_space=manifest().dsl("cuda").knobs,
        best_knobs=knobs,
        headers=src.HeaderResolver((PROJECT_ROOT / "kernels" / "cuda",)).names(),
        build_command="nvcc -c cand.cu",
    )
    for name in contract.PROVIDED:
        (ws / name).write_text(f"# {name}\n")
    (ws / contract.CONTEXT).write_text(ctx.model_dump_json())
    (ws / contract.BEST).write_text(best or template())
    (ws / contract.IDEAS).write_text(ideas)
    shutil.copytree(PROJECT_ROOT / "kernels" / "cuda", ws / contract.INCLUDE, dirs_exist_ok=True)
    return ws


def files(ws: Path) -> set[str]:
    return {p.relative_to(ws).as_posix() for p in ws.rglob("*")}


def run_agent(
    ws: Path, misbehave: str = "", timeout: float = 300, **env: str
) -> tuple[subprocess.CompletedProcess[bytes], set[str]]:
    before = files(ws)
    scrubbed = {"PATH": os.environ.get("PATH", ""), "CROQQ_SCRIPTED_MISBEHAVE": misbehave, **env}
    done = subprocess.run(
        [sys.executable, "-I", str(SCRIPTED)],
        check=False,
        cwd=ws,
        env=scrubbed,
        capture_output=True,
        timeout=timeout,
    )
    return done, files(ws) - before


def answer(ws: Path) -> tuple[str, str]:
    return (ws / contract.CANDIDATE).read_text(), (ws / contract.SUMMARY).read_text()


@cache
def scripted() -> ModuleType:
    spec = importlib.util.spec_from_file_location("croqq_scripted_agent", SCRIPTED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def propose_in(ws: Path) -> tuple[str, str]:
    """The scripted agent's answer for a workspace, in process (no files written)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ws)
        result: tuple[str, str] = scripted().propose(scripted().Workspace.read())
    return result


def owned(text: str) -> str:
    core = (PROJECT_ROOT / "kernels" / "cuda" / "gemm_core.cuh").read_text().replace("#pragma once\n", "")
    return text.replace(FAMILY_INCLUDE, f'#define CROQQ_F16 1\n{core}\n#include "harness.cuh"')


def test_the_scripted_agent_uses_the_standard_library_only() -> None:
    tree = ast.parse(SCRIPTED.read_text())
    names = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert names - {"__future__"} <= sys.stdlib_module_names, names - set(sys.stdlib_module_names)


@pytest.mark.parametrize("phase", ["knobs", "structural"])
def test_the_scripted_agent_writes_exactly_its_answer_and_is_deterministic(
    tmp_path: Path, phase: str
) -> None:
    runs = []
    for name in ("a", "b"):
        done, new = run_agent(layout(tmp_path / name, phase, iteration=7))
        assert done.returncode == 0, done.stderr
        assert new == {contract.CANDIDATE, contract.SUMMARY}
        runs.append(answer(tmp_path / name))
    assert runs[0] == runs[1]
    summary = runs[0][1]
    assert summary.endswith("\n") and summary.count("\n") == 1 and 0 < len(summary.strip()) <= 300
    done, _ = run_agent(layout(tmp_path / "c", phase, iteration=8))
    assert answer(tmp_path / "c") != runs[0]


@pytest.mark.parametrize("phase", ["knobs", "structural"])
def test_an_answer_that_became_an_attempt_is_not_given_again(tmp_path: Path, phase: str) -> None:
    """history.md ending in attempts (refused, repeated, unbuildable) is another draw: an agent that gave
    the same answer again would be refused again, for ever."""
    rows = [
        "| iter | decision | TFLOPS | change | proposer | idea | error |",
        "|---|---|---|---|---|---|---|",
    ]
    rows.append("| 000 | BASELINE | 600.00 | - | - | baseline | - |")
    answers = []
    for attempts in range(4):
        ws = layout(tmp_path / str(attempts), phase, iteration=5)
        (ws / contract.HISTORY).write_text("\n".join(rows) + "\n")
        answers.append(propose_in(ws))
        rows.append(f"| attempt {attempts + 1} after 0 | ATTEMPT_repeat | 0.00 | - | scripted | x | y |")
    assert answers[1] != answers[0] and len(set(answers)) >= 3  # each a new draw (a few edit kinds only)
    assert scripted().attempts_since_iteration("\n".join(rows[:3])) == 0
    assert scripted().attempts_since_iteration("\n".join(rows)) == 4


def test_knob_phase_moves_one_or_two_knobs_to_neighbouring_values(tmp_path: Path) -> None:
    space = manifest().dsl("cuda").knobs
    best = template()
    for i in range(1, 13):
        text, summary = propose_in(layout(tmp_path / str(i), "knobs", iteration=i))
        assert src.structure(text, space) == src.structure(best, space)
        new = src.knob_values(text, space)
        moved = {k for k in space if new[k] != reference()[k]}
        assert 1 <= len(moved) <= 2, summary
        for k in moved:
            assert abs(space[k].index(new[k]) - space[k].index(reference()[k])) == 1
            assert new[k] in space[k] and k in summary


def test_structural_phase_takes_ownership_then_edits_the_kernel(tmp_path: Path) -> None:
    space = manifest().dsl("cuda").knobs
    resolver = src.HeaderResolver((PROJECT_ROOT / "kernels" / "cuda",))
    kinds = set()
    for i in range(1, 13):
        done, new = run_agent(layout(tmp_path / str(i), "structural", iteration=i))
        assert done.returncode == 0 and new == {contract.CANDIDATE, contract.SUMMARY}
        text, summary = answer(tmp_path / str(i))
        assert [inc.path for inc in src.includes(text) if not inc.angle] == ["harness.cuh"]
        assert "#define CROQQ_F16 1" in text and "take ownership" in summary
        assert src.normalize(text) != src.normalize(owned(template()))
        assert src.knob_values(text, space) == reference()
        assert check_source(text, resolver) == []
        assert source_cand(text).headers.keys() == {
            "harness.cuh",
            "sparse_layout.cuh",
        }  # the harness and what it includes
        kinds.add(summary.split(", then ")[1].split()[0])
    assert len(kinds) >= 3, kinds


def test_a_second_structural_step_edits_the_owned_kernel_and_does_not_repeat(tmp_path: Path) -> None:
    layout(tmp_path / "1", "structural", iteration=3)
    run_agent(tmp_path / "1")
    first, first_summary = answer(tmp_path / "1")
    idea = first_summary.split(", then ")[1].split(" (memory-bound")[0]
    ws = layout(tmp_path / "2", "micro", iteration=4, best=first, ideas=f"- iter 3: {first_summary}")
    done, new = run_agent(ws)
    assert done.returncode == 0 and new == {contract.CANDIDATE, contract.SUMMARY}
    second, second_summary = answer(ws)
    assert "take ownership" not in second_summary and idea not in second_summary
    assert src.normalize(second) != src.normalize(first)


def test_about_8_percent_of_structural_edits_are_broken_and_none_move_knobs(tmp_path: Path) -> None:
    total = 200
    texts = [propose_in(layout(tmp_path / str(i), "structural", iteration=i))[0] for i in range(total)]
    broken = sum(any(slip in text for _, slip in scripted().BROKEN) for text in texts)
    assert 0.03 <= broken / total <= 0.14
    assert all(src.knob_values(text, reference()) == reference() for text in texts)


def test_regenerate_may_jump_three_knobs(tmp_path: Path) -> None:
    jumped = 0
    for i in range(1, 11):
        text, summary = propose_in(layout(tmp_path / str(i), "regenerate", iteration=i))
        moved = {k for k, v in src.knob_values(text, reference()).items() if v != reference()[k]}
        assert len(moved) in (0, 3)
        jumped += len(moved) == 3 and "jump" in summary
    assert 2 <= jumped <= 9


# -- misbehaviours -----------------------------------------------------------------------------------


def test_misbehave_nothing_writes_nothing(tmp_path: Path) -> None:
    done, new = run_agent(layout(tmp_path, "knobs"), "nothing")
    assert done.returncode == 0 and new == set()


def test_misbehave_two_writes_two_candidates(tmp_path: Path) -> None:
    _, new = run_agent(layout(tmp_path, "knobs"), "two")
    assert new == {contract.CANDIDATE, "candidate2.cu", contract.SUMMARY}


def test_misbehave_huge_writes_50_mb(tmp_path: Path) -> None:
    _, new = run_agent(layout(tmp_path, "knobs"), "huge")
    assert contract.CANDIDATE in new and (tmp_path / contract.CANDIDATE).stat().st_size >= 50 * 1024 * 1024


def test_misbehave_symlink_writes_outside_the_workspace(tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    ws = layout(tmp_path / "ws", "knobs")
    run_agent(ws, "symlink", CROQQ_SCRIPTED_TARGET=str(target))
    assert (ws / contract.CANDIDATE).is_symlink() and target.read_text() == template()


@pytest.mark.parametrize(
    ("mode", "text", "rule"),
    [
        ("include-passwd", '#include "/etc/passwd"', "absolute-include"),
        ("include-escape", '#include "../../croqq/settings.py"', "escaping-include"),
        ("timing", "cudaEventElapsedTime(", "host-timing"),
    ],
)
def test_misbehave_forbidden_sources(tmp_path: Path, mode: str, text: str, rule: str) -> None:
    _, new = run_agent(layout(tmp_path, "knobs"), mode)
    candidate, _ = answer(tmp_path)
    assert new == {contract.CANDIDATE, contract.SUMMARY} and text in candidate
    resolver = src.HeaderResolver((PROJECT_ROOT / "kernels" / "cuda",))
    assert rule in {f.rule for f in check_source(candidate, resolver)}


def test_misbehave_loop_runs_past_its_timeout(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_agent(layout(tmp_path, "knobs"), "loop", timeout=2)


def test_misbehave_garbage_prints_a_megabyte_and_writes_nothing(tmp_path: Path) -> None:
    done, new = run_agent(layout(tmp_path, "knobs"), "garbage")
    assert done.returncode == 0 and len(done.stdout) == 1 << 20 and new == set()


def test_misbehave_fail_exits_3_with_a_message(tmp_path: Path) -> None:
    done, new = run_agent(layout(tmp_path, "knobs"), "fail")
    assert done.returncode == 3 and b"fail" in done.stderr and new == set()


def test_misbehave_unchanged_answers_best(tmp_path: Path) -> None:
    run_agent(layout(tmp_path, "knobs"), "unchanged")
    assert answer(tmp_path) == (template(), "no change\n")


def test_misbehave_modify_overwrites_best(tmp_path: Path) -> None:
    _, new = run_agent(layout(tmp_path, "knobs"), "modify")
    assert new == {contract.CANDIDATE, contract.SUMMARY}
    assert (tmp_path / contract.BEST).read_text() == answer(tmp_path)[0] != template()
