"""How long live state takes to agree with git again after Redis forgets.

On the writer benchmark's results repo with every shape active, one full
:func:`croqq.work.reconcile.reconcile` pass each: after FLUSHALL (``reconcile_268_after_flush_s``), after
Redis was restored one iteration behind git (``reconcile_268_rewound_s``), and with nothing to repair
(``reconcile_268_agreeing_s``, the cost of the scheduled pass)."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from benchmarks import writer_bench
from croqq.delivery import keys
from croqq.delivery.redis_client import strs
from croqq.processes.redis_server import RedisServer
from croqq.processes.runtime import Runtime
from croqq.settings import Settings
from croqq.work.reconcile import reconcile

log = logging.getLogger(__name__)


def _rewind_all(rt: Runtime) -> int:
    """Every shape's live loop one stored iteration behind the repo (what an older snapshot holds)."""
    count = 0
    for sid in strs(rt.client.smembers(keys.SHAPES)):
        state = rt.ledger.load_shape(sid)
        if state is None or state.loop.current_iter < 1:
            continue
        state.loop = state.loop.model_copy(update={"current_iter": state.loop.current_iter - 1})
        rt.client.set(keys.shape(sid), state.dumps())
        count += 1
    return count


def _timed(rt: Runtime) -> tuple[float, dict[str, int]]:
    started = time.perf_counter()
    out = reconcile(rt)
    return time.perf_counter() - started, out


def run(work_dir: Path) -> dict[str, float | int]:
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    hot, cold, _ = writer_bench._streams()
    repo = work_dir / "repo"
    log.info("pre-filling a 268-shape results repo (%d iterations) ...", len(hot) + len(cold))
    writer_bench._prefill(repo, hot + cold)
    with RedisServer(work_dir / "redis") as server:
        settings = Settings(broker_url=server.url, results_repo=repo, run_dir=work_dir / "run")
        rt = Runtime(settings, publisher=lambda records, pipe: None)
        rt.client.flushall()
        after_flush, flushed = _timed(rt)
        rewound = _rewind_all(rt)
        after_rewind, adopted = _timed(rt)
        agreeing, nothing = _timed(rt)
    shapes = int(flushed.get("registered", 0))
    log.info(
        "reconcile: %d shapes registered in %.2f s, %d adopted in %.2f s, no-op pass %.2f s",
        shapes,
        after_flush,
        adopted.get("adopted", 0),
        after_rewind,
        agreeing,
    )
    assert shapes == 268 and adopted.get("adopted", 0) == rewound and not any(nothing.values())
    return {
        "reconcile_shapes": shapes,
        "reconcile_268_after_flush_s": round(after_flush, 3),
        "reconcile_268_rewound_s": round(after_rewind, 3),
        "reconcile_268_agreeing_s": round(agreeing, 3),
    }
