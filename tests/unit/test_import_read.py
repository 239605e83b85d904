"""The read half of ``croqq import``: every key form, header form, row oddity, layout and side copy of a
CroqTile-style tree read into the figures written by hand in ``tests/importer_trees.py``; nothing written."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from croqq.domain.manifest import load_manifest
from croqq.errors import ConfigError
from croqq.store.importer.keys import CROQQ_DTYPE, parse_key
from croqq.store.importer.model import SourceLog
from croqq.store.importer.read import read_tree
from croqq.store.importer.summary import summarize
from croqq.store.importer.tsv import parse_results
from tests.importer_trees import GEN1, GPU, LOG_A, LOG_H, A, write_big_log, write_many_shapes, write_tree

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_FIELDS = {
    "source",
    "key",
    "imported_as",
    "rows",
    "measured",
    "best_tflops",
    "best_iter",
    "reference_tflops",
    "decisions",
    "duplicate_ids",
    "problems",
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("croqtile")
    return root, write_tree(root)


@pytest.fixture(scope="module")
def logs(tree: tuple[Path, dict[str, dict[str, Any]]]) -> dict[str, SourceLog]:
    return {log.source: log for log in read_tree(tree[0], gpu=GPU)}


def _tsv(lines: list[str]) -> str:
    return "".join(line.replace("|", "\t") + "\n" for line in lines)


# --- keys ---------------------------------------------------------------------------------------------

KEYS = [
    # raw, model folder, op, dtypes, croqq dtype, (M, N, K), gemm, croqq key
    (
        "matmul_f16_512x16384x16384",
        None,
        "matmul",
        "f16",
        "f16",
        (512, 16384, 16384),
        True,
        "f16_512x16384x16384",
    ),
    (
        "matmul_fp16fp32_4096x4096x4096",
        None,
        "matmul",
        "fp16fp32",
        "f16",
        (4096,) * 3,
        True,
        "f16_4096x4096x4096",
    ),
    (
        "matmul_f16fp32_1024x2048x4096",
        None,
        "matmul",
        "f16fp32",
        "f16",
        (1024, 2048, 4096),
        True,
        "f16_1024x2048x4096",
    ),
    ("matmul_bf16fp32_256x256x256", None, "matmul", "bf16fp32", None, (256,) * 3, True, None),
    (
        "matmul_e4m3_4096x8192x8192",
        None,
        "matmul",
        "e4m3",
        "e4m3",
        (4096, 8192, 8192),
        True,
        "e4m3_4096x8192x8192",
    ),
    ("matmul_e4m3fp16_64x64x64", None, "matmul", "e4m3fp16", "e4m3", (64,) * 3, True, "e4m3_64x64x64"),
    (
        "matmul_e4m3fp16fp32_2048x2048x2048",
        None,
        "matmul",
        "e4m3fp16fp32",
        "e4m3",
        (2048,) * 3,
        True,
        "e4m3_2048x2048x2048",
    ),
    (
        "matmul_e4m3f32_8192x8192x8192",
        None,
        "matmul",
        "e4m3f32",
        "e4m3",
        (8192,) * 3,
        True,
        "e4m3_8192x8192x8192",
    ),
    ("matmul_fp8_128x256x512", None, "matmul", "fp8", "e4m3", (128, 256, 512), True, "e4m3_128x256x512"),
    ("gemm_sp_f16fp32_4096x4096x4096", None, "gemm_sp", "f16fp32", "f16", (4096,) * 3, False, None),
    (
        "blockscale_gemm_e4m3fp16_4096x4096x4096",
        None,
        "blockscale_gemm",
        "e4m3fp16",
        "e4m3",
        (4096,) * 3,
        False,
        None,
    ),
    ("bgemm_bf16fp32_8x1024x1024", None, "bgemm", "bf16fp32", None, (8, 1024, 1024), False, None),
    ("f16_512x16384x16384", None, None, "f16", "f16", (512, 16384, 16384), True, "f16_512x16384x16384"),
    (
        "M8192_N8192_K4096",
        "matmul_f16",
        "matmul",
        "f16",
        "f16",
        (8192, 8192, 4096),
        True,
        "f16_8192x8192x4096",
    ),
    ("m8192n8192k8192", "matmul", "matmul", "", None, (8192,) * 3, True, None),
    (
        "m8192n8192k8192",
        "vendor/matmul_e4m3",
        "matmul",
        "e4m3",
        "e4m3",
        (8192,) * 3,
        True,
        "e4m3_8192x8192x8192",
    ),
    ("m8192n8192k8192", None, None, "", None, (8192,) * 3, False, None),
    ("fused_moe_fp8_128x512x2048_e256k8", None, "fused_moe", "fp8", "e4m3", (128, 512, 2048), False, None),
    ("gdn_f16_B2_T4_H8_K128_V128", None, "gdn", "f16", "f16", (None,) * 3, False, None),
    ("fused_moe_qwen35_fp8", None, "fused_moe_qwen35", "fp8", "e4m3", (None,) * 3, False, None),
]


@pytest.mark.parametrize(("raw", "model", "op", "dtypes", "dtype", "mnk", "gemm", "croqq_key"), KEYS)
def test_every_key_form_reads_into_its_parts(raw, model, op, dtypes, dtype, mnk, gemm, croqq_key):  # type: ignore[no-untyped-def]
    key = parse_key(raw, model)
    assert (key.raw, key.op, key.dtypes, key.dtype) == (raw, op, dtypes, dtype)
    assert ((key.m, key.n, key.k), key.gemm, key.croqq_key) == (mnk, gemm, croqq_key)


def test_key_dtypes_are_dtypes_croqq_tunes_densely() -> None:
    manifest = load_manifest(ROOT / "kernels" / "manifest.json")
    for dtype in set(CROQQ_DTYPE.values()):
        assert manifest.dtypes[dtype].family == "gemm"


# --- results.tsv --------------------------------------------------------------------------------------

HEADERS = [
    "iter|kernel|tflops|decision|bottleneck|idea_summary",
    "iter|kernel|tflops|hw_eff_pct|decision|bottleneck|idea_summary|run_command",
    "round|iter|kernel|tflops|decision|bottleneck|idea_summary",
    "round|iter|kernel|tflops|decision|bottleneck|idea|timestamp",
    "iter|kernel|tflops|decision|bottleneck|idea",
    "iter|tflops|decision|bottleneck|timestamp",
    "iter|kernel|tflops_2k|tflops_4k|decision|bottleneck|idea_summary",
    "# Auto-tune experiment log. Columns: "
    "iter|kernel|arch|tflops|eff%|bottleneck_before|run_command|idea_summary",
    "iter|tflops|time_ms|decision|bottleneck|idea|timestamp",
    "round|iter|kernel|tflops|decision|bottleneck|category|timestamp",
]
ROW_BY_NAME = {
    "iter": "iter007",
    "round": "3",
    "kernel": "srcs/k/iter007.cu",
    "tflops": "123.5",
    "tflops_2k": "123.5",
    "tflops_4k": "200.0",
    "hw_eff_pct": "12.5",
    "decision": "KEEP",
    "bottleneck": "memory",
    "bottleneck_before": "memory",
    "idea_summary": "swizzle",
    "idea": "swizzle",
    "category": "swizzle",
    "run_command": "./run",
    "timestamp": "t0",
    "arch": "sm90",
    "eff%": "12.5",
    "time_ms": "0.5",
}


@pytest.mark.parametrize("header", HEADERS)
def test_every_header_form_reads_its_rows_by_name(header: str) -> None:
    names = header.rsplit("Columns: ", maxsplit=1)[-1].split("|")
    text = _tsv([header, "|".join(ROW_BY_NAME[n] for n in names)])
    found, rows, problems = parse_results(text, shape_hint=(2048, 2048, 2048))
    assert found == header.replace("|", "\t") and problems == []
    (row,) = rows
    assert (row.original_id, row.iteration, row.tflops) == ("iter007", 7, 123.5)
    assert row.decision == ("KEEP" if "decision" in names else None)
    assert row.kernel == ("srcs/k/iter007.cu" if "kernel" in names else "")
    assert row.idea == ("swizzle" if {"idea", "idea_summary", "category"} & set(names) else "")
    assert row.bottleneck == "memory" and not row.reference and row.failure is None


def test_json_first_line_is_a_row_and_later_rows_read_as_the_common_header() -> None:
    first = {"dsl": "cuda", "shape_key": "k", "iter": "iter000", "kernel": "torch", "tflops": 40}
    text = json.dumps(first | {"decision": "BASELINE"}) + "\n"
    text += _tsv(["iter001|srcs/k/a.cu|45.5|KEEP|mem|grouped"])
    header, rows, problems = parse_results(text)
    assert header == "" and problems == []
    assert [(r.original_id, r.tflops, r.decision, r.reference) for r in rows] == [
        ("iter000", 40.0, "BASELINE", True),
        ("iter001", 45.5, "KEEP", False),
    ]
    assert rows[1].idea == "grouped" and rows[1].bottleneck == "mem"


@pytest.mark.parametrize(("hint", "value"), [((1024, 1024, 2048), 1.0), ((4096, 4096, 4096), 2.0)])
def test_sized_tflops_columns_read_the_one_matching_the_shape(hint: tuple[int, ...], value: float) -> None:
    text = _tsv(["iter|tflops_2k|tflops_4k|decision", "iter001|1.0|2.0|KEEP"])
    _, rows, problems = parse_results(text, shape_hint=hint)
    assert [r.tflops for r in rows] == [value] and problems == []


def test_sized_tflops_columns_with_no_match_read_the_first_and_say_so() -> None:
    text = _tsv(["iter|tflops_2k|tflops_4k|decision", "iter001|1.0|2.0|KEEP"])
    _, rows, problems = parse_results(text, shape_hint=(8192, 8192, 8192))
    assert [r.tflops for r in rows] == [1.0]
    assert [(p.line, "read tflops_2k" in p.reason) for p in problems] == [(1, True)]


ODD_ROWS = [
    (
        HEADERS[1],
        "iter004|k.cu|FAIL|COMPILE_FAIL|ptxas|x",
        ("iter004", None, "COMPILE_FAIL", "k.cu", "ptxas", "x"),
    ),
    # header, row, (id, tflops, decision, kernel, bottleneck, idea)
    (
        HEADERS[0],
        "iter003|k.cu|KEEP|255.0|compute|after",
        ("iter003", 255.0, "KEEP", "k.cu", "compute", "after"),
    ),
    (
        HEADERS[1],
        "iter002|k.cu|420.0|42.4|KEEP|compute|tma",
        ("iter002", 420.0, "KEEP", "k.cu", "compute", "tma"),
    ),
    (HEADERS[1], "iter003|420.5|KEEP|compute|x", ("iter003", 420.5, "KEEP", "", "compute", "x")),
    (HEADERS[2], "iter002|k.cu|650.0|KEEP|mem|y", ("iter002", 650.0, "KEEP", "k.cu", "mem", "y")),
    (HEADERS[3], "2|iter502|k.py|720.0|KEEP|mem|z", ("iter502", 720.0, "KEEP", "k.py", "mem", "z")),
    (HEADERS[4], "iter002|130.0|k.cu|KEEP|mem|swap", ("iter002", 130.0, "KEEP", "k.cu", "mem", "swap")),
    (HEADERS[5], "iter002|k.cu|85.0|KEEP|mem|t1", ("iter002", 85.0, "KEEP", "k.cu", "mem", "")),
    (HEADERS[8], "iter002|11.0|0.24|DISCARD|lat|unroll", ("iter002", 11.0, "DISCARD", "", "lat", "unroll")),
    (
        HEADERS[7],
        "iter002|k.cu|sm90|55.0|5.6|mem|./run|tiles|KEEP",
        ("iter002", 55.0, "KEEP", "k.cu", "mem", "tiles"),
    ),
    (HEADERS[7], "iter004|k.cu|sm90|60.0|6.1", ("iter004", 60.0, None, "k.cu", "", "")),
    (
        HEADERS[0],
        " iter014 \t k.cu \t 260.25 \t BEST \t compute \t best ",
        ("iter014", 260.25, "BEST", "k.cu", "compute", "best"),
    ),
    (HEADERS[0], "iter001|k.cu|5.0|KEEP|mem|x|||", ("iter001", 5.0, "KEEP", "k.cu", "mem", "x")),
]


@pytest.mark.parametrize(("header", "row", "want"), ODD_ROWS)
def test_a_row_that_does_not_match_its_header_is_read_around_its_decision(
    header: str, row: str, want: tuple[object, ...]
) -> None:
    text = _tsv([header]) + row.replace("|", "\t")
    _, rows, problems = parse_results(text)
    assert problems == []
    (got,) = rows
    assert (got.original_id, got.tflops, got.decision, got.kernel, got.bottleneck, got.idea) == want


def test_a_header_line_repeated_mid_file_switches_the_column_order() -> None:
    text = _tsv([HEADERS[0], "iter001|k.cu|1.0|KEEP|b|i", HEADERS[5], "iter002|2.0|DISCARD|b2|t2"])
    header, rows, problems = parse_results(text)
    assert header == HEADERS[0].replace("|", "\t") and problems == []
    assert [(r.tflops, r.decision, r.timestamp) for r in rows] == [(1.0, "KEEP", ""), (2.0, "DISCARD", "t2")]


IDS = [
    ("iter012", 12, False),
    ("iter012b", 12, True),
    ("iter001_naive", 1, False),
    ("38", 38, False),
    ("baseline", None, False),
    ("baseline_b", None, True),
]


@pytest.mark.parametrize(("written", "iteration", "rerun"), IDS)
def test_every_id_form_reads_to_its_canonical_iteration(
    written: str, iteration: int | None, rerun: bool
) -> None:
    _, rows, _ = parse_results(_tsv([HEADERS[0], f"{written}|k.cu|1.0|KEEP|b|i"]))
    assert [(r.original_id, r.iteration, r.rerun) for r in rows] == [(written, iteration, rerun)]


def test_failures_references_and_unreadable_rows_of_the_fixture_log() -> None:
    _, rows, problems = parse_results(_tsv(LOG_A))
    by_line = {r.line: r for r in rows}
    failures = {r.original_id: r.failure for r in rows if r.failure}
    assert failures == {
        "iter002": "COMPILE_FAIL",
        "4": "COMPILE_FAIL",
        "iter005": "HANG",
        "iter006": "SEGFAULT",
        "iter007": "HANG",
        "iter008": "RUNTIME_FAIL",
        "iter009": "VERIFY_FAIL",
        "iter010": "LAUNCH_FAIL",
        "iter011": "FAIL",
    }
    assert [r.original_id for r in rows if r.reference] == [
        "iter000",
        "iter000",
        "baseline",
        "baseline_b",
        "iter019",
    ]
    assert [by_line[n].tflops for n in (4, 7, 9, 15, 16)] == [None, 0.0, None, None, None]
    assert {r.line for r in rows}.isdisjoint({1, 18, 20, 28})
    assert [(p.line, p.reason) for p in problems] == [
        (20, "iter016: no readable TFLOPS"),
        (28, "not a row: no iteration id or fields to read"),
    ]


def test_a_row_without_decision_keeps_tflops_fail_as_a_failure() -> None:
    _, rows, problems = parse_results(_tsv(LOG_H))
    assert [(r.original_id, r.decision, r.tflops, r.failure) for r in rows] == [
        ("iter001", None, 50.0, None),
        ("iter002", "KEEP", 55.0, None),
        ("iter003", "FAIL", None, "FAIL"),
        ("iter004", None, 60.0, None),
    ]
    assert problems == []


# --- the tree -----------------------------------------------------------------------------------------


def test_every_log_of_the_tree_is_found_once(tree, logs) -> None:  # type: ignore[no-untyped-def]
    _, expected = tree
    copies = [c for log in logs.values() for c in log.copies]
    assert sorted(logs) == sorted(expected)
    assert len(copies) == len(set(copies)) and not set(copies) & set(logs)


@pytest.mark.parametrize("part", ["summary", "problems", "why", "copies", "sources", "ideas", "checkpoint"])
def test_each_log_gives_its_hand_written_figures(tree, logs, part: str) -> None:  # type: ignore[no-untyped-def]
    _, expected = tree
    for source, want in expected.items():
        log = logs[source]
        summary = summarize(log)
        problems = summary.pop("problems")
        if part == "summary":
            assert summary == want["summary"], source
        elif part == "problems":
            got = sorted(((p["line"], p["reason"]) for p in problems), key=lambda p: (p[0] or 0, p[1]))  # type: ignore[index]
            assert [line for line, _ in got] == [line for line, _ in want["problems"]], source
            assert all(
                frag in reason for (_, reason), (_, frag) in zip(got, want["problems"], strict=True)
            ), (source, got)
        elif part == "why":
            assert (want["why"] in log.why) and bool(log.why) == bool(want["why"]), (source, log.why)
        elif part == "copies":
            assert log.copies == want["copies"], source
        elif part == "sources":
            assert log.sources == want["sources"], source
        elif part == "ideas":
            assert len(log.ideas) == want["ideas"], (source, log.ideas)
        else:
            assert log.checkpoint_source == want["checkpoint_source"], source


def test_logs_carry_gpu_dsl_model_and_the_checkpoint_as_found(logs) -> None:  # type: ignore[no-untyped-def]
    main = logs[f"{GEN1}/logs/{A}/results.tsv"]
    assert (main.gpu, main.dsl, main.model) == ("aitune", "cuda", None)
    assert main.checkpoint is not None and main.checkpoint["best_tflops"] == 260.25
    later = logs["tuning/sm90_H100/triton/logs/matmul_fp8_4096x8192x8192/openai/gpt5/results.tsv"]
    assert (later.gpu, later.dsl, later.model) == ("sm90_H100", "triton", "openai/gpt5")
    archived = logs["tuning/.archive/matmul_f16fp32_2048x4096x8192/logs/claude/results.tsv"]
    assert (archived.gpu, archived.dsl, archived.model) == (GPU, "cuda", "claude")  # dsl: its checkpoint
    ideas = [(n.summary, n.iteration, n.decision) for n in main.ideas]
    assert ("TMA loads", 2, "COMPILE_FAIL") in ideas and ("wgmma 128x256", 3, None) in ideas


def test_summary_holds_exactly_the_report_fields(logs) -> None:  # type: ignore[no-untyped-def]
    for log in logs.values():
        assert set(summarize(log)) == SUMMARY_FIELDS
        assert json.loads(json.dumps(summarize(log))) == summarize(log)


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            out[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return out


def test_reading_writes_nothing_to_the_tree(tmp_path: Path) -> None:
    write_tree(tmp_path)
    before = _snapshot(tmp_path)
    read_tree(tmp_path)
    assert _snapshot(tmp_path) == before


def test_one_shape_folder_or_one_results_file_reads_alone(tree) -> None:  # type: ignore[no-untyped-def]
    root, _ = tree
    folder = root / GEN1 / "logs" / A
    (log,) = read_tree(folder)
    assert (log.source, log.key.croqq_key, log.copies, log.sources) == (
        "results.tsv",
        "f16_512x16384x16384",
        ["results.tsv.orig"],
        {},
    )
    assert summarize(log)["rows"] == 25
    (single,) = read_tree(folder / "results.tsv")
    assert (single.source, len(single.rows), single.copies) == ("results.tsv", 25, [])


@pytest.mark.parametrize("what", ["missing", "empty folder", "other file"])
def test_a_path_that_is_no_tree_is_refused_in_one_line(tmp_path: Path, what: str) -> None:
    path = {"missing": tmp_path / "nope", "empty folder": tmp_path, "other file": tmp_path / "notes.txt"}[
        what
    ]
    if what == "other file":
        path.write_text("hello\n")
    with pytest.raises(ConfigError) as raised:
        read_tree(path)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)


def test_a_file_that_is_not_text_is_a_problem_and_nothing_else(tmp_path: Path) -> None:
    log = tmp_path / "tuning" / "g" / "cuda" / "logs" / "matmul_f16_256x256x256" / "results.tsv"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"iter\ttflops\n\xff\xfe\xfa\n")
    (read,) = read_tree(tmp_path)
    assert (read.rows, read.imported_as) == ([], "skipped")
    assert [(p.line, p.reason) for p in read.problems] == [(None, f"{read.source}: not UTF-8 text, not read")]


def test_a_two_thousand_row_log_reads_every_row(tmp_path: Path) -> None:
    write_big_log(tmp_path, rows=2000)
    (log,) = read_tree(tmp_path)
    figures = summarize(log)
    assert (figures["rows"], figures["measured"], figures["problems"]) == (2000, 2000, [])  # a 0 counts
    assert figures["reference_tflops"] == 600.0 and len(log.sources) == 1999


def _two_gpu_folders(root: Path) -> None:
    for folder in ("aitune", "sm90_H100"):
        log = root / "tuning" / folder / "cuda" / "logs" / "matmul_f16_64x64x64" / "results.tsv"
        log.parent.mkdir(parents=True)
        log.write_text(_tsv(["iter|kernel|tflops|decision", f"iter001|{folder}.cu|1.0|KEEP"]))


def test_logs_of_one_shape_in_two_gpu_folders_are_history_when_imported_for_one_gpu(tmp_path: Path) -> None:
    _two_gpu_folders(tmp_path)
    assert [log.imported_as for log in read_tree(tmp_path)] == ["resumable", "resumable"]
    logs = read_tree(tmp_path, gpu=GPU)
    assert [log.imported_as for log in logs] == ["history", "history"]
    assert all("several logs of one shape" in log.why for log in logs)


def test_a_byte_order_mark_and_an_infinite_number_do_not_spoil_a_log() -> None:
    text = "\ufeff" + _tsv([HEADERS[0], "iter001|k.cu|1e999|KEEP|b|i", "iter002|k.cu|2.0|KEEP|b|i"])
    header, rows, problems = parse_results(text.encode("utf-8").decode("utf-8-sig"))
    assert header.startswith("iter\t") and [r.tflops for r in rows] == [2.0]
    assert [(p.line, p.reason) for p in problems] == [(2, "iter001: no readable TFLOPS")]


def test_a_hundred_shape_tree_reads_every_shape(tmp_path: Path) -> None:
    sources = write_many_shapes(tmp_path, shapes=100, rows=20)
    logs = read_tree(tmp_path, gpu=GPU)
    assert sorted(log.source for log in logs) == sorted(sources)
    assert {(log.imported_as, len(log.rows), log.reference_tflops) for log in logs} == {
        ("resumable", 20, 600.0)
    }


def test_lines_that_are_no_rows_are_problems_never_errors() -> None:
    junk = ["\t\t\t", "KEEP\tDISCARD", "{", "[1, 2]", '{"iter": "nope"}', "iterx9\t1.0\tKEEP", "-\t-\t-"]
    _, rows, problems = parse_results(_tsv([HEADERS[0]]) + "\n".join(junk) + "\n")
    assert rows == []
    assert [p.line for p in problems] == [3, 4, 5, 6, 7, 8]  # the tab-only line 2 is blank
    assert all(p.reason.startswith("not a row") for p in problems)


def test_a_broken_json_companion_is_one_problem_naming_the_file(tmp_path: Path) -> None:
    key, model = "matmul_f16_1024x1024x1024", "claude"
    log = tmp_path / "tuning" / "g" / "cuda" / "logs" / key / model / "results.tsv"
    idea = tmp_path / "tuning" / "g" / "cuda" / "checkpoints" / key / model / "current_idea.json"
    for path, text in ((log, _tsv([HEADERS[0], "iter001|k.cu|1.0|KEEP|b|i"])), (idea, "{not json")):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    (read,) = read_tree(tmp_path)
    where = f"tuning/g/cuda/checkpoints/{key}/{model}/current_idea.json"
    assert [(p.line, p.reason) for p in read.problems] == [(None, f"{where}: not JSON, not read")]
    assert len(read.rows) == 1
