"""validate_repo: every broken record is named, as ``<path>: <reason>``, and a sound repo has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from croqq.store import paths
from croqq.store.gitrepo import GitRepo
from croqq.store.validate import FOREIGN_HINT, Problem, validate_repo
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests

GPU, DSL = "sm90_NVIDIA_H200", "cuda"
KEY, OTHER = "f16_4096x8192x8192", "e4m3_2048x2048x2048"
RUN = paths.RunPaths(GPU, DSL)


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    """A run with two shapes: KEY complete (max_iter 4), OTHER active; attempts included."""
    repo = GitRepo(tmp_path / "results")
    writer = ResultsWriter(repo)
    for req in sample_requests(GPU, DSL, [KEY], 5, 11, max_iter=4, attempt_rate=0.4):
        writer.apply(req)
    for req in sample_requests(GPU, DSL, [OTHER], 5, 12, max_iter=30, attempt_rate=0.4):
        writer.apply(req)
    return repo


def edit(repo: GitRepo, changes: dict[str, bytes | None]) -> None:
    repo.commit(changes, "corrupt on purpose")


def text(repo: GitRepo, path: str) -> str:
    return (repo.read(path) or b"").decode()


def problems(repo: GitRepo, dsl: str | None = None) -> list[str]:
    return [str(p) for p in validate_repo(repo.path, dsl)]


def test_sound_repo_has_no_problems(repo: GitRepo) -> None:
    assert problems(repo) == []


def test_problem_reads_as_path_then_reason() -> None:
    assert str(Problem("a/b.json", "bad JSON")) == "a/b.json: bad JSON"


def test_validate_names_truncated_results_tsv(repo: GitRepo) -> None:
    path = RUN.results_tsv(KEY)
    edit(repo, {path: text(repo, path)[:-30].encode()})
    found = problems(repo)
    assert any(p.startswith(f"{path}: line 6: truncated") for p in found), found


def test_validate_names_garbled_results_tsv_line(repo: GitRepo) -> None:
    path = RUN.results_tsv(KEY)
    lines = text(repo, path).splitlines(keepends=True)
    lines[2] = lines[2].replace("\t", " ", 2)
    edit(repo, {path: "".join(lines).encode()})
    assert f"{path}: line 3: expected 8 tab-separated fields, found 6" in problems(repo)


def test_validate_names_unknown_schema_version(repo: GitRepo) -> None:
    path = RUN.checkpoint(KEY)
    record = json.loads(text(repo, path)) | {"schema_version": 2}
    edit(repo, {path: json.dumps(record).encode()})
    assert f"{path}: unknown schema_version 2 (this croqq reads 1)" in problems(repo)


def test_validate_names_bad_json(repo: GitRepo) -> None:
    path = RUN.state_json
    edit(repo, {path: b'{"gpu": '})
    assert any(p.startswith(f"{path}: not valid JSON") for p in problems(repo))


def test_validate_names_a_gap_in_iterations(repo: GitRepo) -> None:
    path = RUN.rounds_raw(KEY)
    lines = text(repo, path).splitlines(keepends=True)
    edit(repo, {path: "".join(lines[:2] + lines[3:]).encode()})
    assert f"{path}: iteration 002 is missing (found 003 in its place)" in problems(repo)


def test_validate_names_a_checkpoint_that_disagrees_with_the_rows(repo: GitRepo) -> None:
    path = RUN.checkpoint(OTHER)
    record = json.loads(text(repo, path)) | {"current_iter": 2}
    edit(repo, {path: json.dumps(record).encode()})
    found = problems(repo)
    assert any(p.startswith(f"{RUN.results_tsv(OTHER)}: holds 5 iteration(s)") for p in found), found


def test_validate_names_a_state_entry_that_disagrees_with_the_checkpoint(repo: GitRepo) -> None:
    state = json.loads(text(repo, RUN.state_json))
    state["shapes"][OTHER]["best_iter"] = 7
    edit(repo, {RUN.state_json: json.dumps(state).encode()})
    assert f"{RUN.state_json}: shapes.{OTHER}.best_iter is 7, the checkpoint says" in " ".join(problems(repo))


def test_state_json_changes_only_when_a_shape_keeps_or_changes_status(tmp_path: Path) -> None:
    """No field of state.json changes every iteration: a DISCARD or an attempt leaves it as it was."""
    repo = GitRepo(tmp_path / "results")
    writer = ResultsWriter(repo)
    before = b""
    for req in sample_requests(GPU, DSL, [KEY], 30, 5, max_iter=40, attempt_rate=0.3):
        writer.apply(req)
        after = repo.read(RUN.state_json) or b""
        kept = req.round is not None and req.round.decision == "KEEP"
        if (req.round is not None and req.round.iteration == 0) or kept:
            assert after != before
        else:
            assert after == before, (req.kind, req.round.decision if req.round else "attempt")
        before = after


def test_a_state_entry_with_a_field_the_schema_does_not_know_is_named(repo: GitRepo) -> None:
    state = json.loads(text(repo, RUN.state_json))
    state["shapes"][KEY]["current_iter"] = 4
    edit(repo, {RUN.state_json: json.dumps(state).encode()})
    found = " ".join(problems(repo))
    assert f"{RUN.state_json}: shapes.{KEY}.current_iter: Extra inputs are not permitted" in found


def test_a_run_of_an_older_layout_is_named_folder_by_folder_not_misread(repo: GitRepo) -> None:
    """Folders beside shapes/ (the per-kind folders of an older layout) are named, none passes silently."""
    old = {f"{RUN.root}/checkpoints/{KEY}.json": b"{}\n", f"{RUN.root}/srcs/{KEY}/iter000_baseline.cu": b"\n"}
    edit(repo, old)
    assert problems(repo) == [
        f"{RUN.root}/{name}: not part of the results layout ({FOREIGN_HINT})"
        for name in ("checkpoints", "srcs")
    ]


def test_validate_names_absolute_include(repo: GitRepo) -> None:
    path = RUN.src(KEY, 0, "baseline", "cu")
    edit(repo, {path: (text(repo, path) + '#include "/usr/local/secret.h"\n').encode()})
    found = problems(repo)
    assert any(p.startswith(path) and "is absolute" in p and "/usr/local/secret.h" in p for p in found), found


def test_validate_names_include_that_escapes_the_repo(repo: GitRepo) -> None:
    path = RUN.src(KEY, 1, "x", "cu")
    edit(repo, {path: b'#include <cuda_fp16.h>\n#include "../../../../../../../etc/passwd"\n'})
    assert f'{path}: line 2: #include "../../../../../../../etc/passwd" escapes the repo' in problems(repo)


def test_validate_names_best_kernel_outside_repo(repo: GitRepo) -> None:
    path = RUN.checkpoint(OTHER)
    record = json.loads(text(repo, path)) | {"best_kernel": "../outside/best.cu"}
    edit(repo, {path: json.dumps(record).encode()})
    assert f"{path}: best_kernel '../outside/best.cu' is outside the repo" in problems(repo)


def test_validate_names_a_missing_best_kernel(repo: GitRepo) -> None:
    ckpt = json.loads(text(repo, RUN.checkpoint(OTHER)))
    edit(repo, {ckpt["best_kernel"]: None})
    found = problems(repo)
    assert f"{RUN.checkpoint(OTHER)}: best_kernel '{ckpt['best_kernel']}' does not exist" in found


def test_validate_names_a_file_where_a_shape_s_folder_belongs(repo: GitRepo) -> None:
    edit(repo, {f"{RUN.shapes_dir}/notes.txt": b"a file\n"})
    assert problems(repo) == [f"{RUN.shapes_dir}/notes.txt: not a shape's folder (shapes/<key>/)"]


def test_validate_names_files_of_a_shape_without_a_checkpoint(repo: GitRepo) -> None:
    path = RUN.checkpoint(OTHER)
    edit(repo, {path: None, RUN.state_json: text(repo, RUN.state_json).replace(OTHER, "x").encode()})
    found = problems(repo)
    assert f"{RUN.shape_dir(OTHER)}: files of a shape with neither checkpoint nor state entry" in found, found


def test_validate_names_state_entry_without_checkpoint(repo: GitRepo) -> None:
    edit(repo, {RUN.checkpoint(OTHER): None})
    assert f"{RUN.state_json}: shapes.{OTHER}: state entry without checkpoint" in problems(repo)


def test_validate_names_attempt_record_with_iteration_id(repo: GitRepo) -> None:
    path = RUN.attempts(OTHER)
    lines = text(repo, path).splitlines()
    record = json.loads(lines[0]) | {"iteration": 3}
    edit(repo, {path: ("\n".join([json.dumps(record), *lines[1:]]) + "\n").encode()})
    assert f"{path}: line 1: an attempt record has an iteration id (3)" in problems(repo)


def test_validate_names_complete_shape_without_registry_file(repo: GitRepo) -> None:
    edit(repo, {paths.best_kernel("gemm", "f16", KEY, "cu"): None})
    wanted = f"kernels/<family>_f16/{KEY}_best.cu"
    assert f"{RUN.checkpoint(KEY)}: complete, but {wanted} is missing" in problems(repo)


def test_validate_names_registry_include_outside_repo(repo: GitRepo) -> None:
    path = paths.best_kernel("gemm", "f16", KEY, "cu")
    edit(repo, {path: b'#include "../../../x.h"\n'})
    assert f'{path}: line 1: #include "../../../x.h" escapes the repo' in problems(repo)


def test_validate_reads_the_branch_tip_not_the_working_tree(repo: GitRepo) -> None:
    repo.close()
    (repo.path / RUN.results_tsv(KEY)).write_text("garbage")
    assert problems(repo) == []


def test_validate_checks_only_the_requested_dsl(repo: GitRepo) -> None:
    edit(repo, {RUN.checkpoint(OTHER): None})
    assert problems(repo, "triton") == []
    assert problems(repo, "all") == problems(repo, DSL) != []


def test_validate_problems_name_their_shape(repo: GitRepo) -> None:
    edit(repo, {RUN.checkpoint(OTHER): b"{"})
    shapes = {p.shape for p in validate_repo(repo.path, None)}
    assert shapes == {(GPU, DSL, OTHER)}
