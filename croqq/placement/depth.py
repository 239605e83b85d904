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
# numbers would be truncated). Nothing new since the last call: no write (an idle GPU's fill costs no AOF
# append).
_FOLD_LUA = """
local h = redis.call('HMGET', KEYS[1], 'off', 'gpu', 'n', 'off_seen', 'gpu_seen', 'n_seen', 'off_est',
  'gpu_est', 'depth')
local v = {}
for i = 1, 8 do v[i] = tonumber(h[i] or '0') or 0 end
local k = 1 - 1 / math.max(tonumber(ARGV[2]), tonumber(ARGV[1]) * (tonumber(h[9] or '0') or 0))
local dn = math.max(0, v[3] - v[6])
local scale = 1
if dn > 0 then scale = (1 - k ^ dn) / (1 - k) / dn end
if dn == 0 and v[1] == v[4] and v[2] == v[5] then
  return {h[7] or '0', h[8] or '0', tostring(v[3]), h[9] or '0'}
end
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


@dataclass(frozen=True)
class Load:
    """Shapes on the registry's healthy GPUs and waiting for each of their types, read in one round trip."""

    active: dict[str, int]  # per healthy GPU
    pending: dict[str, int]  # per GPU type of a healthy GPU
    shares: dict[str, int]  # per GPU type of a healthy GPU: its shapes (active plus pending) per GPU, up

    def share(self, gpu_type: str) -> int:
        """The fair share of a GPU of ``gpu_type`` (1 for a type with no healthy GPU)."""
        return self.shares.get(gpu_type, 1)


def load(client: redis.Redis, gpus: list[GpuEntry]) -> Load:
    """The Load of the healthy GPUs among ``gpus`` (the registry's, for fair shares)."""
    from croqq.placement.registry import HEALTHY

    healthy = {g.uuid: g.gpu_type for g in gpus if g.status == HEALTHY}
    kinds = sorted(set(healthy.values()))
    pipe = client.pipeline(transaction=False)
    for gpu_type in kinds:
        pipe.zcard(keys.pending(gpu_type))
    for uuid in healthy:
        pipe.scard(keys.active(uuid))
    counts = [int(n) for n in pipe.execute()]
    pending = dict(zip(kinds, counts[: len(kinds)], strict=True))
    active = dict(zip(healthy, counts[len(kinds) :], strict=True))
    shapes, members = dict(pending), dict.fromkeys(kinds, 0)
    for uuid, gpu_type in healthy.items():
        shapes[gpu_type] += active[uuid]
        members[gpu_type] += 1
    shares = {t: max(1, math.ceil(shapes[t] / members[t])) for t in kinds}
    return Load(active=active, pending=pending, shares=shares)


def _fold(conn: Any, uuid: str) -> Any:
    return conn.eval(_FOLD_LUA, 1, keys.depth(uuid), STEPS_PER_CYCLE * MEMORY_CYCLES, MIN_WINDOW)


def _observed(raw: Any) -> Observed:
    off, gpu, steps, depth = strs(raw)
    return Observed(float(off), float(gpu), int(float(steps)), int(float(depth)))


def fold(client: redis.Redis, uuid: str) -> Observed:
    """Fold the GPU's newest step times into its decayed sums; return them."""
    return _observed(_fold(client, uuid))


def choose_all(client: redis.Redis, settings: Settings, gpus: list[GpuEntry], now: Load) -> dict[str, int]:
    """Each GPU's depth now (stored, and logged when it changes): their folds in one round trip, their
    fair shares from ``now``. A fill tick over a fleet costs a few commands per GPU, not one per GPU pair."""
    pipe = client.pipeline(transaction=False)
    for gpu in gpus:
        _fold(pipe, gpu.uuid)
    chosen: dict[str, int] = {}
    changed = client.pipeline(transaction=False)
    for gpu, raw in zip(gpus, pipe.execute(), strict=True):
        obs = _observed(raw)
        if settings.pipeline_depth_mode == "fixed":
            depth, share = settings.pipeline_depth, 0
        else:
            share = now.share(gpu.gpu_type)
            depth = rule(obs, settings, share)
        chosen[gpu.uuid] = depth
        if depth != obs.depth:
            changed.hset(keys.depth(gpu.uuid), "depth", str(depth))
            _log_change(gpu.uuid, obs, depth, settings, share)
    changed.execute()
    return chosen


def choose(client: redis.Redis, settings: Settings, gpu: GpuEntry) -> int:
    """One GPU's depth now (:func:`choose_all`, its fair share from the registry)."""
    from croqq.placement.registry import all_gpus

    return choose_all(client, settings, [gpu], load(client, all_gpus(client)))[gpu.uuid]


def _log_change(uuid: str, obs: Observed, depth: int, settings: Settings, share: int) -> None:
    ratio = obs.off_s / obs.gpu_s if obs.gpu_s > 0 else 0.0
    log.info(
        "GPU %s pipeline depth %d -> %d (%s; %.1f off-GPU s per GPU s over %d steps, fair share %d)",
        uuid,
        obs.depth,
        depth,
        settings.pipeline_depth_mode,
        ratio,
        obs.steps,
        share,
    )


def current(client: redis.Redis, uuid: str) -> int:
    """The depth last chosen for a GPU (0: none yet)."""
    raw = client.hget(keys.depth(uuid), "depth")
    return int(raw) if raw else 0
