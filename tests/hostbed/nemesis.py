"""A combined nemesis on the multi-host bed: seeded random faults that overlap, a sweep in flight, then a heal
and a checker over the whole history (the Jepsen way).

:func:`plan` draws a schedule from a seed and a duration: partitions of any host (Redis's and the
writer's included), SIGKILLs of any kind of croqq process (a GPU host's supervisor, a GPU's Celery worker
or just its pool child, build, ideate, coordinator, beat, writer), Redis stopped and restarted (its AOF
replayed), a host's clock skewed (the host rebooted under libfaketime, and again without it at the fault's
end), one GPU host lost for good (powered off, never back) and a new GPU host joining.
Faults overlap freely, and one *storm* is always in the schedule: a GPU host partitioned while Redis restarts
while the writer is killed. The same seed gives the same schedule; the run prints it.

:func:`run` boots a :class:`~tests.hostbed.fleet.Fleet` (with a spare GPU host name for the joiner), submits a
sweep sized to outlast the faults, plays the schedule (each fault recorded with its kind, target, start and
end, in seconds from the first fault), heals everything still open, waits for the sweep to finish with no
human action (no ``croqq retry``: the fleet must get there on its own), and checks over the whole history:
every iteration stored exactly once with contiguous ids (commits and rows), each stored result measured
under the epoch that stored it (:func:`croqq.chaos.invariants.epoch_problems`), ``git fsck`` and
``croqq validate`` clean. The :class:`Report` carries the figures: faults by kind, iterations stored, lost,
duplicated, and the time from the heal to the next stored iteration.

A short schedule runs in CI (``tests/multihost/test_nemesis.py``); a long one is a soak command::

    python -m tests.hostbed.nemesis --minutes 30 --seed 7 --json nemesis.json

(root, like every bed; exit 0 when the fleet kept its promises, 1 with the problems and the seed otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from croqq.chaos.invariants import epoch_problems, iteration_commits, stored_iterations
from croqq.delivery import keys
from croqq.patience import Deadline
from croqq.work import alarms
from croqq.work.progress import submission_sids
from tests.hostbed.bed import faketime_available
from tests.hostbed.fleet import GPU_HOSTS, Fleet, FleetConfig

JOINER = "gpu3"
KILLABLE = {  # process kind -> (host, the croqq subcommand it runs, which of them: main | child | all)
    "gpu-supervisor": ("gpu", "worker", "all"),  # `croqq worker`: its GPU workers die with it (PDEATHSIG)
    "gpu-main": ("gpu", "gpu-worker", "main"),  # one Celery worker per GPU, its pool child with it
    "gpu-child": ("gpu", "gpu-worker", "child"),  # the pool child running the GPU step, alone
    "writer": ("writer", "writer", "all"),
    "coordinator": ("build", "coordinator", "all"),
    "beat": ("build", "beat", "all"),
    "build-worker": ("build", "build-worker", "all"),
    "ideate-worker": ("build", "ideate-worker", "all"),
}
WEIGHTS = {"partition": 4, "kill": 5, "redis_restart": 1, "clock_skew": 1}
MEAN_GAP_S = 6.0  # mean time between two fault starts (they last longer than that: they overlap)
SETTLE_S = 5.0  # the sweep runs this long before the first fault
ITERATIONS_PER_MINUTE = 20  # per shape on an idle 2-core machine: sizes a sweep that outlasts the faults
DONE_TIMEOUT_S = 900.0  # unloaded seconds for the sweep to finish after the heal (at least the faults' time)


@dataclass(frozen=True)
class Planned:
    at: float  # seconds from the first fault
    kind: str  # partition | kill | redis_restart | clock_skew | lose_host | join_host
    target: str  # a host, or for a kill "<process kind>@<host>"
    hold: float = 0.0  # how long it lasts (partition, redis_restart, clock_skew); 0: at once
    arg: str = ""  # clock_skew: the libfaketime offset


@dataclass
class Fault:
    kind: str
    target: str
    start: float  # seconds from the first fault, as done
    end: float | None = None  # None: lasted to the heal (set then) or instantaneous (= start)
    arg: str = ""


@dataclass
class Report:
    seed: int
    duration_s: float
    shapes: int
    max_iter: int
    faults: list[Fault]
    faults_by_kind: dict[str, int]
    expected: int = 0
    stored: int = 0
    lost: int = 0
    duplicated: int = 0
    epochs_checked: int = 0
    redispatched: int = (
        0  # steps handed to another worker at a new epoch (their old holder's result is stale)
    )
    in_flight_at_heal: bool = False
    stored_at_heal: int = 0
    heal_to_next_stored_s: float | None = None
    heal_to_done_s: float | None = None
    alarms: list[str] = field(default_factory=list)  # raised and still active at the end (croqq status)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults_by_kind.items()))
        heal = "-" if self.heal_to_next_stored_s is None else f"{self.heal_to_next_stored_s:.1f}s"
        return (
            f"nemesis seed {self.seed}: {len(self.faults)} faults over {self.duration_s:.0f}s ({kinds}); "
            f"{self.shapes} shapes x {self.max_iter + 1} iterations: stored {self.stored}/{self.expected}, "
            f"lost {self.lost}, duplicated {self.duplicated}, epochs checked {self.epochs_checked} "
            f"({self.redispatched} steps re-dispatched at a new epoch); "
            f"heal to next stored {heal} (sweep in flight at the heal: {self.in_flight_at_heal}, "
            f"{self.stored_at_heal} stored by then); {len(self.alarms)} alarm(s) at the end; "
            f"{len(self.problems)} problem(s)"
        )


def plan(seed: int, duration_s: float, skew: bool = True) -> list[Planned]:
    """The schedule for ``seed``: faults starting within ``duration_s`` seconds, sorted by start."""
    rng = random.Random(seed)
    lost, lose_at = rng.choice(GPU_HOSTS), rng.uniform(0.35, 0.6) * duration_s
    join_at = rng.uniform(0.2, 0.8) * duration_s
    out = [Planned(lose_at, "lose_host", lost), Planned(join_at, "join_host", JOINER)]
    storm = rng.uniform(0.1, 0.25) * duration_s  # a partition while Redis restarts while the writer dies
    out += [
        Planned(storm, "partition", rng.choice(GPU_HOSTS), rng.uniform(8, 20)),
        Planned(storm + 1, "redis_restart", "redis", rng.uniform(2, 6)),
        Planned(storm + 2, "kill", "writer@writer"),
    ]
    weights = dict(WEIGHTS, clock_skew=WEIGHTS["clock_skew"] if skew else 0)
    at = rng.expovariate(1 / MEAN_GAP_S)
    while at < duration_s:
        gpus = [
            h for h in (*GPU_HOSTS, JOINER) if (h != lost or at < lose_at) and (h != JOINER or at > join_at)
        ]
        kind = rng.choices(list(weights), list(weights.values()))[0]
        if kind == "partition":
            out.append(Planned(at, kind, rng.choice(["redis", "writer", "build", *gpus]), rng.uniform(2, 20)))
        elif kind == "kill":
            proc = rng.choice(sorted(KILLABLE))
            host = KILLABLE[proc][0]
            out.append(Planned(at, kind, f"{proc}@{rng.choice(gpus) if host == 'gpu' else host}"))
        elif kind == "redis_restart":
            out.append(Planned(at, kind, "redis", rng.uniform(1, 8)))
        else:
            offset = rng.choice([-1, 1]) * rng.randint(20, 120)
            out.append(Planned(at, kind, rng.choice(["writer", "build", *gpus]), rng.uniform(10, 30),
                               f"{offset:+d}s"))  # fmt: skip
        at += rng.expovariate(1 / MEAN_GAP_S)
    return sorted(out, key=lambda p: p.at)


class Nemesis:
    """Plays a schedule on a fleet, keeping the faults that overlap on one host consistent: a host is cut
    off while any partition of it lasts, and a host rebooted for a clock change comes back cut off if so."""

    def __init__(self, fleet: Fleet, log: Callable[[str], None]) -> None:
        self.fleet, self.log = fleet, log
        self.history: list[Fault] = []
        self.cuts: Counter[str] = Counter()
        self.lost: set[str] = set()
        self.redis_down = 0
        self._closers: list[tuple[float, Fault, Callable[[], None]]] = []
        self._t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self._t0

    def play(self, schedule: list[Planned], until: float) -> None:
        """Start each fault at its time, end it after its hold, up to ``until`` s (then :meth:`heal`)."""
        self._t0 = time.monotonic()
        for item in schedule:
            self._close_due(item.at)
            self._sleep_until(item.at)
            self._open(item)
        self._close_due(until)
        self._sleep_until(until)

    def heal(self) -> None:
        """Close every fault still open, now."""
        self._close_due(float("inf"), wait=False)

    def _sleep_until(self, at: float) -> None:
        delay = at - self.now()
        if delay > 0:
            time.sleep(delay)

    def _close_due(self, until: float, wait: bool = True) -> None:
        while self._closers and self._closers[0][0] <= until:
            at, fault, close = self._closers.pop(0)
            if wait:
                self._sleep_until(at)
            close()
            fault.end = round(self.now(), 2)
            self.log(f"t={fault.end:7.2f}s  end   {fault.kind} {fault.target}")

    def _open(self, item: Planned) -> None:
        host = item.target.rpartition("@")[2]
        if host in self.lost:
            return
        fault = Fault(item.kind, item.target, round(self.now(), 2), arg=item.arg)
        self.log(f"t={fault.start:7.2f}s  start {item.kind} {item.target} {item.arg}".rstrip())
        close = getattr(self, f"_{item.kind}")(item)
        self.history.append(fault)
        if close is None:
            fault.end = fault.start
        else:
            self._closers.append((self.now() + item.hold, fault, close))
            self._closers.sort(key=lambda c: c[0])

    # -- one method per fault kind: do it, return what ends it (None: it is over at once) --

    def _partition(self, item: Planned) -> Callable[[], None]:
        name = item.target
        self.cuts[name] += 1
        if self.cuts[name] == 1:
            self.fleet.bed.host(name).link_down()

        def heal() -> None:
            self.cuts[name] -= 1
            if self.cuts[name] == 0 and name not in self.lost:
                self.fleet.bed.host(name).link_up()

        return heal

    def _kill(self, item: Planned) -> None:
        proc, _, name = item.target.partition("@")
        _, command, which = KILLABLE[proc]
        for pid in _croqq_pids(self.fleet.bed.host(name).ps(), command, which):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _redis_restart(self, item: Planned) -> Callable[[], None]:
        self.redis_down += 1
        proc = self.fleet.bed.redis.get("redis")
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

        def start() -> None:
            self.redis_down -= 1
            if self.redis_down == 0:
                self.fleet.bed.start_redis(self.fleet.bed.host("redis"), self.fleet.password)

        return start

    def _clock_skew(self, item: Planned) -> Callable[[], None]:
        name = item.target
        self._reboot(name, item.arg)
        return lambda: None if name in self.lost else self._reboot(name, None)

    def _reboot(self, name: str, faketime: str | None) -> None:
        self.fleet.bed.host(name).restart(faketime=faketime)
        if self.cuts[name]:
            self.fleet.bed.host(name).link_down()
        self.fleet.start_services(name)

    def _lose_host(self, item: Planned) -> None:
        self.lost.add(item.target)
        self.fleet.bed.host(item.target).kill_all(power_off=True)

    def _join_host(self, item: Planned) -> None:
        self.fleet.add_gpu_host(item.target)


def _croqq_pids(ps: dict[int, str], command: str, which: str = "all") -> list[int]:
    """The processes of ``python -m croqq <command>`` (not its restart loop): ``main`` those whose parent
    is not one of them, ``child`` those whose parent is (a Celery pool child), ``all`` both."""
    mine = set()
    for pid, cmdline in ps.items():
        words = cmdline.split()
        if words[1:4] == ["-m", "croqq", command]:  # <python> -m croqq <command> ...
            mine.add(pid)
    if which == "all":
        return sorted(mine)
    return sorted(pid for pid in mine if (_ppid(pid) in mine) == (which == "child"))


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _stored(fleet: Fleet) -> int:
    return int(fleet.client.hget(keys.STATS, "stored") or 0)


def check(fleet: Fleet, submission: str, max_iter: int, report: Report) -> None:
    """The checker over the whole history: fills the report's counts and problems."""
    report.problems += fleet.problems(submission, max_iter)  # validate, exactly once, contiguous, fsck
    commits, rows = iteration_commits(fleet.repo), stored_iterations(fleet.repo)
    sids = submission_sids(fleet.client, submission) or []
    report.expected = len(sids) * (max_iter + 1)
    report.stored = len(set(commits) | set(rows))
    report.lost = report.expected - len(set(commits) & set(rows))
    report.duplicated = sum(n - 1 for n in commits.values() if n > 1) + sum(
        n - 1 for n in rows.values() if n > 1
    )
    report.epochs_checked, wrong = epoch_problems(fleet.repo, fleet.client)
    report.redispatched = int(fleet.client.hget(keys.STATS, "redispatch") or 0)
    report.alarms = [f"{a.field}: {a.message}" for a in alarms.active(fleet.client)]
    report.problems += wrong
    done = fleet.run("writer", "validate", "--dsl", "all")
    if done.returncode != 0:
        report.problems.append(
            f"croqq validate exited {done.returncode}: {done.stdout.strip()} {done.stderr.strip()}"
        )
    unfinished = [s for s, st in fleet.shapes(sids).items() if st.error or st.loop.current_iter < max_iter]
    report.problems += [f"{sid} did not finish" for sid in unfinished]


def run(
    root: Path,
    seed: int,
    duration_s: float,
    shapes: int = 4,
    max_iter: int | None = None,
    log: Callable[[str], None] = print,
    after: Callable[[Fleet], None] | None = None,
) -> Report:
    """Boot a fleet under ``root``, play the seeded schedule with a sweep in flight, heal, check (then
    ``after(fleet)``, before the fleet goes)."""
    skew = faketime_available() is None
    schedule = plan(seed, duration_s, skew)
    if max_iter is None:
        max_iter = max(6, int(ITERATIONS_PER_MINUTE * (SETTLE_S + duration_s) / 60))
    no_skew = "" if skew else f" (no clock skew: {faketime_available()})"
    log(f"nemesis seed {seed}: {len(schedule)} faults over {duration_s:.0f}s, {shapes} shapes x "
        f"{max_iter + 1} iterations{no_skew}")  # fmt: skip
    report = Report(seed, duration_s, shapes, max_iter, [], {})
    with Fleet(root, "nemesis", FleetConfig()) as fleet:
        submission = fleet.submit(max_iter=max_iter, limit=shapes)
        time.sleep(SETTLE_S)
        nemesis = Nemesis(fleet, log)
        try:
            nemesis.play(schedule, duration_s)
        finally:
            nemesis.heal()
            report.faults = nemesis.history
            report.faults_by_kind = dict(Counter(f.kind for f in nemesis.history))
        healed, at_heal = time.monotonic(), _stored(fleet)
        report.stored_at_heal = at_heal
        report.in_flight_at_heal = not _all_done(fleet, submission)
        deadline = Deadline(max(DONE_TIMEOUT_S, duration_s))
        while True:  # no `croqq retry`, no human: the fleet finishes the sweep on its own
            if report.heal_to_next_stored_s is None and _stored(fleet) > at_heal:
                report.heal_to_next_stored_s = round(time.monotonic() - healed, 2)
            if _all_done(fleet, submission) or deadline.expired():
                break
            time.sleep(0.2)
        report.heal_to_done_s = round(time.monotonic() - healed, 2)
        check(fleet, submission, max_iter, report)
        if after is not None:
            after(fleet)
    log(report.summary())
    return report


def _all_done(fleet: Fleet, submission: str) -> bool:
    sids = submission_sids(fleet.client, submission) or []
    summaries = [json.loads(r) if r else {} for r in fleet.client.hmget(keys.SUMMARY, sids)] if sids else []
    return bool(sids) and all(s.get("status") in ("done", "error") for s in summaries)


def _say(line: str) -> None:
    print(line, flush=True)  # a soak run's log is followed as it goes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.hostbed.nemesis", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one)")
    parser.add_argument("--shapes", type=int, default=4, help="shapes in the sweep")
    parser.add_argument("--max-iter", type=int, default=None, help="iterations per shape (default: sized)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the bed's folders (logs, repo)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.shapes < 1:
        parser.error("--minutes must be > 0 and --shapes >= 1")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    root = Path(tempfile.mkdtemp(prefix="cqnemesis-"))
    try:
        report = run(root, seed, args.minutes * 60, args.shapes, args.max_iter, log=_say)
    finally:
        if args.keep:
            print(f"bed kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    for alarm in report.alarms:
        print(f"alarm at the end: {alarm}")
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    if report.problems:
        print(
            f"nemesis: the fleet broke its promises (seed {seed}; rerun with --seed {seed})", file=sys.stderr
        )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
