"""One ``results.tsv`` read into rows, whatever generation of the tooling wrote it.

A header line names the columns (a plain line, a ``# ... Columns: a|b|c`` comment, or none at all when the
first line is a JSON object). A row is read by name when its field count matches the header and its
decision field holds a decision token (or is empty, or the header has no decision column). Otherwise it is
read around its decision token: the fields before it align with the header's columns before the decision
from the right, the fields after it from the left; TFLOPS is the aligned field when it reads as one, else
the last plain number before the token, else the number right after it. A row without any decision token
aligns with the header from the left. A header line met again mid-file replaces the current one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from croqq.store.importer.model import Problem, Row

DECISIONS = frozenset(
    {"KEEP", "DISCARD", "COMPILE_FAIL", "SEGFAULT", "HANG", "RUNTIME_FAIL", "VERIFY_FAIL", "LAUNCH_FAIL",
     "FAIL", "BASELINE", "REFERENCE", "TESTED", "PENDING", "DRAFT", "BEST"}
)  # fmt: skip
FAILURES = frozenset(
    {"COMPILE_FAIL", "SEGFAULT", "HANG", "RUNTIME_FAIL", "VERIFY_FAIL", "LAUNCH_FAIL", "FAIL"}
)
UNMEASURED = frozenset({"PENDING", "DRAFT"})  # rows that never had a TFLOPS to read
# Column names as written -> the Row field they fill (the others are kept out: round, arch, eff%, time_ms).
_FIELDS = {
    "iter": "id", "kernel": "kernel", "tflops": "tflops", "decision": "decision",
    "bottleneck": "bottleneck", "bottleneck_before": "bottleneck", "idea_summary": "idea", "idea": "idea",
    "category": "idea", "timestamp": "timestamp", "run_command": "run_command",
}  # fmt: skip
# Rows before any header line (a log whose first line is JSON) read as the most common header.
DEFAULT_HEADER = ("iter", "kernel", "tflops", "decision", "bottleneck", "idea_summary")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NO_VALUE = frozenset({"", "-", "FAIL", "N/A", "NA", "NONE", "NAN"})
_ITER_ID = re.compile(r"iter(\d+)([a-z])?(?:_\w+)?", re.IGNORECASE)
_BASELINE_ID = re.compile(r"baseline(?:_([a-z]))?", re.IGNORECASE)
_REFERENCE_NAME = re.compile(r"cublas|cutlass|torch|triton_ref|reference|gemmex", re.IGNORECASE)
_FAILURE_NOTE = {"COMPILE_FAIL": re.compile(r"compil", re.I), "HANG": re.compile(r"\bhang|timed? ?out", re.I)}
_SIZED_TFLOPS = re.compile(r"tflops_(\d+)(k?)", re.IGNORECASE)


@dataclass
class _Fields:
    """A row's fields by Row field name, before they are checked."""

    values: dict[str, str]
    tflops_text: str | None  # None: no field held TFLOPS


def parse_results(text: str, shape_hint: Iterable[int] = ()) -> tuple[str, list[Row], list[Problem]]:
    """The header line as found ('' when none), the rows read, and a problem per line refused or doubtful.
    A row that needs a TFLOPS and has none readable is refused; a failure, PENDING or DRAFT row is kept
    with ``tflops`` None.

    ``shape_hint`` holds the shape's sizes (M, N, K): a header with several sized TFLOPS columns
    (``tflops_2k``, ``tflops_4k``) reads the one whose size is among them; when not exactly one is, the
    first, with a problem on the header line."""
    hint = set(shape_hint)
    header, columns = "", _name_columns(list(DEFAULT_HEADER), hint, 0, [])
    rows: list[Row] = []
    problems: list[Problem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        found = _header_columns(line)
        if found is not None:
            columns = _name_columns(found, hint, number, problems)
            header = header or line
            continue
        if line.startswith("#"):
            continue
        if line.startswith("{"):
            fields = _json_fields(line)
        else:
            fields = _tsv_fields([f.strip() for f in raw.split("\t")], columns)
        if fields is None:
            problems.append(Problem(line=number, reason="not a row: no iteration id or fields to read"))
            continue
        read = _row(fields, number)
        if isinstance(read, Problem):
            problems.append(read)
        elif read.tflops is None and _needs_tflops(read):
            problems.append(Problem(line=number, reason=f"{read.original_id}: no readable TFLOPS"))
        else:
            rows.append(read)
    return header, rows, problems


def _header_columns(line: str) -> list[str] | None:
    """The column names of a header line (a comment naming its columns counts), or None."""
    if line.startswith("#"):
        at = line.lower().find("columns:")
        if at < 0:
            return None
        line = line[at + len("columns:") :].strip()
    names = [n.strip().lower() for n in (line.split("\t") if "\t" in line else line.split("|"))]
    if "iter" in names and any(n.startswith("tflops") for n in names):
        return names
    return None


def _name_columns(names: list[str], hint: set[int], line: int, problems: list[Problem]) -> list[str]:
    """Map written column names to Row fields; of several sized TFLOPS columns keep the shape's one."""
    sized = [(i, _SIZED_TFLOPS.fullmatch(n)) for i, n in enumerate(names)]
    sizes = {i: int(m.group(1)) * (1024 if m.group(2) else 1) for i, m in sized if m}
    chosen = [i for i, size in sizes.items() if size in hint]
    if sizes and "tflops" not in names:
        pick = chosen[0] if len(chosen) == 1 else next(iter(sizes))  # else the first, said so
        if len(chosen) != 1:
            problems.append(
                Problem(line=line, reason=f"no single TFLOPS column matches the shape; read {names[pick]}")
            )
        names = [("tflops" if i == pick else n) for i, n in enumerate(names)]
    return [_FIELDS.get(n, n) for n in names]


def _json_fields(line: str) -> _Fields | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    values = {_FIELDS.get(str(k), str(k)): str(v) for k, v in data.items() if v is not None}
    values.setdefault("id", str(data.get("iteration", "")))
    return _Fields(values, values.get("tflops"))


def _tsv_fields(fields: list[str], columns: list[str]) -> _Fields | None:
    while len(fields) > max(len(columns), 1) and fields[-1] == "":
        fields.pop()  # padding tabs
    if _by_name(fields, columns):
        values = dict(zip(columns, fields, strict=True))
        return _Fields(values, values.get("tflops"))
    at_id = _id_index(fields, columns)
    if at_id is None:
        return None
    at_decision = _decision_index(fields, at_id)
    if at_decision is None:
        return _left_aligned(fields, columns, at_id)
    return _around_decision(fields, columns, at_id, at_decision)


def _by_name(fields: list[str], columns: list[str]) -> bool:
    if len(fields) != len(columns) or "id" not in columns or "tflops" not in columns:
        return False
    if "decision" in columns and fields[columns.index("decision")].upper() not in DECISIONS | {""}:
        return False
    return _tflops_like(fields[columns.index("tflops")])


def _id_index(fields: list[str], columns: list[str]) -> int | None:
    for i, field in enumerate(fields):
        if _ITER_ID.fullmatch(field) or _BASELINE_ID.fullmatch(field):
            return i
    if len(fields) > 1 and columns[:1] == ["round"] and fields[0].isdigit() and fields[1].isdigit():
        return 1
    return 0 if fields and fields[0].isdigit() else None


def _decision_index(fields: list[str], at_id: int) -> int | None:
    """The decision token's field: the last of the first run of tokens (``FAIL`` then ``COMPILE_FAIL``:
    the first one stood for TFLOPS)."""
    at = next((i for i in range(at_id + 1, len(fields)) if fields[i].upper() in DECISIONS), None)
    while at is not None and at + 1 < len(fields) and fields[at + 1].upper() in DECISIONS:
        at += 1
    return at


def _around_decision(fields: list[str], columns: list[str], at_id: int, at: int) -> _Fields:
    col_id = columns.index("id") if "id" in columns else 0
    col_decision = columns.index("decision") if "decision" in columns else len(columns)
    before, after = fields[at_id + 1 : at], fields[at + 1 :]
    values = {"id": fields[at_id], "decision": fields[at]}
    values.update(_aligned_right(before, columns[col_id + 1 : col_decision]))
    tflops = values.pop("tflops", None)
    if tflops is None or not _tflops_like(tflops):
        tflops = next((f for f in reversed(before) if _NUMBER.fullmatch(f)), None)
    if tflops is None and after and _NUMBER.fullmatch(after[0]):
        tflops, after = after[0], after[1:]
    if "kernel" not in values or _NUMBER.fullmatch(values["kernel"]):
        values["kernel"] = next((f for f in before if f and not _NUMBER.fullmatch(f)), "")
    for column, field in zip(columns[col_decision + 1 :], after, strict=False):
        values.setdefault(column, field)
    return _Fields(values, tflops)


def _aligned_right(fields: list[str], columns: list[str]) -> dict[str, str]:
    return dict(zip(reversed(columns), reversed(fields), strict=False))


def _left_aligned(fields: list[str], columns: list[str], at_id: int) -> _Fields:
    col_id = columns.index("id") if "id" in columns else 0
    values = {"id": fields[at_id]}
    for column, field in zip(columns[col_id + 1 :], fields[at_id + 1 :], strict=False):
        values.setdefault(column, field)
    tflops = values.pop("tflops", None)
    if tflops is None or not _tflops_like(tflops):
        tflops = next((f for f in fields[at_id + 1 :] if _NUMBER.fullmatch(f)), None)
    return _Fields(values, tflops)


def _tflops_like(text: str) -> bool:
    return bool(_NUMBER.fullmatch(text)) or text.upper() in _NO_VALUE


def _row(fields: _Fields, line: int) -> Row | Problem:
    values = fields.values
    original = values.get("id", "").strip()
    iteration, rerun = _iteration(original)
    if iteration is None and not _BASELINE_ID.fullmatch(original):
        return Problem(line=line, reason=f"not a row: unrecognized iteration id {original!r}")
    text = (fields.tflops_text or "").strip()
    tflops = float(text) if _NUMBER.fullmatch(text) else None
    tflops = tflops if tflops is not None and math.isfinite(tflops) else None
    decision = values.get("decision", "").strip().upper() or None
    decision = decision if decision in DECISIONS else None
    kernel = values.get("kernel", "").strip()
    bottleneck = values.get("bottleneck", "").strip()
    return Row(
        line=line,
        original_id=original,
        iteration=iteration,
        rerun=rerun,
        decision=decision,
        tflops=tflops,
        kernel=kernel,
        idea=values.get("idea", "").strip(),
        bottleneck=bottleneck,
        timestamp=values.get("timestamp", "").strip(),
        run_command=values.get("run_command", "").strip(),
        reference=_is_reference(original, iteration, decision, kernel),
        failure=_failure(decision, tflops, text, bottleneck),
    )


def _iteration(original: str) -> tuple[int | None, bool]:
    """The canonical iteration number and whether the id marks a distinct re-run."""
    if original.isdigit():
        return int(original), False
    found = _ITER_ID.fullmatch(original)
    if found:
        return int(found.group(1)), found.group(2) is not None
    baseline = _BASELINE_ID.fullmatch(original)
    return None, bool(baseline and baseline.group(1))


def _is_reference(original: str, iteration: int | None, decision: str | None, kernel: str) -> bool:
    """iter000 and ``baseline`` rows are the vendor library by protocol; so is a REFERENCE row or one
    whose id or kernel file name names a vendor library."""
    if iteration == 0 or _BASELINE_ID.fullmatch(original) or decision == "REFERENCE":
        return True
    name = kernel.replace("\\", "/").rsplit("/", 1)[-1]
    return bool(_REFERENCE_NAME.search(original) or _REFERENCE_NAME.search(name))


def _failure(decision: str | None, tflops: float | None, text: str, bottleneck: str) -> str | None:
    if decision in FAILURES:
        return decision
    if decision is None and text.upper() == "FAIL":
        return "FAIL"
    if decision == "DISCARD" and tflops == 0:
        return next((kind for kind, note in _FAILURE_NOTE.items() if note.search(bottleneck)), None)
    return None


def _needs_tflops(row: Row) -> bool:
    return row.failure is None and row.decision not in UNMEASURED
