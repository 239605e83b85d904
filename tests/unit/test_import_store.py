"""Storing imported logs: rows become croqq's iterations and attempts with their provenance, sources are
stored self-contained, the shape resumes from its imported best, a re-import adds nothing, a grown log
adds only its new rows, what croqq cannot tune is kept as history, and `croqq validate` passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from croqq.domain.fsm import Phase
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.source import HeaderResolver, read_from
from croqq.proposers.agent.workspace import history_markdown, ideas_markdown
from croqq.settings import Settings
from croqq.store import paths
from croqq.store.gitrepo import GitRepo
from croqq.store.importer.model import IdeaNote, ParsedKey, Row, SourceLog
from croqq.store.importer.store import import_logs
from croqq.store.load import (
    load_attempts,
    load_best_source,
    load_checkpoint,
    load_rounds,
    load_state,
    tried_hashes,
)
from croqq.store.validate import validate_repo
from croqq.store.writer import ResultsWriter
from croqq.work.history import entries_from_repo
from croqq.work.persist import loop_from_checkpoint
from tests.samples import sample_requests

ROOT = Path(__file__).resolve().parents[2]
GPU, DSL = "sm90_NVIDIA_H200", "cuda"
KEY = "f16_1024x1024x1024"
RUN = paths.RunPaths(GPU, DSL)
OFFERED = read_from(HeaderResolver((ROOT / "kernels/cuda",)))  # croqq's headers by name
LOG = "tuning/H100/cuda/logs/matmul_f16fp32_1024x1024x1024/results.tsv"
SRCS = "tuning/H100/cuda/srcs/matmul_f16fp32_1024x1024x1024"
KNOBS = "TILE_M 128, TILE_N 128, TILE_K 64, WARPS_M 2, WARPS_N 2, RASTER 0, SWIZZLE 1, SPLIT_K 1, EPI_VEC 4"
KERNEL = (  # a kernel of croqq's cuda family: every knob macro defined, STAGES varied
    '#include <cuda.h>\n#include "../common/tile.cuh"\n#include "../common/gemm_core.cuh"\n'
    + "".join(f"#define {knob}\n" for knob in KNOBS.split(", "))
    + "#define STAGES %d\n__global__ void k() {}\n"
)
FOREIGN = "// a CroqTile kernel with its own main\nint main() { return 0; }\n"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(ROOT / "kernels" / "manifest.json")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree with two kernels sharing a header (itself including another), and one whose include is
    not in the tree."""
    root = tmp_path / "tree"
    (root / SRCS).mkdir(parents=True)
    common = root / "tuning/H100/cuda/srcs/common"
    common.mkdir()
    (common / "tile.cuh").write_text('#pragma once\n#include "mma.cuh"\n')
    (common / "mma.cuh").write_text("#pragma once\n#define MMA 1\n")
    (common / "gemm_core.cuh").write_text('#pragma once\n#include "mma.cuh"\n')
    (root / SRCS / "v1.cu").write_text(KERNEL % 3)
    (root / SRCS / "v3.cu").write_text(KERNEL % 4)
    (root / SRCS / "broken.cu").write_text('#include "nowhere.cuh"\n#define STAGES 9\n')
    return root


def row(
    line: int, oid: str, decision: str | None, tflops: float | None, kernel: str = "", **kw: object
) -> Row:
    it = int(oid[4:7]) if oid.startswith("iter") else None
    return Row(
        line=line, original_id=oid, iteration=it, decision=decision, tflops=tflops, kernel=kernel, **kw
    )  # type: ignore[arg-type]


ROWS = [
    row(2, "iter000", "BASELINE", 500.0, "cublas", reference=True, idea="cuBLAS reference"),
    row(3, "iter001", "KEEP", 300.0, f"{SRCS}/v1.cu", idea="first tile", bottleneck="memory"),
    row(4, "iter002", "COMPILE_FAIL", 0.0, f"{SRCS}/v2.cu", idea="bad smem", failure="COMPILE_FAIL"),
    row(5, "iter003", "KEEP", 350.0, f"{SRCS}/v3.cu", idea="deeper pipeline", timestamp="2026-01-02T03:04"),
    row(6, "iter003", "TESTED", 340.0, f"{SRCS}/v3.cu", idea="re-run of iter003"),
    row(7, "iter004", "PENDING", None, f"{SRCS}/v4.cu", idea="not run yet"),
    row(8, "iter005", "SEGFAULT", None, f"{SRCS}/v5.cu", idea="wild split-k", failure="SEGFAULT"),
    row(9, "iter006", "KEEP", 999.0, f"{SRCS}/gone.cu", idea="source lost"),
]
SOURCES = {f"{SRCS}/{n}.cu": f"{SRCS}/{n}.cu" for n in ("v1", "v3", "broken")}


def source_log(rows: list[Row] = ROWS, **kw: object) -> SourceLog:
    fields: dict[str, object] = {
        "source": LOG,
        "key": ParsedKey(
            raw="matmul_f16fp32_1024x1024x1024",
            op="matmul",
            dtype="f16",
            dtypes="f16fp32",
            m=1024,
            n=1024,
            k=1024,
            gemm=True,
        ),
        "gpu": "H100",
        "dsl": "cuda",
        "rows": rows,
        "reference_tflops": 500.0,
        "ideas": [IdeaNote(summary="try a persistent kernel", source="logs/idea-log.jsonl", line=1)],
        "sources": SOURCES,
    }
    return SourceLog(**(fields | kw))  # type: ignore[arg-type]


def do_import(repo: GitRepo, tree: Path, manifest: Manifest, logs: list[SourceLog], dry_run: bool = False):  # type: ignore[no-untyped-def]
    return import_logs(repo, logs, tree, GPU, DSL, dry_run, manifest, OFFERED)


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    return GitRepo(tmp_path / "results")


def test_rows_become_iterations_and_attempts_with_their_provenance(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    [out] = do_import(repo, tree, manifest, [source_log()])
    assert (out.imported_as, out.iterations, out.attempts, out.ideas) == ("resumable", 5, 2, 1)
    assert (out.best_tflops, out.best_id) == (350.0, "iter003")  # not the 999 whose source is lost
    rounds = load_rounds(repo, GPU, DSL, KEY)
    assert [r.iteration for r in rounds] == [0, 1, 2, 3, 4]
    assert [r.imported.original_id for r in rounds if r.imported] == [
        "iter000",
        "iter001",
        "iter003",
        "iter003",
        "iter006",
    ]
    assert [r.decision for r in rounds] == ["BASELINE", "KEEP", "KEEP", "DISCARD", "DISCARD"]
    assert [r.imported.decision for r in rounds if r.imported] == [
        "BASELINE",
        "KEEP",
        "KEEP",
        "TESTED",
        "KEEP",
    ]
    assert [r.tflops for r in rounds] == [500.0, 300.0, 350.0, 340.0, 999.0]
    assert rounds[0].measure.vendor_tflops == 500.0 and rounds[1].measure.vendor_tflops is None
    assert rounds[2].timestamp == "2026-01-02T03:04" and rounds[2].imported.line == 5  # type: ignore[union-attr]
    assert rounds[1].bottleneck == "memory" and rounds[2].knobs["STAGES"] == 4 and len(rounds[2].knobs) == 10
    attempts = load_attempts(repo, GPU, DSL, KEY)
    assert [(a.kind, a.after_iter, a.imported.decision) for a in attempts if a.imported] == [
        ("compile", 1, "COMPILE_FAIL"),
        ("run", 3, "SEGFAULT"),
    ]
    assert attempts[0].imported.tflops == 0.0  # type: ignore[union-attr]
    ckpt = load_checkpoint(repo, GPU, DSL, KEY)
    assert ckpt is not None
    # the best is the best non-reference row whose source is in the tree: not cuBLAS, not the lost 999
    assert (ckpt.best_iter, ckpt.best_tflops, ckpt.baseline_tflops) == (2, 350.0, 500.0)
    assert (ckpt.current_iter, ckpt.attempts, ckpt.keeps, ckpt.status) == (4, 2, 2, "active")
    assert ckpt.max_iter == 5 + manifest.mode("from_current_best").max_iter
    state = load_state(repo, GPU, DSL)
    assert state is not None and state.shapes[KEY].best_kernel == ckpt.best_kernel
    assert validate_repo(repo.path, None) == []


def test_sources_are_stored_self_contained_and_a_lost_one_says_so(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    do_import(repo, tree, manifest, [source_log()])
    rounds = load_rounds(repo, GPU, DSL, KEY)
    best = (repo.read(rounds[2].kernel) or b"").decode()
    assert "#define STAGES 4" in best and "#include <cuda.h>" in best
    # a header croqq offers by name is stored under headers/ (with what it includes), the others inlined
    assert best.count('#include "../../../headers/') == 1 and '/gemm_core.cuh"' in best
    assert '// croqq import: begin "tile.cuh"' in best and "#define MMA 1" in best
    assert '// croqq import: "mma.cuh" inlined above' not in best  # mma.cuh is inlined once, in tile.cuh
    lost = (repo.read(rounds[4].kernel) or b"").decode()
    assert "not in the imported tree" in lost and "gone.cu" in lost
    ckpt = load_checkpoint(repo, GPU, DSL, KEY)
    assert ckpt is not None and "#define STAGES 4" in load_best_source(repo, ckpt)
    logical = load_best_source(repo, ckpt)
    assert '#include "gemm_core.cuh"' in logical and '#include "tile.cuh"' not in logical


def test_an_include_the_tree_lacks_makes_the_source_non_compilable_and_never_the_best(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    rows = [*ROWS[:2], row(3, "iter002", "KEEP", 800.0, f"{SRCS}/broken.cu", idea="broken")]
    [out] = do_import(repo, tree, manifest, [source_log(rows)])
    assert any("nowhere.cuh" in p.reason and "not compilable" in p.reason for p in out.problems)
    rounds = load_rounds(repo, GPU, DSL, KEY)
    text = (repo.read(rounds[2].kernel) or b"").decode()
    assert '// croqq import: unresolved #include "nowhere.cuh"' in text
    ckpt = load_checkpoint(repo, GPU, DSL, KEY)
    assert ckpt is not None and (ckpt.best_iter, ckpt.best_tflops) == (1, 300.0)
    assert validate_repo(repo.path, None) == []


def test_a_kernel_of_another_family_is_stored_but_never_a_best_to_resume_from(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    (tree / SRCS / "own_main.cu").write_text(FOREIGN)
    rows = [*ROWS[:2], row(3, "iter002", "KEEP", 800.0, f"{SRCS}/own_main.cu", idea="self-timed")]
    sources = {**SOURCES, f"{SRCS}/own_main.cu": f"{SRCS}/own_main.cu"}
    [out] = do_import(repo, tree, manifest, [source_log(rows, sources=sources)])
    assert [p.line for p in out.problems if "not a kernel of croqq's cuda family" in p.reason] == [3]
    rounds = load_rounds(repo, GPU, DSL, KEY)
    assert (rounds[2].decision, (repo.read(rounds[2].kernel) or b"").decode()) == ("DISCARD", FOREIGN)
    ckpt = load_checkpoint(repo, GPU, DSL, KEY)
    assert ckpt is not None and (ckpt.best_iter, ckpt.best_tflops) == (1, 300.0)
    only_foreign = [ROWS[0], row(3, "iter001", "KEEP", 800.0, f"{SRCS}/own_main.cu")]
    [history] = do_import(repo, tree, manifest, [source_log(only_foreign, sources=sources, source="b.tsv")])
    assert history.imported_as == "history" and "to resume from" in history.why


def test_a_row_with_no_measurement_is_a_problem_and_the_rest_is_imported(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    rows = [*ROWS[:2], row(3, "iter002", "DISCARD", float("nan"), f"{SRCS}/v3.cu"), ROWS[3]]
    [out] = do_import(repo, tree, manifest, [source_log(rows)])
    assert [(p.line, p.reason) for p in out.problems] == [(3, "TFLOPS nan is not a measurement; not stored")]
    assert [r.imported.line for r in load_rounds(repo, GPU, DSL, KEY) if r.imported] == [2, 3, 5]
    assert validate_repo(repo.path, None) == []


def test_importing_the_same_tree_twice_adds_nothing(repo: GitRepo, tree: Path, manifest: Manifest) -> None:
    do_import(repo, tree, manifest, [source_log()])
    head = repo.head()
    [out] = do_import(repo, tree, manifest, [source_log()])
    assert (out.iterations, out.attempts, out.ideas, out.commit) == (0, 0, 0, None)
    assert repo.head() == head


def test_a_grown_log_adds_only_its_new_rows_after_the_stored_ones(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    do_import(repo, tree, manifest, [source_log(ROWS[:4])])
    assert load_checkpoint(repo, GPU, DSL, KEY).current_iter == 2  # type: ignore[union-attr]
    [out] = do_import(repo, tree, manifest, [source_log()])
    assert (out.iterations, out.attempts) == (2, 1)
    rounds = load_rounds(repo, GPU, DSL, KEY)
    assert [(r.iteration, r.imported.line) for r in rounds if r.imported] == [
        (0, 2),
        (1, 3),
        (2, 5),
        (3, 6),
        (4, 9),
    ]
    assert validate_repo(repo.path, None) == []


def test_dry_run_writes_nothing(repo: GitRepo, tree: Path, manifest: Manifest) -> None:
    head = repo.head()
    [out] = do_import(repo, tree, manifest, [source_log()], dry_run=True)
    assert (out.iterations, out.attempts, out.commit) == (5, 2, None)
    assert repo.head() == head and load_checkpoint(repo, GPU, DSL, KEY) is None


def test_a_shape_croqq_already_has_is_refused_with_one_problem(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    writer = ResultsWriter(repo)
    for req in sample_requests(GPU, DSL, [KEY], 3, 7, max_iter=30):
        writer.apply(req)
    head = repo.head()
    [out] = do_import(repo, tree, manifest, [source_log()])
    assert out.imported_as == "skipped" and len(out.problems) == 1
    assert "already has f16_1024x1024x1024" in out.problems[0].reason
    assert repo.head() == head


def test_what_croqq_cannot_tune_is_kept_as_history_that_validates(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    moe = source_log(
        source="tuning/H100/cuda/logs/fused_moe_fp8_128x512x2048_e256k8/results.tsv",
        key=ParsedKey(raw="fused_moe_fp8_128x512x2048_e256k8", op="fused_moe", dtypes="fp8"),
        imported_as="history",
        why="not a GEMM croqq tunes",
    )
    no_src = source_log(
        sources={}, source="tuning/H100/cuda/logs/matmul_f16fp32_1024x1024x1024/b/results.tsv"
    )
    outs = do_import(repo, tree, manifest, [moe, no_src])
    assert [o.imported_as for o in outs] == ["history", "history"]
    assert outs[0].why == "not a GEMM croqq tunes"
    assert outs[1].why == "no measured kernel of croqq's cuda family in the tree to resume from"
    assert outs[0].history is not None and repo.exists(outs[0].history)
    assert outs[0].history_rows == len(ROWS)
    assert load_checkpoint(repo, GPU, DSL, KEY) is None
    assert validate_repo(repo.path, None) == []
    head = repo.head()
    assert all(o.commit is None for o in do_import(repo, tree, manifest, [moe, no_src]))
    assert repo.head() == head


def test_an_imported_shape_resumes_after_its_imported_iterations_with_its_ideas(
    repo: GitRepo, tree: Path, manifest: Manifest
) -> None:
    do_import(repo, tree, manifest, [source_log()])
    ckpt = load_checkpoint(repo, GPU, DSL, KEY)
    assert ckpt is not None
    loop = loop_from_checkpoint(ckpt, Settings(), 30, load_best_source(repo, ckpt))
    assert loop.phase == Phase.PROFILE and loop.current_iter == 4  # the next iteration is 5
    assert loop.best_tflops == 350.0 and "#define STAGES 4" in loop.best_source
    entries = entries_from_repo(load_rounds(repo, GPU, DSL, KEY), load_attempts(repo, GPU, DSL, KEY))
    history = history_markdown(KEY, sorted(entries, key=lambda e: e.order))
    assert "| 002 | KEEP | 350.00 |" in history and "wild split-k" in history
    assert "deeper pipeline" in ideas_markdown(entries)
    hashes = tried_hashes(repo, GPU, DSL, KEY)
    assert len(hashes) >= 5  # every imported kernel and the idea note


# -- the command ------------------------------------------------------------------------------------

CLI_KEY = "matmul_f16fp32_1024x1024x1024"
TSV = f"""iter\tkernel\ttflops\tdecision\tbottleneck\tidea_summary
iter000\tcublas\t500.0\tBASELINE\t-\tcuBLAS reference
iter001\tsrcs/{CLI_KEY}/v1.cu\t300.0\tKEEP\tmemory\tfirst tile
iter002\tsrcs/{CLI_KEY}/v2.cu\t0\tCOMPILE_FAIL\tptxas error\tbad smem
iter003\tsrcs/{CLI_KEY}/v3.cu\t350.0\tKEEP\tcompute\tdeeper pipeline
"""


def cli_tree(tmp_path: Path) -> Path:
    root = tmp_path / "team"
    run = root / "tuning/sm90_H100/cuda"
    (run / "logs" / CLI_KEY).mkdir(parents=True)
    (run / "logs" / CLI_KEY / "results.tsv").write_text(TSV)
    (run / "srcs" / CLI_KEY).mkdir(parents=True)
    (run / "srcs/common").mkdir()
    (run / "srcs/common/tile.cuh").write_text('#pragma once\n#include "mma.cuh"\n')
    (run / "srcs/common/mma.cuh").write_text("#pragma once\n")
    (run / "srcs/common/gemm_core.cuh").write_text("#pragma once\n")
    for name, stages in (("v1", 3), ("v3", 4)):
        (run / "srcs" / CLI_KEY / f"{name}.cu").write_text(KERNEL % stages)
    gdn = run / "logs/gdn_f16_B2_T4_H8_K128_V128"
    gdn.mkdir()
    (gdn / "results.tsv").write_text(
        "iter\tkernel\ttflops\tdecision\tbottleneck\tidea_summary\niter001\tk.cu\t12.5\tKEEP\t-\tx\n"
    )
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_croqq_import_reports_each_log_writes_once_and_never_touches_the_tree(
    cluster_env: dict[str, str],
    tmp_path: Path,
    croqq,  # type: ignore[no-untyped-def]
) -> None:
    import json

    src = cli_tree(tmp_path)
    before = snapshot(src)
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    args = ("import", str(src), "--into", str(repo), "--gpu", GPU, "--json")
    dry = croqq(cluster_env, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not repo.exists()
    first = croqq(cluster_env, *args)
    assert first.returncode == 0, first.stderr
    objs = {o["source"].split("/")[-2]: o for o in json.loads(first.stdout)}
    mm = objs[CLI_KEY]
    assert (mm["key"], mm["imported_as"], mm["rows"], mm["reference_tflops"]) == (KEY, "resumable", 4, 500.0)
    assert (mm["written"]["iterations"], mm["written"]["attempts"]) == (3, 1)
    gdn = objs["gdn_f16_B2_T4_H8_K128_V128"]
    assert (gdn["imported_as"], gdn["written"]["history_rows"]) == ("history", 1)
    valid = croqq(cluster_env, "validate", "--dsl", "cuda", "--repo", str(repo))
    assert valid.returncode == 0, valid.stdout
    again = croqq(cluster_env, *args)
    assert all(o["written"]["commit"] is None for o in json.loads(again.stdout))
    table = croqq(cluster_env, *args[:-1])
    assert table.returncode == 0 and "imported 2 log(s): 1 resumable, 1 history, 0 skipped" in table.stdout
    out = tmp_path / "report"
    report = croqq(cluster_env, "report", "--repo", str(repo), "--out", str(out))
    assert report.returncode == 0, report.stderr
    html = (out / "index.html").read_text()
    assert 'id="imported"' in html and "gdn_f16_B2_T4_H8_K128_V128" in html  # the history log
    assert f"<td>{KEY}</td>" in html  # the resumable shape, with its imported iterations
    assert snapshot(src) == before


def test_croqq_import_of_a_missing_tree_is_one_line_exit_2(
    cluster_env: dict[str, str],
    tmp_path: Path,
    croqq,  # type: ignore[no-untyped-def]
) -> None:
    result = croqq(cluster_env, "import", str(tmp_path / "nope"), "--gpu", GPU)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"croqq: error: {tmp_path / 'nope'}: no such file or folder to import"
    ]


def test_croqq_import_refuses_while_a_writer_runs_and_writes_nothing(
    cluster_env: dict[str, str],
    tmp_path: Path,
    redis_client,
    croqq,  # type: ignore[no-untyped-def]
) -> None:
    from croqq.delivery.leases import Lease

    writer = Lease(redis_client, "writer", "a-running-writer", 60.0)
    writer.acquire(wait_s=0, what="the writer lock")
    repo = tmp_path / "results"
    result = croqq(cluster_env, "import", str(cli_tree(tmp_path)), "--into", str(repo), "--gpu", GPU)
    assert result.returncode != 0 and "stop it before `croqq import`" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not repo.exists()
