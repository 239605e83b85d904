"""What the importer reads from a CroqTile-style tree, before anything is written: one ``SourceLog`` per
results log found, its rows normalized, every number as the source has it, and every problem with its
line. Built by :mod:`croqq.store.importer.read` (which never writes), consumed by the part that stores
it (:mod:`croqq.store.importer.store`) and by the report (``croqq import --json``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ImportedAs = Literal["resumable", "history", "skipped"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Problem(_Model):
    """Something the importer could not read or refused: a one-line reason, with its line when it has one."""

    line: int | None = None
    reason: str


class ParsedKey(_Model):
    """A tree's shape key, read: ``matmul_f16fp32_512x16384x16384`` -> op matmul, dtype f16, M, N, K.
    ``dtype`` is croqq's dtype name (f16, e4m3, ...) or None when croqq has none for it; a non-GEMM
    problem has no M/N/K."""

    raw: str
    op: str | None = None
    dtype: str | None = None
    dtypes: str = ""  # the dtype segment as written (fp16fp32, e4m3fp16, ...)
    m: int | None = None
    n: int | None = None
    k: int | None = None
    gemm: bool = False  # a dense GEMM with M, N, K read

    @property
    def croqq_key(self) -> str | None:
        """croqq's key (``<dtype>_<M>x<N>x<K>``) when croqq can tune this problem."""
        if not self.gemm or self.dtype is None:
            return None
        return f"{self.dtype}_{self.m}x{self.n}x{self.k}"


class Row(_Model):
    """One row of a results log, normalized. ``iteration`` is the canonical number (iter012, iter012b,
    iter012_naive and 12 are all 12; None for baseline rows); ``original_id`` is the text as written."""

    line: int  # 1-based line number in the file
    original_id: str
    iteration: int | None
    rerun: bool = False  # a distinct re-run of the same id (``iter012b``, ``baseline_b``)
    decision: str | None  # the decision token as written (KEEP, DISCARD, COMPILE_FAIL, ...) or None
    tflops: float | None  # None: empty, FAIL, missing; 0 is kept as 0
    kernel: str = ""  # the kernel path or name as written
    idea: str = ""
    bottleneck: str = ""
    timestamp: str = ""
    run_command: str = ""
    reference: bool = False  # a vendor-library (cuBLAS, CUTLASS, torch, ...) measurement, never a best
    failure: str | None = None  # compile/run failure kind when the row is one (COMPILE_FAIL, HANG, ...)


class IdeaNote(_Model):
    """An idea the tree records as tried (idea-log.jsonl, attempt-log.jsonl, rounds.raw.jsonl, memories)."""

    summary: str
    iteration: int | None = None
    decision: str | None = None
    source: str  # path relative to SRC
    line: int | None = None


class SourceLog(_Model):
    """One results log of the tree and what belongs to it."""

    source: str  # its path relative to SRC (POSIX)
    key: ParsedKey
    gpu: str | None = None  # the tree's <gpu> folder when there is one
    dsl: str | None = None
    model: str | None = None  # the agent/model folder (``vendor/model`` when two levels)
    header: str = ""  # the header line as found ('' when none)
    rows: list[Row] = Field(default_factory=list)
    problems: list[Problem] = Field(default_factory=list)
    checkpoint: dict[str, object] | None = None  # the shape's checkpoint, as found (any schema)
    checkpoint_source: str | None = None
    reference_tflops: float | None = (
        None  # the vendor baseline (reference rows, baseline/*cublas_result.json)
    )
    ideas: list[IdeaNote] = Field(default_factory=list)
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="kernel path as the log names it -> path relative to SRC, when present",
    )
    copies: list[str] = Field(
        default_factory=list, description="side copies of this log that were not read again"
    )
    imported_as: ImportedAs = "resumable"
    why: str = ""  # why history or skipped
