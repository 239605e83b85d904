"""How many shapes each GPU holds (its pipeline depth), chosen from the step times it observes.

A GPU stays busy while one of its shapes always has a GPU step queued. Each shape alternates between a
GPU step (BASELINE, PROFILE, MEASURE) and steps off the GPU (STORE, IDEATE, IMPLEMENT), each counted from
its claim to its result. With ``C`` and ``G`` the off-GPU and GPU seconds of the GPU's shapes, ``1 + C/G``
shapes keep it exactly busy at mean step times; headroom covers the spread::

    depth = ceil(pipeline_headroom x (1 + C / G))

Means, not a quantile: in a closed loop the GPU's throughput follows the mean off-GPU time. ``C`` and ``G``
decay over about the last MEMORY_CYCLES cycles of every shape, so a shallow pipeline forgets as fast in time
as a deep one. No step's wait in its queue counts: a queue that is long because its workers are saturated
(the agents, the builders, a CPU-bound machine) would grow the depth, the depth the queue, and so on until
every shape of the submission was active at once; more shapes never make a saturated pool faster.

The depths are the admission window: shapes beyond them wait in their type's pending set in the schedule's
order and take the slot of a shape that finishes, so a long submission finishes shapes as it goes.

Bounds: ``pipeline_depth_max``, the GPU's fair share of its type's shapes, and ``pipeline_depth`` until
MIN_OBSERVATIONS steps have been seen; a lower depth never evicts a shape.
``CROQQ_PIPELINE_DEPTH_MODE=fixed``: ``pipeline_depth`` on every GPU, with no other bound.

A step's seconds are added once, in the ledger's completion transaction; the coordinator folds them into the
decayed sums at each fill (a Lua script: coordinators may race). All of it lives in ``croqq:depth:<uuid>``,
so a restarted coordinator carries on.
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
    """Add a finished step's seconds, claim to result, to its shape's GPU's totals (pipe in multi mode)."""
    on_gpu = record.kind in GPU_KINDS
    seconds = now - (record.started_at or record.dispatched_at)  # one never claimed: from its dispatch
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
