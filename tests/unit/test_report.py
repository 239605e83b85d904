"""`croqq report`: what it reads from a results repo made by the real writer, the page a person opens in
a browser (every image loaded, every section there, nothing fetched), and bad input refused in one line
with nothing half-written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pygit2
import pytest

from benchmarks import report_bench
from croqq.domain.manifest import load_manifest
from croqq.report import duty, sweeps
from croqq.report.model import Busy, Selection, open_repo, read_repo, select_runs
from croqq.settings import PROJECT_ROOT
from croqq.store.gitrepo import GitRepo
from croqq.store.schema import StoreRequest, SubmissionRecord
from croqq.store.writer import ResultsWriter
from tests.browser import browser  # noqa: F401
from tests.output import error_line
from tests.samples import schedule_keys

ROOT = Path(__file__).resolve().parents[2]
KEYS = schedule_keys()[:6]
SECTIONS = {"header", "summary", "sweeps", "shapes", "outcomes", "duty", "table"}


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StoreRequest]]:
    """Six shapes through the real writer: four complete (8 iterations), two active (3 of 30), with
    KEEP, DISCARD and FAIL iterations and compile-failed attempts."""
    path = tmp_path_factory.mktemp("report") / "results"
    reqs = report_bench.requests(KEYS[:4], 8, seed=11) + report_bench.requests(
        KEYS[4:], 3, seed=3, max_iter=30
    )
    decisions = {r.round.decision.split("_")[0] for r in reqs if r.round is not None}
    assert {"BASELINE", "KEEP", "DISCARD", "FAIL"} <= decisions and any(r.kind == "attempt" for r in reqs)
    report_bench.write(path, reqs)
    return path, reqs


def croqq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "croqq", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def report(stored: tuple[Path, list[StoreRequest]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "report"
    result = croqq("report", "--repo", str(stored[0]), "--out", str(out), "--key", KEYS[5], "--top", "2")
    assert result.returncode == 0, result.stderr
    # without a terminal, progress comes as plain lines (one per 5 s: a slow machine prints some), never
    # a redrawn bar; a library may add a line of its own (matplotlib building its font cache)
    assert "\r" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert f"wrote {out / 'index.html'} (6 shapes" in result.stdout
    return out / "index.html"


def test_model_holds_every_stored_iteration_attempt_and_gpu_interval(
    stored: tuple[Path, list[StoreRequest]],
) -> None:
    path, reqs = stored
    repo = open_repo(path, "main")
    sel = Selection()
    data = read_repo(repo, select_runs(repo, sel), sel)
    shapes = {s.key: s for s in data.shapes()}
    assert set(shapes) == set(KEYS) and data.commit == repo.head()
    for key, shape in shapes.items():
        rounds = [r.round for r in reqs if r.key == key and r.round is not None]
        assert [(p.iteration, p.tflops, p.decision) for p in shape.points] == [
            (r.iteration, r.tflops, r.decision) for r in rounds
        ]
        assert shape.vendor_tflops == rounds[0].measure.vendor_tflops is not None
        assert sum(shape.attempts.values()) == sum(r.kind == "attempt" for r in reqs if r.key == key)
        assert len(shape.busy) == len(rounds) + sum(r.profile is not None for r in rounds)
    assert {s.status for s in shapes.values()} == {"done", "active"}


def test_sweep_lines_follow_the_manifest_patterns_tied_positions_included() -> None:
    lines = sweeps.sweep_lines(load_manifest(PROJECT_ROOT / "kernels" / "manifest.json"))
    by_label = {(ln.scenario, ln.label): ln for ln in lines}
    square = by_label[("square", "(S, S, S)")]
    assert square.var == "S" and square.dims(512) == (512, 512, 512)
    tied = by_label[("sweep_mn", "(T, T, 4096)")]
    assert tied.var == "T" and tied.dims(1024) == (1024, 1024, 4096)
    assert by_label[("sweep_m", "(S, 8192, 8192)")].dims(128) == (128, 8192, 8192)
    assert len(lines) == 16  # 4 one-pattern scenarios + 3 x 4 tied or single-variable patterns


def test_duty_is_the_busy_fraction_of_each_bin_per_gpu() -> None:
    busy = [Busy("a", 0.0, 5.0), Busy("a", 7.5, 2.5), Busy("b", 0.0, 10.0)]
    d = duty.duty(busy, bins=2)
    assert d is not None and d.gpus == ["a", "b"]
    assert d.fractions == [[1.0, 0.5], [1.0, 1.0]] and d.mean(0) == 0.75
    assert duty.duty([]) is None


def test_report_page_is_self_contained_with_every_section(report: Path) -> None:
    html = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched
    assert "<script" not in html and "<link" not in html
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert ids >= SECTIONS
    assert f"shape-sm90_NVIDIA_H200-cuda-{KEYS[5]}" in ids  # the --key shape, besides the top 2
    assert sum(i.startswith("shape-") for i in ids) == 3
    assert {"outcomes-mix", "duty-heatmap"} <= ids and any(i.startswith("sweep-") for i in ids)


def test_report_opens_in_a_browser_with_every_image_loaded(
    report: Path,
    browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    browser.open(report.as_uri())
    images = browser.images()
    assert images and all(img["ok"] for img in images), [img for img in images if not img["ok"]]
    assert all(img["src"].startswith("data:image/png;base64,") for img in images)
    assert browser.ids() >= SECTIONS
    assert "Scenario sweeps" in browser.text()
    shot = browser.screenshot(tmp_path / "report.png")
    assert shot.stat().st_size > 10_000


def test_duty_plot_is_omitted_with_a_note_for_records_without_gpu_intervals(tmp_path: Path) -> None:
    reqs = report_bench.requests(KEYS[:2], 3, seed=2)
    old = [
        r.model_copy(
            update={
                "round": r.round.model_copy(
                    update={
                        "measure": r.round.measure.model_copy(update={"gpu_started_at": None}),
                        "profile": None,
                    }
                )
            }
        )
        if r.round is not None
        else r
        for r in reqs
    ]
    report_bench.write(tmp_path / "results", old)
    result = croqq("report", "--repo", str(tmp_path / "results"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "out" / "index.html").read_text()
    assert "duty-heatmap" not in html and "Not drawn: this repo&#x27;s records carry no GPU step" in html


def test_a_new_report_replaces_the_old_one_and_leaves_no_temporary_folder(
    stored: tuple[Path, list[StoreRequest]], tmp_path: Path
) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").write_text("old report")
    result = croqq("report", "--repo", str(stored[0]), "--out", str(out), "--top", "0", "--dtype", "e4m3")
    assert result.returncode == 0, result.stderr
    html = (out / "index.html").read_text()
    assert "--dtype e4m3" in html and 'id="shape-' not in html and "f16_" not in html
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def _git_repo_without_tuning(path: Path) -> Path:
    repo = pygit2.init_repository(str(path), initial_head="main")
    sig = pygit2.Signature("t", "t@localhost")
    (path / "README").write_text("not results\n")
    repo.index.add("README")
    repo.index.write()
    repo.create_commit("refs/heads/main", sig, sig, "init", repo.index.write_tree(), [])
    return path


def _empty_results_repo(path: Path) -> Path:
    """A repo the writer made that recorded a submission but stored no iteration yet."""
    from croqq.domain.manifest import load_manifest
    from croqq.domain.schedule import build_schedule

    shapes = build_schedule(load_manifest(PROJECT_ROOT / "kernels" / "manifest.json"), "f16")[:2]
    rec = SubmissionRecord(
        submission="s1",
        gpu_type=report_bench.GPU,
        dsl="cuda",
        mode="from_current_best",
        max_iter=30,
        shapes=shapes,
        timestamp="2026-01-05T09:00:00+00:00",
    )
    writer = ResultsWriter(GitRepo(path, sync_worktree=False, fsync=False))
    writer.record_submissions([rec])
    writer.close()
    return path


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("missing folder", 2, "not a results repo (no such folder"),
        ("plain folder", 2, "not a results repo (not a git repository)"),
        ("git repo without tuning/", 2, "not a results repo (no tuning/ folder on branch main)"),
        ("empty results repo", 1, "no stored iteration yet; nothing to report"),
        (
            "unknown key",
            2,
            "--key 'f16_4096x8192x8193': no such shape in the repo (did you mean f16_4096x8192x8192",
        ),
        ("unknown dtype", 2, "--dtype 'fp8': unknown dtype; the manifest has f16|e4m3|f16sp"),
        ("dtype with nothing stored", 1, "no stored iteration for dtype f16sp yet"),
        ("unknown gpu", 2, "--gpu 'sm80_A100': not in this repo (it has sm90_NVIDIA_H200)"),
        ("unwritable out", 2, "cannot write in"),
        ("out holds other files", 2, "holds files other than a croqq report"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_report(
    stored: tuple[Path, list[StoreRequest]], tmp_path: Path, case: str, code: int, message: str
) -> None:
    repo, out, args = stored[0], tmp_path / "out" / "report", []
    (tmp_path / "out").mkdir()
    if case == "missing folder":
        repo = tmp_path / "nowhere"
    elif case == "plain folder":
        repo = tmp_path / "plain"
        repo.mkdir()
    elif case == "git repo without tuning/":
        repo = _git_repo_without_tuning(tmp_path / "git")
    elif case == "empty results repo":
        repo = _empty_results_repo(tmp_path / "empty")
    elif case == "unknown key":
        args = ["--key", "f16_4096x8192x8193"]
    elif case == "unknown dtype":
        args = ["--dtype", "fp8"]
    elif case == "dtype with nothing stored":
        args = ["--dtype", "f16sp"]
    elif case == "unknown gpu":
        args = ["--gpu", "sm80_A100"]
    elif case == "unwritable out":
        out = Path("/proc/self/croqq-report")  # not writable, even for root
    elif case == "out holds other files":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    result = croqq("report", "--repo", str(repo), "--out", str(out), *args)
    assert result.returncode == code, result.stderr
    assert message in error_line(result.stderr), result.stderr
    if case == "out holds other files":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    elif case != "unwritable out":
        assert not out.exists() and list((tmp_path / "out").iterdir()) == []


def test_a_failure_while_drawing_leaves_the_old_report_intact(
    stored: tuple[Path, list[StoreRequest]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from croqq.report import build, plots

    def broken(*_: object) -> str:
        raise RuntimeError("disk full while drawing")

    monkeypatch.setattr(plots, "outcome_figure", broken)
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").write_text("old report")
    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    with pytest.raises(RuntimeError, match="disk full"):
        build.build(build.Options(repo=stored[0], out=out, branch="main", manifest=manifest))
    assert (out / "index.html").read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
