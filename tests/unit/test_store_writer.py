"""ResultsWriter: one commit per STORE, idempotent, every file in agreement with the others."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from croqq.chaos.invariants import repo_problems
from croqq.errors import InvalidRecordError
from croqq.store import paths
from croqq.store.gitrepo import GitRepo
from croqq.store.load import list_runs, load_checkpoint, load_state, tried_hashes
from croqq.store.render import commit_message, group_commit_message, parse_tsv, stored_in_message
from croqq.store.schema import StoreRequest
from croqq.store.validate import validate_repo
from croqq.store.writer import ResultsWriter
from tests.samples import sample_requests

GPU, DSL = "sm90_NVIDIA_H200", "cuda"
KEYS = ["f16_4096x8192x8192", "e4m3_1024x1024x1024", "f16_256x256x256"]
RUN = paths.RunPaths(GPU, DSL)


def requests(
    keys: list[str] = KEYS, iters: int = 6, max_iter: int = 150, seed: int = 3
) -> list[StoreRequest]:
    return list(sample_requests(GPU, DSL, keys, iters, seed, max_iter=max_iter, attempt_rate=0.3))


def subjects(repo: GitRepo) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo.path), "log", "--reverse", "--format=%s", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()[1:]  # without the initial commit


@pytest.fixture
def writer(tmp_path: Path) -> ResultsWriter:
    return ResultsWriter(GitRepo(tmp_path / "results"))


def first_iteration(reqs: list[StoreRequest]) -> StoreRequest:
    return next(r for r in reqs if r.kind == "iteration")


def test_iteration_writes_every_file_in_one_commit(writer: ResultsWriter) -> None:
    req = first_iteration(requests(iters=1))
    receipt = writer.apply(req)
    assert not receipt.duplicate and receipt.iteration == 0 and receipt.commit == writer.repo.head()
    repo, key = writer.repo, req.key
    expected = [
        RUN.results_tsv(key),
        RUN.rounds_raw(key),
        RUN.rounds_md(key),
        RUN.ideas(key),
        RUN.src(key, 0, "baseline", "cu"),
        RUN.timing(key, 0),
        RUN.checkpoint(key),
        RUN.state_json,
    ]
    assert all(repo.exists(p) for p in expected)
    assert subjects(repo) == [commit_message(req).split("\n", 1)[0]]


def test_repeated_store_changes_nothing(writer: ResultsWriter) -> None:
    reqs = requests(iters=3)
    receipts = [writer.apply(r) for r in reqs]
    head = writer.repo.head()
    again = [writer.apply(r) for r in reqs]
    assert all(r.duplicate for r in again)
    assert all(r.commit == head for r in again)
    assert [r.iteration for r in again] == [r.iteration for r in receipts]
    assert len(subjects(writer.repo)) == len(reqs)


def test_each_commit_reports_its_time_and_a_repeat_none_and_the_repo_size_grows(
    writer: ResultsWriter,
) -> None:
    times: list[float] = []
    writer.on_commit = times.append
    reqs = requests(iters=3)
    empty = writer.repo.size_bytes()
    for req in reqs:
        writer.apply(req)
    writer.apply(reqs[0])  # a repeat commits nothing
    assert len(times) == len(reqs) and all(0 < t < 10 for t in times)
    assert writer.repo.size_bytes() > empty > 0


def test_attempt_is_stored_without_an_iteration_id(writer: ResultsWriter) -> None:
    reqs = requests(iters=8)
    attempt = next(r for r in reqs if r.kind == "attempt")
    for req in reqs[: reqs.index(attempt) + 1]:
        writer.apply(req)
    assert attempt.attempt is not None
    ideas = writer.repo.read(RUN.ideas(attempt.key)) or b""
    last = json.loads(ideas.splitlines()[-1])
    assert last["decision"] == "COMPILE_FAIL" and last["iteration"] is None
    line = json.loads((writer.repo.read(RUN.attempts(attempt.key)) or b"").splitlines()[-1])
    assert "iteration" not in line and line["attempt_no"] == attempt.attempt.attempt_no
    assert subjects(writer.repo)[-1] == (
        f"{attempt.key} attempt{attempt.attempt.attempt_no}: {attempt.attempt.idea.summary} "
        "- compile failed (no iteration)"
    )


def test_commit_messages_follow_the_format(writer: ResultsWriter) -> None:
    reqs = requests(keys=KEYS[:1], iters=3)
    for req in reqs:
        writer.apply(req)
    lines = subjects(writer.repo)
    base = reqs[0].round
    assert base is not None
    assert lines[0] == f"{KEYS[0]} iter000: baseline - TFLOPS: 0.00 -> {base.tflops:.2f} (BASELINE)"
    second = next(r for r in reqs if r.round is not None and r.round.iteration == 1)
    assert second.round is not None and second.round.idea is not None
    assert (
        f"{KEYS[0]} iter001: {second.round.idea.summary} - TFLOPS: {second.round.best_before:.2f} -> "
        f"{second.round.tflops:.2f} ({second.round.decision})"
    ) in lines


def test_files_agree_after_many_stores(writer: ResultsWriter) -> None:
    reqs = requests(iters=12, max_iter=10)
    for req in reqs:
        writer.apply(req)
    writer.repo.close()
    assert validate_repo(writer.repo.path, DSL) == []
    state = load_state(writer.repo, GPU, DSL)
    assert state is not None and list(state.shapes) == sorted(KEYS)
    for key in KEYS:
        ckpt = load_checkpoint(writer.repo, GPU, DSL, key)
        rows = parse_tsv((writer.repo.read(RUN.results_tsv(key)) or b"").decode())
        assert ckpt is not None and ckpt.current_iter == 10 == rows[-1].iter
        assert [r.iter for r in rows] == list(range(11))
        assert state.shapes[key].best_tflops == ckpt.best_tflops
        assert writer.repo.exists(paths.best_kernel("gemm", ckpt.dtype, key, "cu"))
        assert len(tried_hashes(writer.repo, GPU, DSL, key)) >= 1
    assert list_runs(writer.repo) == [(GPU, DSL)]
    status = subprocess.run(
        ["git", "-C", str(writer.repo.path), "status", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == ""


def test_group_commit_stores_many_requests_in_one_commit(writer: ResultsWriter) -> None:
    reqs = requests(iters=4)
    receipts = writer.apply_group(reqs)
    assert len({r.commit for r in receipts}) == 1 and not any(r.duplicate for r in receipts)
    assert len(subjects(writer.repo)) == 1
    assert all(r.duplicate for r in writer.apply_group(reqs))
    assert validate_repo(writer.repo.path, None) == []
    iterations = [(r.gpu + "/" + r.dsl, r.key, r.round.iteration) for r in reqs if r.round is not None]
    message = subprocess.run(
        ["git", "-C", str(writer.repo.path), "log", "-1", "--format=%B"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert sorted(stored_in_message(message)) == sorted(iterations)
    assert repo_problems(writer.repo.path) == []  # each iteration of the group commit counted once


def test_a_commit_message_names_the_iterations_it_stores() -> None:
    first, second = [r for r in requests(iters=2) if r.round is not None][:2]
    named = [(f"{GPU}/{DSL}", r.key, r.round.iteration if r.round else -1) for r in (first, second)]
    single = commit_message(first)
    assert stored_in_message(single) == named[:1]
    group = group_commit_message([first, second])
    assert group.startswith("store: 2 record(s)\n\n") and single in group
    assert stored_in_message(group) == named
    assert stored_in_message(single.split("\n\n")[0]) == []  # an iteration line without its run trailer


def test_an_iteration_that_would_leave_a_gap_is_refused(writer: ResultsWriter) -> None:
    reqs = [r for r in requests(keys=KEYS[:1], iters=3) if r.kind == "iteration"]
    writer.apply(reqs[0])
    with pytest.raises(InvalidRecordError, match="gap"):
        writer.apply(reqs[2])


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"key": "../escape"}, "checkpoint is for"),
        ({"kind": "attempt"}, "kind attempt needs an attempt"),
        ({"gpu": "../../etc"}, "not a safe path component"),
        ({"ext": "cu/../../x"}, "not a safe path component"),
        ({"source": ""}, "needs its source"),
        ({"complete": True}, "complete needs"),
    ],
)
def test_inconsistent_requests_are_refused(
    writer: ResultsWriter, update: dict[str, object], reason: str
) -> None:
    req = first_iteration(requests(iters=1)).model_copy(update=update)
    with pytest.raises(InvalidRecordError, match=reason):
        writer.apply(req)
    assert subjects(writer.repo) == []


def test_checkpoint_best_kernel_outside_the_repo_is_refused(writer: ResultsWriter) -> None:
    req = first_iteration(requests(iters=1))
    ckpt = req.checkpoint.model_copy(update={"best_kernel": "../../outside.cu"})
    state = req.state.model_copy(update={"best_kernel": "../../outside.cu"})
    with pytest.raises(InvalidRecordError, match="leaves the repo"):
        writer.apply(req.model_copy(update={"checkpoint": ckpt, "state": state}))


def test_rounds_raw_leaves_the_timing_text_to_perf(writer: ResultsWriter) -> None:
    req = first_iteration(requests(iters=1))
    writer.apply(req)
    line = json.loads(writer.repo.read(RUN.rounds_raw(req.key)) or b"")
    assert line["measure"]["candidate"]["raw"] == ""
    assert req.round is not None
    timing = (writer.repo.read(RUN.timing(req.key, 0)) or b"").decode()
    assert req.round.measure.candidate.raw in timing and "# gpu at start: sm 1980 MHz" in timing


def test_state_json_follows_a_foreign_change(writer: ResultsWriter) -> None:
    reqs = [r for r in requests(keys=KEYS[:2], iters=2) if r.kind == "iteration"]
    writer.apply(reqs[0])
    other = GitRepo(writer.repo.path, sync_worktree=False)
    state = json.loads(other.read(RUN.state_json) or b"")
    state["shapes"]["f16_128x8192x8192"] = dict(state["shapes"][reqs[0].key])
    other.commit({RUN.state_json: json.dumps(state).encode()}, "foreign edit")
    for req in reqs[1:]:
        writer.apply(req)
    after = load_state(writer.repo, GPU, DSL)
    assert after is not None and "f16_128x8192x8192" in after.shapes and reqs[-1].key in after.shapes


def test_refresh_summary_commits_only_when_it_changes(writer: ResultsWriter) -> None:
    for req in requests(iters=3):
        writer.apply(req)
    first = writer.refresh_summary(GPU, DSL)
    assert first is not None and writer.repo.head() == first
    assert writer.refresh_summary(GPU, DSL) is None
    text = (writer.repo.read(RUN.summary_md) or b"").decode()
    assert "3 shapes: 3 active" in text and all(key in text for key in KEYS)
    assert writer.refresh_summary("sm90_unknown", DSL) is None
