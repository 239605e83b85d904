"""How many shapes each GPU holds (its pipeline depth), chosen from the step times it observes.

A GPU stays busy while one of its shapes always has a GPU step queued. Each shape alternates between a
GPU step (BASELINE, PROFILE, MEASURE: from its claim to its result) and the steps off the GPU (STORE,
IDEATE, IMPLEMENT: from each one's dispatch to its result, waiting for a worker included). If ``C`` and
``G`` are the off-GPU and GPU seconds of the GPU's shapes, ``1 + C/G`` shapes keep the GPU exactly busy
when every step takes its mean time; the rule adds headroom for the spread::

    depth = ceil(pipeline_headroom x (1 + C / G))

``C`` and ``G`` are sums decayed by ``1 - 1/window`` per observed step, the window being about the steps
of the last MEMORY_CYCLES cycles of every shape (``STEPS_PER_CYCLE x MEMORY_CYCLES x depth``, at least
MIN_WINDOW): a shallow pipeline forgets as fast in time as a deep one, so a GPU that starts shallow learns
its agents' times in a few of their cycles. Means, not a high quantile: in a closed loop of D shapes
around one server the GPU's throughput depends on the mean think time, and the tail only adds spread,
which the headroom covers (with agent times lognormal, median 264 s and p90 15 min, measure 10 s, a
queueing model of the loop is 0.93 busy at headroom 1, 0.995 at 1.2; the default 1.5 also covers an
estimate that lags a growing pipeline, whose longest agent calls finish last, and GPU steps that vary more
than the model's: a shape too many costs memory, within the bounds below, a shape too few GPU time). A
GPU step's wait in its GPU queue counts in neither: a deeper pipeline makes it longer, and counting it
would feed the depth back into itself.

Bounds: at most ``pipeline_depth_max`` (what a GPU host can hold in memory), at most the GPU's fair share
of the shapes of its type (active on the type's healthy GPUs plus pending, divided by those GPUs, rounded
up), so one GPU never takes shapes another GPU would measure; ``pipeline_depth`` until MIN_OBSERVATIONS
steps have been seen. A lower depth never evicts a shape: the GPU just takes no new one until it drains
below it. Note that waiting for an ideate or build worker is off-GPU time too: a cluster short of those
workers gets deeper pipelines (within the bounds), which is the best its GPUs can do.

``CROQQ_PIPELINE_DEPTH_MODE=fixed``: ``pipeline_depth`` on every GPU, with no other bound (as before).

Every step's result adds its seconds to the GPU's totals in the ledger's completion transaction (so
exactly once per step; a shape's seed build and BASELINE come once in its life, not in its cycle, and are
left out); the coordinator folds the new totals into the decayed sums when it fills the GPU (a Lua
script: coordinators may race) and logs a depth that changes. All of it lives in ``croqq:depth:<uuid>``,
so a restarted coordinator carries on, and the depth is recomputed at every fill.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from croqq.delivery import keys
from croqq.delivery.queues import GPU_KINDS
from croqq.delivery.redis_client import strs
from croqq.settings import Settings

if TYPE_CHECKING:
    from croqq.delivery.ledger import StepRecord
    from croqq.placement.registry import GpuEntry

log = logging.getLogger(__name__)

STEPS_PER_CYCLE = 4  # a shape's steps per iteration (store, ideate, implement, measure), about
MEMORY_CYCLES = 5  # the decayed sums remember about this many cycles of each shape
MIN_WINDOW = 50  # steps
MIN_OBSERVATIONS = 20  # steps seen before the depth follows them

# KEYS = depth hash; ARGV = window steps per unit of depth, the smallest window. Folds the totals added
# since the last call into the decayed sums, as if those dn steps had come evenly (a long pause between
# folds weighs no more than the window); returns {off, gpu, steps, depth last chosen} (as strings: Lua
# numbers would be truncated).
_FOLD_LUA = """
local h = redis.call('HMGET', KEYS[1], 'off', 'gpu', 'n', 'off_seen', 'gpu_seen', 'n_seen', 'off_est',
  'gpu_est', 'depth')
local v = {}
for i = 1, 8 do v[i] = tonumber(h[i] or '0') or 0 end
local k = 1 - 1 / math.max(tonumber(ARGV[2]), tonumber(ARGV[1]) * (tonumber(h[9] or '0') or 0))
local dn = math.max(0, v[3] - v[6])
local scale = 1
if dn > 0 then scale = (1 - k ^ dn) / (1 - k) / dn end
local off = v[7] * k ^ dn + math.max(0, v[1] - v[4]) * scale
local gpu = v[8] * k ^ dn + math.max(0, v[2] - v[5]) * scale
redis.call('HSET', KEYS[1], 'off_seen', h[1] or '0', 'gpu_seen', h[2] or '0', 'n_seen', h[3] or '0',
  'off_est', tostring(off), 'gpu_est', tostring(gpu))
return {tostring(off), tostring(gpu), tostring(v[3]), h[9] or '0'}
"""


@dataclass(frozen=True)
class Observed:
    """A GPU's recent step times: decayed off-GPU and GPU seconds, steps seen, the depth last chosen."""

    off_s: float = 0.0
    gpu_s: float = 0.0
    steps: int = 0
    depth: int = 0


def observe(pipe: Any, uuid: str, record: StepRecord, now: float) -> None:
    """Add a finished step's seconds to its shape's GPU's totals (pipe in multi mode)."""
    on_gpu = record.kind in GPU_KINDS
    seconds = now - (record.started_at if on_gpu else record.dispatched_at)
    pipe.hincrbyfloat(keys.depth(uuid), "gpu" if on_gpu else "off", round(max(0.0, seconds), 4))
    pipe.hincrby(keys.depth(uuid), "n", 1)


def rule(obs: Observed, settings: Settings, share: int) -> int:
    """The adaptive depth for these observations, within the memory limit and the fair ``share``."""
    if obs.steps < MIN_OBSERVATIONS or obs.gpu_s <= 0:
        want = settings.pipeline_depth
    else:
        want = math.ceil(settings.pipeline_headroom * (1.0 + obs.off_s / obs.gpu_s))
    return max(1, min(want, settings.pipeline_depth_max, share))


def fair_share(client: redis.Redis, gpu_type: str) -> int:
    """The shapes of a GPU type (active on its healthy GPUs plus pending) per healthy GPU, rounded up."""
    from croqq.placement.registry import HEALTHY, all_gpus

    healthy = [g.uuid for g in all_gpus(client) if g.gpu_type == gpu_type and g.status == HEALTHY]
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.pending(gpu_type))
    for uuid in healthy:
        pipe.scard(keys.active(uuid))
    shapes = sum(int(n) for n in pipe.execute())
    return max(1, math.ceil(shapes / max(1, len(healthy))))


def fold(client: redis.Redis, uuid: str) -> Observed:
    """Fold the GPU's newest step times into its decayed sums; return them."""
    per_depth = STEPS_PER_CYCLE * MEMORY_CYCLES
    off, gpu, steps, depth = strs(client.eval(_FOLD_LUA, 1, keys.depth(uuid), per_depth, MIN_WINDOW))
    return Observed(float(off), float(gpu), int(float(steps)), int(float(depth)))


def choose(client: redis.Redis, settings: Settings, gpu: GpuEntry) -> int:
    """The GPU's depth now (stored, and logged when it changes)."""
    obs = fold(client, gpu.uuid)
    if settings.pipeline_depth_mode == "fixed":
        depth, share = settings.pipeline_depth, 0
    else:
        share = fair_share(client, gpu.gpu_type)
        depth = rule(obs, settings, share)
    if depth != obs.depth:
        client.hset(keys.depth(gpu.uuid), "depth", str(depth))
        ratio = obs.off_s / obs.gpu_s if obs.gpu_s > 0 else 0.0
        log.info(
            "GPU %s pipeline depth %d -> %d (%s; %.1f off-GPU s per GPU s over %d steps, fair share %d)",
            gpu.uuid,
            obs.depth,
            depth,
            settings.pipeline_depth_mode,
            ratio,
            obs.steps,
            share,
        )
    return depth


def current(client: redis.Redis, uuid: str) -> int:
    """The depth last chosen for a GPU (0: none yet)."""
    raw = client.hget(keys.depth(uuid), "depth")
    return int(raw) if raw else 0
