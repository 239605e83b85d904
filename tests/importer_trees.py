"""A CroqTile-style tuning tree covering every header form, row oddity, id form, decision token, key form,
layout and side copy that ``croqq import`` reads, with the figures each of its logs must give.

``write_tree(root)`` returns ``{source: expected}`` where ``source`` is the log's path relative to ``root``
and ``expected`` holds the report figures (``summary``, without ``problems``), the problems as
``(line, fragment of the reason)``, and what else the reader attaches. The figures are written by hand
from the rows below, never computed by the code under test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

GPU = "sm90_NVIDIA_H100_80GB_HBM3"  # the --gpu given for logs whose path names no GPU

A = "matmul_f16_512x16384x16384"
B = "matmul_fp16fp32_4096x4096x4096"
C = "matmul_e4m3fp16fp32_2048x2048x2048"
D = "f16_1024x1024x1024"
E = "fused_moe_fp8_128x512x2048_e256k8"
F = "gdn_f16_B2_T4_H8_K128_V128"
G = "fused_moe_qwen35_fp8"
H = "matmul_bf16fp32_256x256x256"
I = "gemm_sp_f16fp32_4096x4096x4096"  # noqa: E741
J = "blockscale_gemm_e4m3fp16_4096x4096x4096"
K = "bgemm_bf16fp32_8x1024x1024"
L = "matmul_e4m3f32_8192x8192x8192"
P = "matmul_fp8_4096x8192x8192"
R = "matmul_f16fp32_2048x4096x8192"
GEN1 = "tuning/aitune/cuda"
LATER = "tuning/sm90_H100/triton"
ARCHIVE = "tuning/.archive"

HEADER_1 = "iter|kernel|tflops|decision|bottleneck|idea_summary"
LOG_A = [
    HEADER_1,
    "iter000|cublas|600.0|BASELINE|-|vendor baseline",
    f"iter001_naive|srcs/{A}/iter001.cu|100.5|KEEP|memory|naive tiling",
    f"iter002|srcs/{A}/iter002.cu|FAIL|COMPILE_FAIL|ptxas error|try TMA",
    f"iter003|srcs/{A}/iter003.cu|250.0|KEEP|compute|wgmma 128x256",
    f"iter003b|srcs/{A}/iter003.cu|251.5|TESTED|compute|re-run of iter003",
    f"4|srcs/{A}/iter004.cu|0|DISCARD|compile error: too many registers|bigger tile",
    f"iter005|srcs/{A}/iter005.cu|0|DISCARD|hang at launch|persistent kernel",
    f"iter006|srcs/{A}/iter006.cu||SEGFAULT|illegal address|split-k",
    f"iter007|srcs/{A}/iter007.cu|FAIL|HANG|timeout|stream-k",
    f"iter008|srcs/{A}/iter008.cu|0|RUNTIME_FAIL|cuda error|swizzle",
    f"iter009|srcs/{A}/iter009.cu|0|VERIFY_FAIL|wrong result|fp16 accumulate",
    f"iter010|srcs/{A}/iter010.cu||LAUNCH_FAIL|too much smem|stages 6",
    f"iter011|srcs/{A}/iter011.cu|FAIL|FAIL|unknown|cluster 2x1",
    f"iter012|srcs/{A}/iter012.cu||PENDING||queued idea",
    f"iter013|srcs/{A}/iter013.cu||DRAFT||draft idea",
    f"  iter014  |  {GEN1}/srcs/{A}/iter014.cu  | 260.25 |  BEST  | compute | best so far ",
    HEADER_1,  # 18: the header again, mid-file
    f"iter015|srcs/{A}/iter015.cu|KEEP|255.0|compute|tflops after the decision",
    f"iter016|srcs/{A}/iter016.cu||KEEP|compute|lost number",  # 20: refused
    "iter000|cublas|601.0|BASELINE|-|vendor baseline again",
    "baseline|cublas_gemmex|599.0|REFERENCE|-|cublasGemmEx",
    "baseline_b|cublas_gemmex|598.0|REFERENCE|-|cublasGemmEx re-run",
    "iter017|../escape.cu|90.0|DISCARD|-|a path leaving the tree",  # 24
    "iter018|/etc/passwd|91.0|DISCARD|-|an absolute path",  # 25
    "iter019|triton_ref.py|300.0|KEEP|-|the triton reference",
    f"iter020|srcs/{A}/iter020.cu|200.0||-|no decision",
    "this is not a row",  # 28
    f"iter021|srcs/{A}/iter021.cu|210.0|KEEP|memory|compared with torch.compile",
]
LOG_B = [
    "iter|kernel|tflops|hw_eff_pct|decision|bottleneck|idea_summary|run_command",
    "iter000|cublas|700.0|70.7|BASELINE|-|cuBLAS|./run --ref",
    f"iter001|srcs/{B}/iter001.cu|350.0|35.4|KEEP|memory|naive|./run 1",
    f"iter002|srcs/{B}/iter002.cu|420.0|42.4|KEEP|compute|tma",  # run_command dropped
    "iter003|420.5|KEEP|compute|kernel and efficiency dropped",
    f"iter004|srcs/{B}/iter004.cu|COMPILE_FAIL|ptxas|bad unroll|./run 4",  # TFLOPS dropped
]
LOG_B_ORIG = [LOG_B[0], f"iter001|srcs/{B}/iter001_old.cu|340.0|34.3|KEEP|memory|older naive|./run 1"]
LOG_C = [
    "iter|kernel|tflops_2k|tflops_4k|decision|bottleneck|idea_summary",
    "iter000|cublas|500.0|800.0|BASELINE|-|ref",
    f"iter001|srcs/{C}/iter001.cu|300.0|450.0|KEEP|mem|naive",
    f"iter002|srcs/{C}/iter002.cu|320.0|470.0|DISCARD|mem|tile",
]
LOG_D = [
    "iter|kernel|tflops|decision|bottleneck|idea",
    "iter000|torch_matmul|150.0|REFERENCE|-|torch",
    f"iter001|srcs/{D}/iter001.cu|120.0|KEEP|mem|naive",
    f"iter002|130.0|srcs/{D}/iter002.cu|KEEP|mem|columns swapped",  # another column order
    f"iter003|srcs/{D}/iter003.cu|KEEP|135.0|mem|tflops after the decision",
]
LOG_E = [
    "iter|tflops|decision|bottleneck|timestamp",
    "iter001|80.0|KEEP|mem|2025-01-01T00:00",
    f"iter002|srcs/{E}/iter002.cu|85.0|KEEP|mem|2025-01-02T00:00",  # a kernel column added
]
LOG_F = [
    "iter|tflops|time_ms|decision|bottleneck|idea|timestamp",
    "iter001|10.5|0.25|KEEP|latency|chunked scan|2025-01-01",
    "iter002|11.0|0.24|DISCARD|latency|unroll",  # timestamp dropped
]
LOG_G = [
    json.dumps(
        {
            "dsl": "cuda",
            "shape_key": G,
            "iter": "iter000",
            "kernel": "torch_moe",
            "tflops": 40.0,
            "decision": "BASELINE",
        }
    ),
    f"iter001|srcs/{G}/iter001.cu|45.5|KEEP|mem|grouped gemm",
    f"iter002|srcs/{G}/iter002.cu|0|HANG|timeout|bigger tiles",
]
HEADER_8 = (
    "# Auto-tune experiment log. Columns: "
    "iter|kernel|arch|tflops|eff%|bottleneck_before|run_command|idea_summary"
)
LOG_H = [
    HEADER_8,
    f"iter001|srcs/{H}/iter001.cu|sm90|50.0|5.1|memory|./run|naive",
    f"iter002|srcs/{H}/iter002.cu|sm90|55.0|5.6|memory|./run|tiles|KEEP",
    f"iter003|srcs/{H}/iter003.cu|sm90|FAIL",
    f"iter004|srcs/{H}/iter004.cu|sm90|60.0|6.1",
]
LOG_I = [HEADER_1, "iter001|k1.cu|500.0|KEEP|mem|2:4 sparse", "iter002|k2.cu|520.0|KEEP|mem|metadata"]
LOG_J = [HEADER_1, "iter001|k1.cu|900.0|KEEP|mem|block scales"]
LOG_K = [HEADER_1, "iter001|k1.cu|100.0|KEEP|mem|batched"]
LOG_L = [
    "round|iter|kernel|tflops|decision|bottleneck|idea_summary",
    "1|iter000|cublas|1200.0|BASELINE|-|ref",
    f"1|iter001|srcs/{L}/iter001.cu|600.0|KEEP|mem|naive",
    f"iter002|srcs/{L}/iter002.cu|650.0|KEEP|mem|round dropped",
    f"2|38|srcs/{L}/iter038.cu|700.0|DISCARD|mem|bare integer id",
]
LOG_P = [
    "round|iter|kernel|tflops|decision|bottleneck|idea|timestamp",
    f"1|iter501|srcs/{P}/a501.py|700.0|KEEP|mem|first run|t1",
    f"1|iter502|srcs/{P}/a502.py|710.0|DISCARD|mem|first run|t2",
    f"2|iter501|srcs/{P}/b501.py|705.0|KEEP|mem|restart|t3",
    f"2|iter502|srcs/{P}/b502.py|720.0|KEEP|mem|restart",  # timestamp dropped
    f"3|iter501|srcs/{P}/c501.py|702.0|TESTED|mem|again|t5",
    f"3|iter502|srcs/{P}/c502.py|0|COMPILE_FAIL|nvcc|again|t6",
]
LOG_Q = [
    "round|iter|kernel|tflops|decision|bottleneck|category|timestamp",
    f"1|iter001|srcs/{P}/q001.py|650.0|KEEP|mem|tiling|t1",
    f"1|iter002|srcs/{P}/q002.py|660.0|KEEP|mem|pipelining|t2",
]
LOG_R = [
    HEADER_1,
    "iter000|cublas|550.0|BASELINE|-|ref",
    f"iter001|srcs/{R}/iter001.cu|300.0|KEEP|mem|naive",
    f"iter002|srcs/{R}/iter002.cu|310.0|KEEP|mem|tile",
]
LOG_S = [HEADER_1, "iter001|k1|400.0|KEEP|mem|naive"]
LOG_T = [HEADER_1, "iter001|k1|410.0|KEEP|mem|naive"]

# a kernel of croqq's cuda family (every knob macro defined, values in its space): a best to resume from
CROQQ_MACROS = "GEMM_M 512, GEMM_N 16384, GEMM_K 16384, TILE_M 128, TILE_N 128, TILE_K 64, STAGES 4, " + (
    "WARPS_M 2, WARPS_N 2, RASTER 0, SWIZZLE 1, SPLIT_K 1, EPI_VEC 4"
)
CROQQ_KERNEL = "".join(f"#define {m}\n" for m in CROQQ_MACROS.split(", ")) + '#include "gemm_f16.cuh"\n'
KERNEL_WITH_INCLUDES = '#include "common.h"\n#include "missing.h"\n__global__ void k() {}\n'


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _tsv(lines: list[str]) -> str:
    return "".join(line.replace("|", "\t") + "\n" for line in lines)


def _jsonl(items: list[object]) -> str:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items)


def _summary(source: str, key: str | None, imported_as: str, **figures: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "source": source,
        "key": key,
        "imported_as": imported_as,
        "rows": 0,
        "measured": 0,
        "best_tflops": None,
        "best_iter": None,
        "reference_tflops": None,
        "decisions": {},
        "duplicate_ids": [],
    }
    base.update(figures)
    return base


def _expect(
    source: str,
    key: str | None,
    imported_as: str,
    *,
    problems: Sequence[tuple[int | None, str]] | None = None,
    why: str = "",
    copies: list[str] | None = None,
    sources: dict[str, str] | None = None,
    ideas: int = 0,
    checkpoint: str | None = None,
    **figures: Any,
) -> dict[str, Any]:
    return {
        "summary": _summary(source, key, imported_as, **figures),
        "problems": sorted(problems or [], key=lambda p: (p[0] or 0, p[1])),
        "why": why,
        "copies": copies or [],
        "sources": sources or {},
        "ideas": ideas,
        "checkpoint_source": checkpoint,
    }


def write_tree(root: Path) -> dict[str, dict[str, Any]]:
    """Write the tree under ``root`` (``root/tuning/...``); return the expected figures per log."""
    expected: dict[str, dict[str, Any]] = {}
    expected.update(_gen1(root))
    expected.update(_later(root))
    expected.update(_archive(root))
    return expected


def _gen1(root: Path) -> dict[str, dict[str, Any]]:
    logs, srcs = root / GEN1 / "logs", root / GEN1 / "srcs"
    out: dict[str, dict[str, Any]] = {}
    _write(logs / A / "results.tsv", _tsv(LOG_A))
    _write(logs / A / "results.tsv.orig", _tsv(LOG_A[:5]))  # an older state: copy
    _write(srcs / A / "results.tsv", _tsv(LOG_A))  # the same bytes under srcs/: copy
    backup = root / GEN1 / ".backup" / f"{A}_winners_20250101T000000" / "results.tsv"
    _write(backup, _tsv([HEADER_1, LOG_A[16]]))  # a row of the log: copy
    _write(
        logs / A / "idea-log.jsonl",
        _jsonl(
            [{"iter": "iter003", "idea": "wgmma 128x256"}, {"iter": 5, "idea_summary": "persistent kernel"}]
        ),
    )
    _write(
        logs / A / "attempt-log.jsonl",
        _jsonl([{"iteration": 2, "hypothesis": "TMA loads", "decision": "COMPILE_FAIL"}]),
    )
    memory = root / GEN1 / "memory" / A
    _write(
        memory / "rounds.raw.jsonl",
        _jsonl([{"round": 1, "summary": "tiles"}, {"idea": "stages"}, "{not json"]),
    )
    _write(memory / "rounds.md", "# rounds\n")
    _write(memory / "sessions" / "s1.jsonl", _jsonl([{"role": "agent"}]))
    checkpoint = {
        "best_kernel": "iter014.cu",
        "best_tflops": 260.25,
        "current_iter": 21,
        "dsl": "cuda",
        "dtype": "f16",
        "shape": [512, 16384, 16384],
        "shape_key": A,
    }
    _write(root / GEN1 / "checkpoints" / f"{A}.json", json.dumps(checkpoint))
    _write(srcs / A / "iter001.cu", "__global__ void k() {}\n")  # a kernel of another family
    _write(srcs / A / "iter014.cu", CROQQ_KERNEL)
    _write(srcs / A / "iter003.cu", KERNEL_WITH_INCLUDES)
    _write(srcs / A / "common.h", "#pragma once\n")
    src_a = f"{GEN1}/logs/{A}/results.tsv"
    out[src_a] = _expect(
        src_a,
        "f16_512x16384x16384",
        "resumable",
        rows=25,
        measured=16,
        best_tflops=260.25,
        best_iter="iter014",
        reference_tflops=601.0,
        duplicate_ids=["iter000"],
        decisions={
            "BASELINE": 2,
            "BEST": 1,
            "COMPILE_FAIL": 1,
            "DISCARD": 4,
            "DRAFT": 1,
            "FAIL": 1,
            "HANG": 1,
            "KEEP": 5,
            "LAUNCH_FAIL": 1,
            "NONE": 1,
            "PENDING": 1,
            "REFERENCE": 2,
            "RUNTIME_FAIL": 1,
            "SEGFAULT": 1,
            "TESTED": 1,
            "VERIFY_FAIL": 1,
        },
        problems=[
            (None, "rounds.raw.jsonl line 3: not JSON"),
            (20, "no readable TFLOPS"),
            (24, "leaves the tree"),
            (25, "leaves the tree"),
            (28, "not a row"),
        ],
        copies=[
            f"{GEN1}/.backup/{A}_winners_20250101T000000/results.tsv",
            f"{GEN1}/logs/{A}/results.tsv.orig",
            f"{GEN1}/srcs/{A}/results.tsv",
        ],
        sources={
            f"srcs/{A}/iter001.cu": f"{GEN1}/srcs/{A}/iter001.cu",
            f"srcs/{A}/iter003.cu": f"{GEN1}/srcs/{A}/iter003.cu",
            f"{GEN1}/srcs/{A}/iter014.cu": f"{GEN1}/srcs/{A}/iter014.cu",
        },
        ideas=5,
        checkpoint=f"{GEN1}/checkpoints/{A}.json",
    )

    _write(logs / B / "results.tsv", _tsv(LOG_B))
    _write(logs / B / "results.tsv.orig", _tsv(LOG_B_ORIG))  # a row the log lacks: read
    disagreeing = {
        "current_best_kernel": "iter009.cu",
        "current_best_tflops": 999.0,
        "iteration": 9,
        "status": "running",
    }
    _write(root / GEN1 / "checkpoints" / f"{B}.json", json.dumps(disagreeing))
    src_b = f"{GEN1}/logs/{B}/results.tsv"
    bad_checkpoint = [(None, "999.0 is not among the log's rows")]
    out[src_b] = _expect(
        src_b,
        "f16_4096x4096x4096",
        "resumable",
        rows=5,
        measured=4,
        best_tflops=420.5,
        best_iter="iter003",
        reference_tflops=700.0,
        decisions={"BASELINE": 1, "COMPILE_FAIL": 1, "KEEP": 3},
        problems=bad_checkpoint,
        checkpoint=f"{GEN1}/checkpoints/{B}.json",
    )
    out[src_b + ".orig"] = _expect(
        src_b + ".orig",
        "f16_4096x4096x4096",
        "history",
        rows=1,
        measured=1,
        best_tflops=340.0,
        best_iter="iter001",
        decisions={"KEEP": 1},
        problems=bad_checkpoint,
        why="side copy",
        checkpoint=f"{GEN1}/checkpoints/{B}.json",
    )

    plain = [
        (
            C,
            LOG_C,
            "e4m3_2048x2048x2048",
            "resumable",
            "",
            {
                "rows": 3,
                "measured": 3,
                "best_tflops": 320.0,
                "best_iter": "iter002",
                "reference_tflops": 500.0,
                "decisions": {"BASELINE": 1, "DISCARD": 1, "KEEP": 1},
            },
        ),
        (
            D,
            LOG_D,
            "f16_1024x1024x1024",
            "resumable",
            "",
            {
                "rows": 4,
                "measured": 4,
                "best_tflops": 135.0,
                "best_iter": "iter003",
                "reference_tflops": 150.0,
                "decisions": {"KEEP": 3, "REFERENCE": 1},
            },
        ),
        (
            E,
            LOG_E,
            None,
            "history",
            "op fused_moe",
            {"rows": 2, "measured": 2, "best_tflops": 85.0, "best_iter": "iter002", "decisions": {"KEEP": 2}},
        ),
        (
            F,
            LOG_F,
            None,
            "history",
            "op gdn",
            {
                "rows": 2,
                "measured": 2,
                "best_tflops": 11.0,
                "best_iter": "iter002",
                "decisions": {"DISCARD": 1, "KEEP": 1},
            },
        ),
        (
            G,
            LOG_G,
            None,
            "history",
            "op fused_moe_qwen35",
            {
                "rows": 3,
                "measured": 3,
                "best_tflops": 45.5,
                "best_iter": "iter001",
                "reference_tflops": 40.0,
                "decisions": {"BASELINE": 1, "HANG": 1, "KEEP": 1},
            },
        ),
        (
            H,
            LOG_H,
            None,
            "history",
            "no dtype for bf16fp32",
            {
                "rows": 4,
                "measured": 3,
                "best_tflops": 60.0,
                "best_iter": "iter004",
                "decisions": {"FAIL": 1, "KEEP": 1, "NONE": 2},
            },
        ),
        (
            I,
            LOG_I,
            None,
            "history",
            "op gemm_sp",
            {
                "rows": 2,
                "measured": 2,
                "best_tflops": 520.0,
                "best_iter": "iter002",
                "decisions": {"KEEP": 2},
            },
        ),
        (
            J,
            LOG_J,
            None,
            "history",
            "op blockscale_gemm",
            {
                "rows": 1,
                "measured": 1,
                "best_tflops": 900.0,
                "best_iter": "iter001",
                "decisions": {"KEEP": 1},
            },
        ),
        (
            K,
            LOG_K,
            None,
            "history",
            "op bgemm",
            {
                "rows": 1,
                "measured": 1,
                "best_tflops": 100.0,
                "best_iter": "iter001",
                "decisions": {"KEEP": 1},
            },
        ),
        (
            L,
            LOG_L,
            "e4m3_8192x8192x8192",
            "resumable",
            "",
            {
                "rows": 4,
                "measured": 4,
                "best_tflops": 700.0,
                "best_iter": "38",
                "reference_tflops": 1200.0,
                "decisions": {"BASELINE": 1, "DISCARD": 1, "KEEP": 2},
            },
        ),
        ("matmul_f16_256x256x256", [HEADER_1], "f16_256x256x256", "skipped", "no rows", {}),
    ]
    for key, lines, croqq_key, imported_as, why, figures in plain:
        _write(logs / key / "results.tsv", _tsv(lines))
        source = f"{GEN1}/logs/{key}/results.tsv"
        out[source] = _expect(source, croqq_key, imported_as, why=why, **cast(dict[str, Any], figures))

    binary = f"{GEN1}/logs/matmul_f16_128x128x128/results.tsv"
    _write(root / binary, b"iter\ttflops\n\x00\x01\x02\xff")
    out[binary] = _expect(
        binary, "f16_128x128x128", "skipped", why="no rows", problems=[(None, "binary file")]
    )
    return out


def _later(root: Path) -> dict[str, dict[str, Any]]:
    base = root / LATER
    out: dict[str, dict[str, Any]] = {}
    src_p = f"{LATER}/logs/{P}/claude/results.tsv"
    src_q = f"{LATER}/logs/{P}/openai/gpt5/results.tsv"
    _write(root / src_p, _tsv(LOG_P))
    _write(root / src_q, _tsv(LOG_Q))
    _write(base / "logs" / P / "claude" / "task_config.json", json.dumps({"model": "claude"}))
    idea = {
        "idea": "warp specialization",
        "iter": "iter503",
        "levers": ["WARPS"],
        "status": "planned",
        "expected_gain": 0.05,
    }
    _write(base / "checkpoints" / P / "claude" / "current_idea.json", json.dumps(idea))
    _write(
        base / "memory" / P / "claude" / "activity.jsonl",
        _jsonl([{"event": "start"}, {"idea": "pingpong schedule", "iter": 502, "decision": "KEEP"}]),
    )
    _write(base / "baseline" / P / "claude" / "cublas_result.json", json.dumps({"tflops": 900.0}))
    _write(base / "srcs" / P / "b502.py", "def kernel(): pass\n")
    _write(root / ARCHIVE / P / "logs" / "claude" / "results.tsv", _tsv(LOG_P))  # a copy of the main log
    two = "several logs of one shape (claude, openai/gpt5)"
    out[src_p] = _expect(
        src_p,
        "e4m3_4096x8192x8192",
        "history",
        why=two,
        rows=6,
        measured=2,
        best_tflops=720.0,
        best_iter="iter502",
        reference_tflops=900.0,
        duplicate_ids=["iter501", "iter502"],
        decisions={"COMPILE_FAIL": 1, "DISCARD": 1, "KEEP": 3, "TESTED": 1},
        copies=[f"{ARCHIVE}/{P}/logs/claude/results.tsv"],
        sources={f"srcs/{P}/b502.py": f"{LATER}/srcs/{P}/b502.py"},
        ideas=2,
        checkpoint=f"{LATER}/checkpoints/{P}/claude/current_idea.json",
    )
    out[src_q] = _expect(
        src_q,
        "e4m3_4096x8192x8192",
        "history",
        why=two,
        rows=2,
        measured=2,
        best_tflops=660.0,
        best_iter="iter002",
        decisions={"KEEP": 2},
    )
    src_s = f"{LATER}/logs/M8192_N8192_K4096/matmul_f16/results.tsv"
    src_t = f"{LATER}/logs/m8192n8192k8192/matmul/results.tsv"
    _write(root / src_s, _tsv(LOG_S))
    _write(root / src_t, _tsv(LOG_T))
    out[src_s] = _expect(
        src_s,
        "f16_8192x8192x4096",
        "resumable",
        rows=1,
        measured=1,
        best_tflops=400.0,
        best_iter="iter001",
        decisions={"KEEP": 1},
    )
    out[src_t] = _expect(
        src_t,
        None,
        "history",
        why="no dtype",
        rows=1,
        measured=1,
        best_tflops=410.0,
        best_iter="iter001",
        decisions={"KEEP": 1},
    )
    return out


def _archive(root: Path) -> dict[str, dict[str, Any]]:
    base = root / ARCHIVE / R
    source = f"{ARCHIVE}/{R}/logs/claude/results.tsv"
    _write(root / source, _tsv(LOG_R))
    checkpoint = {
        "best_kernel": "iter002.cu",
        "best_tflops": 310.0,
        "current_iter": 2,
        "dsl": "cuda",
        "dtype": "f16",
        "shape": [2048, 4096, 8192],
        "shape_key": R,
    }
    _write(base / "checkpoints" / "claude" / "state_best.json", json.dumps(checkpoint))
    _write(base / "memory" / "claude" / "rounds.raw.jsonl", _jsonl([{"idea": "bigger K tile"}]))
    _write(base / "baseline" / "claude" / "cublas_result.json", json.dumps({"tflops": 551.0}))
    return {
        source: _expect(
            source,
            "f16_2048x4096x8192",
            "resumable",
            rows=3,
            measured=3,
            best_tflops=310.0,
            best_iter="iter002",
            reference_tflops=550.0,
            decisions={"BASELINE": 1, "KEEP": 2},
            ideas=1,
            checkpoint=f"{ARCHIVE}/{R}/checkpoints/claude/state_best.json",
        )
    }


def _timing_shape(root: Path, key: str, rows: int) -> str:
    """One resumable f16 log of ``rows`` rows (a reference row first, then measured rows with every 12th
    a compile failure), each row's kernel source (of croqq's cuda family) in the tree; returns the log's
    source."""
    source = f"{GEN1}/logs/{key}/results.tsv"
    lines = [HEADER_1, "iter000|cublas|600.0|BASELINE|-|vendor baseline"]
    for i in range(1, rows):
        kernel = f"srcs/{key}/iter{i:03d}.cu"
        _write(
            root / GEN1 / kernel,
            f"// {key} iter{i:03d}\n" + CROQQ_KERNEL.replace("STAGES 4", f"STAGES {2 + i % 5}"),
        )
        if i % 12 == 0:
            lines.append(f"iter{i:03d}|{kernel}|0|COMPILE_FAIL|compile error|idea {i}")
        else:
            lines.append(f"iter{i:03d}|{kernel}|{100 + (i * 37) % 500}.5|KEEP|memory|idea {i}")
    _write(root / source, _tsv(lines))
    return source


def write_big_log(root: Path, rows: int = 2000) -> Path:
    """A tree of one resumable shape whose log has ``rows`` rows, for timing the importer; returns the
    log's path."""
    return root / _timing_shape(root, "matmul_f16_4096x8192x8192", rows)


def write_many_shapes(root: Path, shapes: int = 100, rows: int = 20) -> list[str]:
    """A gen-1 tree of ``shapes`` resumable f16 shapes of ``rows`` rows each, for timing a whole import;
    returns the logs' sources."""
    return [_timing_shape(root, f"matmul_f16_{256 * (i + 1)}x4096x4096", rows) for i in range(shapes)]
