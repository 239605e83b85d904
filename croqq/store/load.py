"""Read-side helpers over the results repo's branch tip: checkpoints, state.json, runs, tried ideas.

Every parse error is an InvalidRecordError with one line: ``<repo path>: <reason>``. Records written
with an unknown ``schema_version`` are refused, never guessed at.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from croqq.errors import InvalidRecordError
from croqq.store import paths
from croqq.store.gitrepo import GitRepo
from croqq.store.schema import (
    SCHEMA_VERSION,
    AttemptRecord,
    Checkpoint,
    IdeaEntry,
    RoundRecord,
    StateFile,
    SubmissionRecord,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def _validation_reason(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{where}: {err['msg']}"


def parse_json(data: bytes, model: type[M], source: str) -> M:
    """One JSON document of ``model``; InvalidRecordError naming ``source`` and the reason."""
    try:
        raw: Any = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRecordError(f"{source}: not valid JSON ({exc})") from None
    return _validate(raw, model, source)


def _validate(raw: Any, model: type[M], source: str) -> M:
    if not isinstance(raw, dict):
        raise InvalidRecordError(f"{source}: expected a JSON object, found {type(raw).__name__}")
    version = raw.get("schema_version", SCHEMA_VERSION)
    if "schema_version" in model.model_fields and version != SCHEMA_VERSION:
        raise InvalidRecordError(
            f"{source}: unknown schema_version {version!r} (this croqq reads {SCHEMA_VERSION})"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InvalidRecordError(f"{source}: {_validation_reason(exc)}") from None


def parse_jsonl(data: bytes, model: type[M], source: str) -> list[M]:
    """Every line of a JSON-lines file; the error names the line (a missing final newline is truncation)."""
    text = data.decode("utf-8", errors="replace")
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] != "":
        raise InvalidRecordError(f"{source}: line {len(lines)}: truncated (no newline at the end)")
    return [
        parse_json(line.encode(), model, f"{source}: line {n}") for n, line in enumerate(lines[:-1], start=1)
    ]


def load_checkpoint(repo: GitRepo, gpu: str, dsl: str, key: str) -> Checkpoint | None:
    """A shape's checkpoint at the tip; None when there is none."""
    path = paths.RunPaths(gpu, dsl).checkpoint(key)
    data = repo.read(path)
    if data is None:
        return None
    ckpt = parse_json(data, Checkpoint, path)
    if ckpt.key != key:
        raise InvalidRecordError(f"{path}: holds the checkpoint of {ckpt.key!r}, not {key!r}")
    return ckpt


def load_best_source(repo: GitRepo, ckpt: Checkpoint) -> str:
    """The logical source of a checkpoint's best kernel, read back from the repo ('' when it has none or
    it cannot be read: the loop then renders its best knobs). Only the writer reads the repo; it puts this
    in the loop it rebuilds, so no other host ever needs the repo to know a shape's best kernel."""
    from croqq.domain.source import SourceError, load_stored

    if not ckpt.best_kernel:
        return ""

    def read(path: str) -> str | None:
        data = repo.read(path)
        return data.decode("utf-8") if data is not None else None

    try:
        return load_stored(ckpt.best_kernel, read)[0]
    except SourceError as exc:
        log.warning("%s: cannot read the stored best kernel back (%s); using its knobs", ckpt.key, exc)
        return ""


def load_state(repo: GitRepo, gpu: str, dsl: str) -> StateFile | None:
    """A run's state.json at the tip; None when there is none."""
    path = paths.RunPaths(gpu, dsl).state_json
    data = repo.read(path)
    return parse_json(data, StateFile, path) if data is not None else None


def list_runs(repo: GitRepo) -> list[tuple[str, str]]:
    """Every (gpu type, dsl) that has a folder under tuning/, sorted."""
    return [
        (gpu, dsl)
        for gpu in repo.list_dir(paths.TUNING)
        for dsl in repo.list_dir(f"{paths.TUNING}/{gpu}")
        if repo.is_dir(f"{paths.TUNING}/{gpu}/{dsl}")
    ]


def _read_jsonl(repo: GitRepo, path: str, model: type[M]) -> list[M]:
    """The records of one JSON-lines file at the branch tip; none where the file does not exist yet."""
    data = repo.read(path)
    return parse_jsonl(data, model, path) if data is not None else []


def load_submissions(repo: GitRepo, gpu: str, dsl: str) -> list[SubmissionRecord]:
    return _read_jsonl(repo, paths.RunPaths(gpu, dsl).submissions, SubmissionRecord)


def load_ideas(repo: GitRepo, gpu: str, dsl: str, key: str) -> list[IdeaEntry]:
    return _read_jsonl(repo, paths.RunPaths(gpu, dsl).ideas(key), IdeaEntry)


def tried_hashes(repo: GitRepo, gpu: str, dsl: str, key: str) -> list[str]:
    """Content hashes of every idea tried on a shape (measured or compile-failed), first-seen order."""
    seen: dict[str, None] = {}
    for entry in load_ideas(repo, gpu, dsl, key):
        seen.setdefault(entry.content_hash, None)
    return list(seen)


def load_rounds(repo: GitRepo, gpu: str, dsl: str, key: str) -> list[RoundRecord]:
    return _read_jsonl(repo, paths.RunPaths(gpu, dsl).rounds_raw(key), RoundRecord)


def load_attempts(repo: GitRepo, gpu: str, dsl: str, key: str) -> list[AttemptRecord]:
    return _read_jsonl(repo, paths.RunPaths(gpu, dsl).attempts(key), AttemptRecord)
