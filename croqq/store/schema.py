"""Versioned schemas of every record the writer stores (one module, one version number).

``SCHEMA_VERSION`` is written into every JSON record; readers refuse versions they do not know.
results.tsv columns are ``RESULTS_COLUMNS`` in that order, tab-separated, with a header line.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from croqq.domain.fsm import MAX_CANDIDATES
from croqq.domain.records import (
    AgentUsage,
    Idea,
    Measurement,
    MeasureResult,
    Profile,
    Rejection,
    RejectionKind,
)
from croqq.domain.schedule import ScheduledShape

SCHEMA_VERSION: Final = 1
RESULTS_COLUMNS = (
    "iter",
    "kernel",
    "tflops",
    "hw_eff_pct",
    "decision",
    "bottleneck",
    "idea_summary",
    "run_command",
)
Status = Literal["active", "done"]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResultsRow(_Schema):
    """One line of results.tsv."""

    iter: int = Field(ge=0)
    kernel: str
    tflops: float = Field(ge=0)
    hw_eff_pct: float = Field(ge=0)
    decision: str
    bottleneck: str
    idea_summary: str
    run_command: str


class Checkpoint(_Schema):
    """Crash-safe state of one shape: enough to resume its loop on a cold start."""

    schema_version: Literal[1] = SCHEMA_VERSION
    key: str
    dtype: str
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    mode: str
    max_iter: int = Field(gt=0)
    current_iter: int = Field(ge=-1)
    best_iter: int = Field(ge=-1)
    best_tflops: float = Field(ge=0)
    baseline_tflops: float = Field(ge=0)
    best_kernel: str
    best_knobs: dict[str, int]
    seed_knobs: dict[str, int]
    consecutive_discards: int = Field(ge=0)
    attempts: int = Field(ge=0)
    candidates: int = Field(1, ge=1, le=MAX_CANDIDATES)
    keeps: int = Field(0, ge=0)
    fails: int = Field(0, ge=0)
    status: Status
    scenarios: list[str]
    region: str
    last_updated: str


class StateEntry(_Schema):
    """One key of state.json: what changes at a KEEP or at a change of status, not every iteration (so most
    commits leave the file alone; the iteration count is the checkpoint's)."""

    status: Status
    best_iter: int = Field(ge=-1)
    best_tflops: float = Field(ge=0)
    baseline_tflops: float = Field(ge=0)
    best_kernel: str
    mode: str
    scenarios: list[str]
    region: str


def state_entry(ckpt: Checkpoint) -> StateEntry:
    """A shape's state.json entry: the checkpoint's summary fields (they must agree)."""
    return StateEntry(**ckpt.model_dump(include=set(StateEntry.model_fields)))


class StateFile(_Schema):
    schema_version: Literal[1] = SCHEMA_VERSION
    gpu: str
    dsl: str
    shapes: dict[str, StateEntry]


class Imported(_Schema):
    """Where an imported record came from (``croqq import``): its log's path relative to the imported
    tree, the line, the id, decision token, TFLOPS and kernel as written, and the hash of the row's
    content (a re-import adds a row only when this file, line and hash are not stored yet)."""

    file: str
    line: int = Field(ge=1)
    original_id: str
    decision: str | None = None
    tflops: float | None = None
    kernel: str = ""
    row_hash: str


class SiblingRecord(_Schema):
    """One of an iteration's other candidates (``--candidates N``), in its round's or attempt's record:
    its idea (or why it has none), whether it built, its measurement in the iteration's batch, the
    candidate it repeats (same content hash or same binary: never measured), and its stored source
    (``srcs/iterNNN_c<candidate>-<tag>``, for every candidate that built; '' otherwise)."""

    candidate: int = Field(ge=1)
    idea: Idea | None = None
    rejection: Rejection | None = None
    built: bool | None = Field(None, description="None: never built (rejected, or a repeat).")
    build_reason: str = ""
    measurement: Measurement | None = None
    repeat_of: int | None = Field(None, ge=1)
    kernel: str = ""

    @property
    def tflops(self) -> float:
        m = self.measurement
        return m.tflops if m is not None and m.outcome == "ok" else 0.0


def sibling_problem(candidate: int, siblings: list[SiblingRecord]) -> str | None:
    """Why a record's siblings do not fit together (None: they do): numbers unique and not the
    candidate's own, a repeat names another candidate, only a built sibling has a measurement."""
    numbers = [s.candidate for s in siblings]
    if len(set(numbers)) != len(numbers) or candidate in numbers:
        return f"sibling candidate numbers {numbers} repeat (or repeat the record's own, {candidate})"
    known = {candidate, *numbers}
    for s in siblings:
        if s.repeat_of is not None and (s.repeat_of not in known or s.repeat_of == s.candidate):
            return f"sibling {s.candidate} repeats candidate {s.repeat_of}, which is not another candidate"
        if s.measurement is not None and s.built is not True:
            return f"sibling {s.candidate} has a measurement but did not build"
        if s.idea is None and s.rejection is None:
            return f"sibling {s.candidate} has neither an idea nor a rejection"
    return None


class RoundRecord(_Schema):
    """One line of rounds.raw.jsonl: everything known about one measured iteration."""

    schema_version: Literal[1] = SCHEMA_VERSION
    key: str
    iteration: int = Field(ge=0)
    decision: str
    tflops: float = Field(ge=0)
    hw_eff_pct: float = Field(ge=0)
    best_before: float = Field(ge=0)
    best_after: float = Field(ge=0)
    kernel: str
    knobs: dict[str, int]
    idea: Idea | None
    strategy: str
    consecutive_discards: int = Field(ge=0)
    bottleneck: str
    profile: Profile | None
    measure: MeasureResult
    run_command: str
    gpu_uuid: str
    epoch: int = Field(ge=0)
    step_id: str
    timestamp: str
    imported: Imported | None = None  # set on rounds brought in by `croqq import`
    candidate: int = Field(1, ge=1, description="The measured candidate's number among the iteration's.")
    siblings: list[SiblingRecord] = Field(default_factory=list, description="The iteration's others.")


AttemptKind = Literal["compile", "run"] | RejectionKind


class AttemptRecord(_Schema):
    """One line of attempts.jsonl: an IDEATE or IMPLEMENT that produced no measurable candidate (it has
    no iteration id): ``compile`` failed to build, ``check`` failed a check before the build, ``agent``
    the agent itself failed (timed out, exited non-zero, wrote no candidate), ``repeat`` an earlier one,
    ``run`` an imported row whose run failed (crash, hang, wrong answer) with no measurement."""

    schema_version: Literal[1] = SCHEMA_VERSION
    key: str
    attempt_no: int = Field(ge=1)
    after_iter: int = Field(ge=-1)
    kind: AttemptKind = "compile"
    proposer: str = ""
    idea: Idea | None
    agent: AgentUsage | None = None  # what the agent call cost, when an agent made the attempt
    reason: str
    log: str
    epoch: int = Field(ge=0)
    step_id: str
    timestamp: str
    imported: Imported | None = None
    candidate: int = Field(1, ge=1, description="This attempt's candidate number among the iteration's.")
    siblings: list[SiblingRecord] = Field(default_factory=list, description="The iteration's others.")


class IdeaEntry(_Schema):
    """One line of ideas.jsonl, the per-shape idea log used for dedup."""

    content_hash: str
    tag: str
    summary: str
    strategy: str
    iteration: int | None
    decision: str
    tflops: float = Field(ge=0)


class StoreRequest(_Schema):
    """The STORE step's payload: what the writer commits for one iteration or one compile-failed attempt."""

    gpu: str
    dsl: str
    key: str
    family: str
    ext: str
    epoch: int = Field(ge=0)
    step_id: str
    kind: Literal["iteration", "attempt"]
    round: RoundRecord | None = None
    attempt: AttemptRecord | None = None
    source: str = Field("", description="Candidate's logical source (srcs/) for an iteration.")
    headers: dict[str, str] = Field(default_factory=dict, description="Its header closure: name -> text.")
    checkpoint: Checkpoint
    state: StateEntry
    complete: bool = Field(False, description="This STORE completes the shape: register its best kernel.")
    best_source: str = Field("", description="Logical source of the best kernel, when complete.")
    best_headers: dict[str, str] = Field(default_factory=dict)
    sibling_sources: dict[str, str] = Field(
        default_factory=dict, description="Each built sibling's source by its kernel path (srcs/)."
    )
    sibling_headers: dict[str, str] = Field(default_factory=dict, description="Their header closures.")


class SubmissionRecord(_Schema):
    """One line of submissions.jsonl: what a `croqq submit` asked for, so that a Redis that forgot it
    (flushed, restored from an older snapshot) can be given every submitted shape again."""

    submission: str
    gpu_type: str
    dsl: str
    mode: str
    max_iter: int = Field(gt=0)
    candidates: int = Field(1, ge=1, le=MAX_CANDIDATES)
    shapes: list[ScheduledShape]
    timestamp: str


class ImportedLog(_Schema):
    """A results log ``croqq import`` kept as read-only history (a problem croqq cannot tune): every row
    as read, in ``imported/<name>.json`` of the run. ``rows``, ``ideas`` and ``problems`` are the
    importer's own records (:mod:`croqq.store.importer.model`), kept as JSON objects."""

    schema_version: Literal[1] = SCHEMA_VERSION
    source: str
    key: str
    croqq_key: str | None
    model: str | None
    why: str
    header: str
    reference_tflops: float | None
    checkpoint: dict[str, object] | None
    rows: list[dict[str, object]]
    ideas: list[dict[str, object]]
    problems: list[dict[str, object]]


class StoreReceipt(_Schema):
    """What the writer answers: the commit and whether this STORE was already stored before."""

    commit: str
    duplicate: bool
    iteration: int | None
