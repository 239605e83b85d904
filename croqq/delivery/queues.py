"""Every queue name, and which queue each step kind goes to.

control                 coordinator: submit, fill, reconcile
build.<dsl>             IMPLEMENT (materialize + compile) of one kernel family: a build worker consumes
                        the queue of each family its host can build (one without that family's
                        package takes none of its work, and nothing parks)
ideate                  IDEATE (the proposer; rate-limited)
store                   STORE (the single writer), and everything that reads the results repo
gpu.<gpu uuid>          BASELINE, PROFILE, MEASURE on one GPU (one worker process per GPU)
"""

from __future__ import annotations

from typing import Literal

CONTROL = "control"
BUILD = "build"  # the prefix of every family's build queue
IDEATE = "ideate"
STORE = "store"

StepKind = Literal["baseline", "profile", "ideate", "implement", "measure", "store"]
GPU_KINDS: frozenset[str] = frozenset({"baseline", "profile", "measure"})
SHARED_QUEUE: dict[str, str] = {"ideate": IDEATE, "store": STORE}  # implement: build_queue(dsl)

# Celery task names, one per queue family
TASK_GPU = "croqq.step.gpu"
TASK_BUILD = "croqq.step.build"
TASK_IDEATE = "croqq.step.ideate"
TASK_STORE = "croqq.step.store"
TASK_SUBMIT = "croqq.control.submit"
TASK_FILL = "croqq.control.fill"
TASK_RECONCILE = "croqq.control.reconcile"
TASK_GIT_RECONCILE = "croqq.store.git_reconcile"
TASK_SUMMARY = "croqq.store.summary"
TASK_FLUSH = "croqq.store.flush"
TASK_RECORD = "croqq.store.record_submissions"
TASK_GPU_RECHECK = "croqq.gpu.recheck"

STEP_TASK: dict[str, str] = {
    "baseline": TASK_GPU,
    "profile": TASK_GPU,
    "measure": TASK_GPU,
    "ideate": TASK_IDEATE,
    "implement": TASK_BUILD,
    "store": TASK_STORE,
}


def build_queue(dsl: str) -> str:
    """The IMPLEMENT steps of one kernel family (``build.cutlass``)."""
    return f"{BUILD}.{dsl}"


def gpu_queue(uuid: str) -> str:
    """A GPU's queue is named by its UUID alone: a worker that comes back on another host name (a
    re-created pod) consumes the same queue, and the steps waiting in it (hostnames are labels)."""
    return f"gpu.{uuid}"


def is_gpu_queue(queue: str) -> bool:
    return queue.startswith("gpu.")
