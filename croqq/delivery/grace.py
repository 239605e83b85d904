"""After Redis restarts: one lease TTL for everything whose renewals stay in Redis's memory.

The beats that every running step and every GPU worker make (step lease deadlines, worker liveness
scores, GPU lease expiries) are kept out of the AOF: with ``appendfsync always`` each would cost an fsync,
and a fleet makes thousands a second. What a restarted Redis comes back with (a restart, a restore from
the AOF, a failover to a replica) is therefore what the claims persisted: the step deadlines of the claims,
the worker scores of the registrations, GPU leases long expired. On the first housekeeping tick under a
new Redis run id, :func:`grant` gives each of them one TTL from then: every running step its deadline,
every registered worker a fresh beat, every registered GPU whose lease is gone that lease back for the
owner its registry entry names. A live holder renews within the TTL; a dead one's lapses one TTL later,
as it would have without the restart.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import redis

from croqq.delivery import clock, keys
from croqq.delivery.redis_client import redis_run_id, strs, text

log = logging.getLogger(__name__)

# KEYS: running steps, the run id seen, workers, then per GPU its lease and its registry entry;
# ARGV: this run id, the steps' new deadline, now, the TTL in ms. The first run id ever seen grants nothing.
_GRANT = """
local seen = redis.call('GET', KEYS[2])
if seen == ARGV[1] then return {0, 0, 0} end
redis.call('SET', KEYS[2], ARGV[1])
if not seen then return {0, 0, 0} end
local steps = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
for _, id in ipairs(steps) do redis.call('ZADD', KEYS[1], ARGV[2], id) end
local workers = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[3])
for _, node in ipairs(workers) do redis.call('ZADD', KEYS[3], ARGV[3], node) end
local gpus = 0
for i = 4, #KEYS - 1, 2 do
  local owner = redis.call('HGET', KEYS[i + 1], 'owner')
  if owner and owner ~= '' and redis.call('SET', KEYS[i], owner, 'PX', ARGV[4], 'NX') then gpus = gpus + 1 end
end
return {#steps, #workers, gpus}
"""


class Granted(NamedTuple):
    steps: int
    workers: int
    gpus: int


def grant(client: redis.Redis, lease_ttl_s: float) -> Granted:
    """One TTL for every running step, registered worker and lost GPU lease, once per Redis run id."""
    run_id = redis_run_id(client)
    if text(client.get(keys.LEASE_RUN)) == run_id:  # every tick but the first of a run: two reads
        return Granted(0, 0, 0)
    uuids = sorted(strs(client.smembers(keys.GPUS)))
    now = clock.now(client)
    gpu_keys = [k for uuid in uuids for k in (keys.lease(f"gpu:{uuid}"), keys.gpu(uuid))]
    raw = client.eval(
        _GRANT,
        3 + len(gpu_keys),
        keys.RUNNING,
        keys.LEASE_RUN,
        keys.WORKERS,
        *gpu_keys,
        run_id,
        repr(now + lease_ttl_s),
        repr(now),
        int(lease_ttl_s * 1000),
    )
    granted = Granted(*(int(n) for n in raw))
    if any(granted):
        log.warning(
            "Redis restarted: %d running step(s), %d worker(s) and %d GPU lease(s) get one lease TTL",
            *granted,
        )
    return granted
