"""Task payloads: JSON objects validated on receipt (a payload that fails validation is logged and dropped).

Messages are triggers, not truth: a step message names a step and the epoch it was published for; the
step ledger in Redis decides whether it still runs.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from croqq.delivery.queues import StepKind
from croqq.domain.fsm import MAX_CANDIDATES
from croqq.domain.schedule import ScheduledShape
from croqq.errors import InvalidRecordError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepMessage(_Message):
    step_id: str = Field(min_length=3, max_length=300)
    epoch: int = Field(ge=0)
    sid: str = Field(min_length=3)
    kind: StepKind


class SubmitMessage(_Message):
    submission: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    dsl: str = Field(min_length=1)
    mode: str
    max_iter: int = Field(gt=0)
    candidates: int = Field(1, ge=1, le=MAX_CANDIDATES)
    shapes: list[ScheduledShape] = Field(min_length=1)


class FillMessage(_Message):
    gpu_uuid: str | None = None


def parse(model: type[M], payload: Any) -> M:
    """Validate a received payload; raise InvalidRecordError with one line naming the first problem."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(payload)"
        raise InvalidRecordError(f"{model.__name__}: {where}: {err['msg']}") from exc
