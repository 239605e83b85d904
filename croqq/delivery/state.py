"""A shape's live state in Redis: its FSM loop plus where it runs (GPU, current step, epoch bookkeeping).

In Redis a state is stored packed (:meth:`ShapeState.dumps`: ``z:`` + base64 of its deflated JSON): every
step reads and writes it a few times, from every host, and packing halves what crosses the network.
:meth:`ShapeState.loads` also reads plain JSON.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict

from croqq.delivery import keys
from croqq.domain.fsm import Loop, Phase
from croqq.domain.shapes import Shape

PENDING, ACTIVE, DONE, ERROR = "pending", "active", "done", "error"
RESUME_BOOST = 1_000_000.0  # subtracted from the rank of resumed shapes so they run first
PACKED = "z:"


def make_sid(gpu_type: str, dsl: str, key: str) -> str:
    return f"{gpu_type}/{dsl}/{key}"


def split_sid(sid: str) -> tuple[str, str, str]:
    gpu_type, dsl, key = sid.split("/", 2)
    return gpu_type, dsl, key


class ShapeSummary(BaseModel):
    """The small projection of a shape that status views and benchmarks read (``croqq:summary``)."""

    model_config = ConfigDict(extra="ignore")

    status: str
    phase: str
    dtype: str
    current_iter: int
    max_iter: int
    best_iter: int | None = None  # > 0: a kept iteration past the baseline; None: an older summary
    best_tflops: float
    baseline_tflops: float
    gpu: str
    error: str = ""


class ShapeState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dumps(self) -> str:
        """The packed form stored in Redis (text: croqq's clients decode replies)."""
        return PACKED + base64.b64encode(zlib.compress(self.model_dump_json().encode(), 1)).decode("ascii")

    @classmethod
    def loads(cls, raw: str | bytes) -> ShapeState:
        """A state from its packed form or from plain JSON."""
        text = raw.decode() if isinstance(raw, bytes) else raw
        if text.startswith(PACKED):
            return cls.model_validate_json(zlib.decompress(base64.b64decode(text[len(PACKED) :])))
        return cls.model_validate_json(text)

    sid: str
    gpu_type: str
    dsl: str
    key: str
    dtype: str
    m: int
    n: int
    k: int
    mode: str
    scenarios: list[str]
    region: str
    rank: int
    loop: Loop
    gpu_uuid: str | None = None
    step_id: str | None = None
    step_seq: int = 0
    needs_rebase: bool = False
    error: str = ""
    iter_t0: float = 0.0  # Redis time the current iteration began (0: not yet on a GPU)
    iter_exec_s: float = 0.0
    updated_at: float = 0.0  # Redis time of the last save

    @property
    def shape(self) -> Shape:
        return Shape(dtype=self.dtype, m=self.m, n=self.n, k=self.k)

    @property
    def status(self) -> str:
        if self.error:
            return ERROR
        if self.loop.phase == Phase.DONE:
            return DONE
        return ACTIVE if self.gpu_uuid else PENDING

    def summary_json(self) -> str:
        loop = self.loop
        return ShapeSummary(
            status=self.status,
            phase=loop.phase,
            dtype=self.dtype,
            current_iter=loop.current_iter,
            max_iter=loop.max_iter,
            best_iter=loop.best_iter,
            best_tflops=round(loop.best_tflops, 3),
            baseline_tflops=round(loop.baseline_tflops, 3),
            gpu=self.gpu_uuid or "",
            error=self.error[:200],
        ).model_dump_json()

    def pending_score(self) -> float:
        """Resumed shapes (anything past INIT) go before new ones; then schedule rank."""
        resumed = self.loop.phase != Phase.INIT or self.loop.current_iter >= 0
        return self.rank - (RESUME_BOOST if resumed else 0.0)


def release_gpu(pipe: Any, state: ShapeState) -> None:
    """The shape leaves its GPU (if any) and waits in the pending set for one (pipe in multi mode).

    Its in-flight step, if any, is the caller's business; its next GPU step re-measures the best first.
    """
    if state.gpu_uuid:
        pipe.srem(keys.active(state.gpu_uuid), state.sid)
    state.gpu_uuid = None
    if state.loop.current_iter >= 0:
        state.needs_rebase = True
    pipe.zadd(keys.pending(state.gpu_type), {state.sid: state.pending_score()})
