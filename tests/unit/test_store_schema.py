"""Schemas and text formats: records round-trip; extra fields, unknown versions and bad lines are refused."""

from __future__ import annotations

import json

import pydantic
import pytest

from croqq.errors import InvalidRecordError
from croqq.store.load import parse_json, parse_jsonl
from croqq.store.render import parse_tsv, results_row, state_line, state_text, tsv_header, tsv_line
from croqq.store.schema import (
    AttemptRecord,
    Checkpoint,
    IdeaEntry,
    ResultsRow,
    RoundRecord,
    StateFile,
    StoreReceipt,
    StoreRequest,
)
from tests.samples import sample_requests

REQS = list(sample_requests("sm90_NVIDIA_H200", "cuda", ["f16_4096x8192x8192"], 6, 1, attempt_rate=0.5))
ROUND = next(r.round for r in REQS if r.round is not None and r.round.profile is not None)
ATTEMPT = next(r.attempt for r in REQS if r.attempt is not None)
CKPT = REQS[-1].checkpoint


@pytest.mark.parametrize(
    "record", [ROUND, ATTEMPT, CKPT, REQS[-1], StoreReceipt(commit="ab", duplicate=False, iteration=3)]
)
def test_records_round_trip_through_json(record: pydantic.BaseModel) -> None:
    again = parse_json(record.model_dump_json().encode(), type(record), "x.json")
    assert again == record


def test_store_request_round_trips_through_its_json_message() -> None:
    for req in REQS:
        assert StoreRequest.model_validate_json(req.model_dump_json()) == req


@pytest.mark.parametrize("model", [Checkpoint, RoundRecord, AttemptRecord])
def test_extra_field_is_refused_naming_file_and_field(model: type[pydantic.BaseModel]) -> None:
    source = {Checkpoint: CKPT, RoundRecord: ROUND, AttemptRecord: ATTEMPT}[model]
    data = json.dumps(json.loads(source.model_dump_json()) | {"surprise": 1}).encode()
    with pytest.raises(InvalidRecordError, match=r"^rec\.json: surprise: Extra inputs are not permitted"):
        parse_json(data, model, "rec.json")


def test_wrong_schema_version_is_refused() -> None:
    data = json.dumps(json.loads(CKPT.model_dump_json()) | {"schema_version": 7}).encode()
    with pytest.raises(
        InvalidRecordError, match=r"^ck\.json: unknown schema_version 7 \(this croqq reads 1\)$"
    ):
        parse_json(data, Checkpoint, "ck.json")


def test_store_request_with_extra_field_is_refused() -> None:
    payload = json.loads(REQS[0].model_dump_json()) | {"priority": 1}
    with pytest.raises(pydantic.ValidationError):
        StoreRequest.model_validate(payload)


def test_jsonl_errors_name_the_line() -> None:
    good = IdeaEntry(
        content_hash="a" * 64,
        tag="t",
        summary="s",
        strategy="refine",
        iteration=1,
        decision="KEEP",
        tflops=1.0,
    ).model_dump_json()
    with pytest.raises(InvalidRecordError, match=r"^ideas\.jsonl: line 2: not valid JSON"):
        parse_jsonl(f"{good}\n{{oops\n".encode(), IdeaEntry, "ideas.jsonl")
    with pytest.raises(InvalidRecordError, match=r"^ideas\.jsonl: line 2: truncated"):
        parse_jsonl(f"{good}\n{good[:20]}".encode(), IdeaEntry, "ideas.jsonl")


def test_tsv_row_is_one_line_even_with_tabs_and_newlines() -> None:
    row = ResultsRow(
        iter=7,
        kernel="tuning/a b/k.cu",
        tflops=612.3456,
        hw_eff_pct=61.9,
        decision="KEEP",
        bottleneck="memory",
        idea_summary="split\tK\nthen \\n widen",
        run_command="run --x\r",
    )
    line = tsv_line(row)
    assert line.count("\n") == 1 and line.endswith("\n") and line.count("\t") == 7
    (parsed,) = parse_tsv(tsv_header() + line)
    assert parsed.idea_summary == row.idea_summary and parsed.run_command == row.run_command
    assert parsed.iter == 7 and parsed.tflops == pytest.approx(612.346)
    assert line.startswith("007\t")


def test_results_row_of_a_baseline_says_baseline() -> None:
    base = next(r.round for r in REQS if r.round is not None and r.round.iteration == 0)
    assert base is not None and results_row(base).idea_summary == "baseline"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("iter\tkernel\n", r"line 1: header is not"),
        (
            tsv_header() + "000\tk\t1.0\t2.0\tKEEP\tmemory\tidea\n",
            r"line 2: expected 8 tab-separated fields, found 7",
        ),
        (tsv_header() + "000\tk\tfast\t2.0\tKEEP\tm\ti\tc\n", r"line 2: tflops: "),
        (tsv_header() + "000\tk\t1.0\t2.0\tKEEP\tm\ti\tc", r"line 2: truncated"),
        (tsv_header() + "000\tk\t1.0\t2.0\tKEEP\tm\tbad \\q\tc\n", r"line 2: bad escape"),
    ],
)
def test_bad_tsv_lines_are_named(text: str, reason: str) -> None:
    with pytest.raises(InvalidRecordError, match=rf"^logs/k/results\.tsv: {reason}"):
        parse_tsv(text, "logs/k/results.tsv")


def test_state_text_is_valid_json_with_sorted_keys() -> None:
    entry = REQS[-1].state
    text = state_text("gpu", "cuda", {k: state_line(k, entry) for k in ("b_key", "a_key")})
    state = StateFile.model_validate_json(text)
    assert list(state.shapes) == ["a_key", "b_key"] and state.shapes["a_key"] == entry
    assert StateFile.model_validate_json(state_text("gpu", "cuda", {})).shapes == {}
