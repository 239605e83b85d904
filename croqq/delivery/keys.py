"""Every Redis key croqq uses, with its type and lifetime (the one place for key names).

croqq:shape:<sid>              string  packed ShapeState (.dumps): a shape's loop (sid = <gpu>/<dsl>/<key>)
croqq:shapes                   set     all sids ever submitted
croqq:summary                  hash    sid -> one-line JSON summary (status views read only this)
croqq:pending:<gpu type>       zset    sids waiting for a GPU, score = schedule rank (negative: resumed)
croqq:active:<gpu uuid>        set     sids assigned to a GPU (pipeline depth bounds its size)
croqq:ideas:<sid>              set     content hashes already proposed for a shape (dedup)
croqq:step:<step id>           hash    step ledger record: sid kind epoch status owner queue payload times
croqq:running                  zset    step ids running, score = lease deadline (heartbeats push it)
croqq:queued                   zset    step ids queued, score = last publish time
croqq:queued:store             zset    the STORE steps among them, score = queued time (the writer drains
                                       the oldest first; a claim or a drop removes one)
croqq:store_wake               string  a wake-up message for the writer is on its way (SET NX by a STORE's
                                       publish, deleted by the writer before it drains); PX = lease TTL
croqq:lease_run                string  the Redis run id the in-memory renewals belong to (step deadlines,
                                       worker beats, GPU leases are not persisted: under a new run id each
                                       gets one TTL, croqq/delivery/grace.py)
croqq:outbox                   zset    step ids committed but maybe not yet published, score = time
croqq:gpu:<uuid>               hash    GPU registry entry: host type queue status reason quarantined_at
                                       current since (a stored quarantine survives re-registration)
croqq:gpus                     set     all GPU uuids
croqq:lease:<name>             string  singleton/GPU lease, or a worker's name (node:<name>@<host>,
                                       croqq/processes/naming.py): owner id, PX = TTL (renewed by heartbeat;
                                       a GPU lease's renewals in memory only)
croqq:worker:<node>            hash    a worker process: queues pid host started
croqq:workers                  zset    worker nodes, score = last heartbeat (in memory only)
croqq:queue_reset:<queue>      string  last time a consumer of the queue died or restarted
croqq:stats                    hash    counters (stored, attempts, keep, discard, fail, redispatch,
                                       store_wakeups, lease_expired, artifact_bytes_put, artifact_bytes_got,
                                       ...)
croqq:commit_seconds           hash    the writer's commit times: le:<bound> -> commits in that bucket (not
                                       cumulative; le:+Inf above the last), sum, count (croqq.work.stats)
croqq:repo_bytes               string  the results repo's .git size in bytes, as the writer last measured it
croqq:artifact:<sha256>        string  a build artifact's bytes (a binary, the sim's JSON), stored once
                                       (SET NX); EX = artifact_ttl_s, refreshed on every put and get
croqq:agents                   set     names of the agents that have a croqq:agent:<name> hash
croqq:overhead                 list    per-iteration control-plane overhead in ms (newest first, capped)
croqq:gpu_busy:<uuid>          hash    busy seconds, step and measurement counts per GPU (duty)
croqq:depth:<uuid>             hash    a GPU's pipeline depth: decayed off-GPU and GPU step seconds of its
                                       shapes, observations, the depth last chosen (croqq.placement.depth)
croqq:submission:<id>          string  JSON list of the sids of one submit
croqq:submissions              list    submission ids, newest last
croqq:submitted:<id>           string  JSON SubmitMessage of a submission the writer has not recorded yet
croqq:host_problems            hash    worker label -> JSON: why that worker's host refuses its work
croqq:alarms                   hash    <name>@<worker label> -> JSON: what a human must see (work.alarms)
croqq:unrecorded               zset    submission ids not yet in the results repo, score = submit time
croqq:simfault:<uuid>          hash    simulated GPU faults: kind -> JSON {"until": ts|null, "value": int}
croqq:barrier:<name>           string  test barriers (a step blocks while the key exists)
croqq:tick:<name>              string  rate limiter for periodic housekeeping (PX = period)
croqq:redis_run                string  the Redis run id live state was last reconciled against git under
"""

from __future__ import annotations

PREFIX = "croqq"

SHAPES = f"{PREFIX}:shapes"
SUMMARY = f"{PREFIX}:summary"
RUNNING = f"{PREFIX}:running"
QUEUED = f"{PREFIX}:queued"
QUEUED_STORES = f"{PREFIX}:queued:store"
STORE_WAKE = f"{PREFIX}:store_wake"
LEASE_RUN = f"{PREFIX}:lease_run"
OUTBOX = f"{PREFIX}:outbox"
GPUS = f"{PREFIX}:gpus"
WORKERS = f"{PREFIX}:workers"
STATS = f"{PREFIX}:stats"
SUBMISSIONS = f"{PREFIX}:submissions"
OVERHEAD = f"{PREFIX}:overhead"
COMMIT_SECONDS = f"{PREFIX}:commit_seconds"
COMPILE_SECONDS = f"{PREFIX}:compile_seconds"
REPO_BYTES = f"{PREFIX}:repo_bytes"
AGENTS = f"{PREFIX}:agents"
REDIS_RUN = f"{PREFIX}:redis_run"

STEP_TTL_S = 6 * 3600  # finished step records linger this long to drop late duplicate messages


def shape(sid: str) -> str:
    return f"{PREFIX}:shape:{sid}"


def pending(gpu_type: str) -> str:
    return f"{PREFIX}:pending:{gpu_type}"


def active(gpu_uuid: str) -> str:
    return f"{PREFIX}:active:{gpu_uuid}"


def ideas(sid: str) -> str:
    return f"{PREFIX}:ideas:{sid}"


def history(sid: str) -> str:
    return f"{PREFIX}:history:{sid}"


def agent_health(agent: str) -> str:
    return f"{PREFIX}:agent:{agent}"


AGENT_BUDGET = f"{PREFIX}:agent_budget"


def step(step_id: str) -> str:
    return f"{PREFIX}:step:{step_id}"


def gpu(uuid: str) -> str:
    return f"{PREFIX}:gpu:{uuid}"


def lease(name: str) -> str:
    return f"{PREFIX}:lease:{name}"


def worker(node: str) -> str:
    return f"{PREFIX}:worker:{node}"


def queue_reset(queue: str) -> str:
    return f"{PREFIX}:queue_reset:{queue}"


def artifact(sha256: str) -> str:
    return f"{PREFIX}:artifact:{sha256}"


def gpu_busy(uuid: str) -> str:
    return f"{PREFIX}:gpu_busy:{uuid}"


def depth(uuid: str) -> str:
    return f"{PREFIX}:depth:{uuid}"


def submission(sub_id: str) -> str:
    return f"{PREFIX}:submission:{sub_id}"


UNRECORDED = f"{PREFIX}:unrecorded"
HOST_PROBLEMS = f"{PREFIX}:host_problems"
ALARMS = f"{PREFIX}:alarms"


def submitted(sub_id: str) -> str:
    return f"{PREFIX}:submitted:{sub_id}"


def simfault(uuid: str) -> str:
    return f"{PREFIX}:simfault:{uuid}"


def barrier(name: str) -> str:
    return f"{PREFIX}:barrier:{name}"


def tick(name: str) -> str:
    return f"{PREFIX}:tick:{name}"
