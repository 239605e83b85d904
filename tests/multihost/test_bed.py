"""The multi-host test bed itself (tests/hostbed/bed.py): hostnames, private folders, a private network
with a password-protected Redis over TCP, partitions, losing every process of a host, restarts, clock skew,
and a clean machine afterwards. One bed per module; tests that break a host use a host of their own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from croqq.patience import wait_until
from tests.hostbed.bed import (
    BRIDGE,
    HOST_IFACE,
    NETNS_DIR,
    PREFIX,
    Bed,
    Host,
    bed_available,
    cleanup_stale,
    faketime_available,
)

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret pw/+"  # needs URL quoting
WAIT_S = 120.0  # unloaded seconds (croqq.patience) for something that must come
PATIENT = {"socket_connect_timeout": 60, "socket_timeout": 60}  # a client expected to succeed

_REASON = bed_available()
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.timeout(900),  # a hang guard: the first test also boots the module's bed
    pytest.mark.skipif(_REASON is not None, reason=f"host bed unavailable: {_REASON}"),
]


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    with Bed(tmp_path_factory.mktemp("bed"), "tbed") as bed:
        bed.add_host("redis")
        bed.add_host("alpha")
        bed.add_host("beta", hostname="gpu-node-7")
        yield bed


@pytest.fixture(scope="module")
def url(bed: Bed) -> str:
    return bed.start_redis(bed.hosts["redis"], PASSWORD)


def _ping_code(url: str, **kwargs: object) -> str:
    """Python, run inside a host: print one JSON line {"ping": ..., "error": ...}."""
    return textwrap.dedent(f"""
        import json, redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        try:
            client = redis.Redis.from_url({url!r}, retry=Retry(NoBackoff(), 0), **{kwargs!r})
            print(json.dumps({{"ping": client.ping()}}))
        except Exception as exc:
            print(json.dumps({{"ping": False, "error": type(exc).__name__ + ": " + str(exc)}}))
    """)


def _ping_from(host: Host, url: str, **kwargs: object) -> dict[str, object]:
    out = host.python(_ping_code(url, **kwargs), timeout=WAIT_S).stdout.strip().splitlines()
    assert out, f"no output from {host.name}"
    result: dict[str, object] = json.loads(out[-1])
    return result


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False


def _connect(client: redis.Redis, what: str) -> None:
    """Ping until a connection of ``client`` answers (it stays in the pool): a client with short
    timeouts, kept short for the ping that is meant to fail later, retried where success is expected."""
    wait_until(lambda: _pings(client), WAIT_S, what)


def test_every_host_has_its_own_hostname(bed: Bed) -> None:
    machine = socket.gethostname()
    seen = {}
    for host in bed.hosts.values():
        out = host.run(["sh", "-c", "hostname; cat /proc/sys/kernel/hostname; cat /etc/hostname"], check=True)
        names = out.stdout.split()
        assert names == [host.hostname] * 3, names
        seen[host.name] = names[0]
    assert seen == {"redis": "redis", "alpha": "alpha", "beta": "gpu-node-7"}
    assert socket.gethostname() == machine  # the machine's own hostname is untouched
    # the bed's /etc/hosts names every host
    hosts_file = bed.hosts["alpha"].run(["getent", "hosts", "gpu-node-7"]).stdout.split()
    assert hosts_file[:1] == [bed.hosts["beta"].ip]


def test_host_sees_its_own_folder_only(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    alpha, beta = bed.hosts["alpha"], bed.hosts["beta"]
    alpha.run(["sh", "-c", "echo alpha-data > secret"], check=True)
    assert (alpha.dir / "secret").read_text() == "alpha-data\n"  # really in its folder on the machine
    probe = (
        f"ls {bed.root / 'hosts'}; test -e {alpha.dir / 'secret'} && echo SEES-ALPHA; "
        f"echo mine > own && cat {beta.dir / 'own'}; test -f {REPO / 'pyproject.toml'} && echo SEES-REPO"
    )
    out = beta.run(["sh", "-c", probe], check=True).stdout.split()
    assert out == ["beta", "mine", "SEES-REPO"], out
    assert alpha.run(["ls", str(bed.root / "hosts")], check=True).stdout.split() == ["alpha"]
    # environment: exactly what is given plus the basics; TMPDIR and HOME inside the host's folder
    monkeypatch.setenv("CROQQ_LEAK_CHECK", "1")
    code = "import json, os, tempfile; print(json.dumps([dict(os.environ), tempfile.gettempdir()]))"
    env, tmp = json.loads(beta.python(code, env={"CROQQ_GIVEN": "yes"}, check=True).stdout)
    assert "CROQQ_LEAK_CHECK" not in env and env["CROQQ_GIVEN"] == "yes"
    assert {key for key in env if key.startswith("CROQQ_")} == {"CROQQ_GIVEN"}
    assert tmp == str(beta.tmp_dir) and env["HOME"] == str(beta.dir)


def test_hosts_reach_redis_over_tcp_only_with_the_password(bed: Bed, url: str) -> None:
    redis_host, alpha = bed.hosts["redis"], bed.hosts["alpha"]
    assert url.startswith("redis://:s3cret%20pw%2F%2B@" + redis_host.ip + ":6379/")
    code = textwrap.dedent(f"""
        import json, socket, redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        once = Retry(NoBackoff(), 0)  # an authentication error is final: no retries with backoff
        good = redis.Redis.from_url({url!r}, decode_responses=True)
        good.set("from", socket.gethostname())
        out = {{"from": good.get("from")}}
        try:
            redis.Redis(host={redis_host.ip!r}, port=6379, retry=once).ping()
            out["anon"] = "answered"
        except redis.AuthenticationError as exc:
            out["anon"] = "refused: " + str(exc)
        try:
            redis.Redis(host={redis_host.ip!r}, port=6379, password="wrong", retry=once).ping()
            out["wrong"] = "answered"
        except redis.AuthenticationError as exc:
            out["wrong"] = "refused: " + str(exc)
        print(json.dumps(out))
    """)
    result = json.loads(alpha.python(code, check=True).stdout)
    assert result["from"] == "alpha"
    assert result["anon"].startswith("refused") and result["wrong"].startswith("refused"), result
    # the server runs with the broker configuration, TCP only, data in the Redis host's folder
    client = alpha.redis_client(url, decode_responses=True, **PATIENT)
    try:
        config = {key: client.config_get(key)[key] for key in
                  ("appendonly", "appendfsync", "maxmemory-policy", "unixsocket", "bind", "dir")}  # fmt: skip
        assert client.get("from") == "alpha"
    finally:
        client.close()
    assert config == {
        "appendonly": "yes",
        "appendfsync": "always",
        "maxmemory-policy": "noeviction",
        "unixsocket": "",
        "bind": redis_host.ip,
        "dir": str(redis_host.dir / "redis"),
    }
    assert list((redis_host.dir / "redis").glob("appendonlydir/*.aof"))
    assert bed.redis["redis"].inner_pid in redis_host.pids()


def test_link_down_partitions_a_host_and_link_up_heals_it(bed: Bed, url: str) -> None:
    alpha, beta = bed.hosts["alpha"], bed.hosts["beta"]
    client = beta.redis_client(
        url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        _connect(client, "beta's client before the partition")
        beta.link_down()
        try:
            assert not beta.linked
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                client.ping()  # an established connection: nothing comes back (socket_timeout bounds it)
            fresh = _ping_from(beta, url, socket_connect_timeout=0.5)  # a new process, a new connection
            assert fresh["ping"] is False, fresh
            assert _ping_from(alpha, url, **PATIENT)["ping"] is True  # the rest is fine
        finally:
            beta.link_up()
        assert beta.linked
        _connect(client, "beta's client after link_up")
        assert _ping_from(beta, url, **PATIENT)["ping"] is True
    finally:
        client.close()


def test_kill_all_kills_every_process_and_restart_gives_a_working_host(bed: Bed, url: str) -> None:
    gamma = bed.add_host("gamma")
    gamma.run(["sh", "-c", "echo kept > disk"], check=True)
    own_url = bed.start_redis(gamma, "gamma-pw")  # a Redis of its own, to see its AOF survive the kill
    own = gamma.redis_client(own_url, **PATIENT)
    try:
        own.set("survives", "yes")
    finally:
        own.close()
    first = gamma.spawn(["sleep", "300"])
    second = gamma.spawn(["sh", "-c", "sleep 300 & sleep 300 & wait"])  # with children of its own
    wait_until(lambda: len(gamma.pids()) >= 5, WAIT_S, "gamma's 5 processes", every_s=0.02)
    pids = gamma.pids()
    assert len(pids) == 5, gamma.ps()  # redis-server, sleep, sh and its two sleeps
    assert first.inner_pid in pids and second.inner_pid in pids
    assert first.host_pid is not None and first.host_pid < 100  # numbered inside the host's PID namespace
    assert first.log_path is not None and first.log_path.parent == gamma.log_dir and first.log_path.exists()
    old_init = gamma.init_pid
    gamma.kill_all()
    assert first.wait(60) == -signal.SIGKILL and second.wait(60) == -signal.SIGKILL  # kill_all reaped them
    assert [pid for pid in [*pids, old_init] if Path(f"/proc/{pid}").exists()] == []
    assert gamma.pids() == [] and not gamma.running

    gamma.restart(hostname="gamma-reborn")
    assert gamma.running and gamma.init_pid != old_init
    assert gamma.run(["hostname"], check=True).stdout.strip() == "gamma-reborn"
    assert gamma.run(["cat", "disk"], check=True).stdout == "kept\n"  # same private folder
    assert _ping_from(gamma, url, **PATIENT)["ping"] is True  # same address, network works
    assert bed.start_redis(gamma, "gamma-pw") == own_url
    own = gamma.redis_client(own_url, decode_responses=True, **PATIENT)
    try:
        assert own.get("survives") == "yes"  # replayed from its AOF in the host's folder
    finally:
        own.close()
    # a power cut: the host's network goes first, then every process; restart brings both back
    client = gamma.redis_client(
        url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        _connect(client, "gamma's client before the power cut")
        gamma.kill_all(power_off=True)
        assert not (NETNS_DIR / gamma.netns).exists()
        gamma.restart()
        assert gamma.run(["hostname"], check=True).stdout.strip() == "gamma-reborn"
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            client.ping()  # its old connection died with the old network stack, without a word
    finally:
        client.close()
    fresh = gamma.redis_client(url, **PATIENT)
    try:
        assert fresh.ping()  # a new connection from the new network stack
    finally:
        fresh.close()


@pytest.mark.skipif(faketime_available() is not None, reason=f"{faketime_available()}")
def test_faketime_moves_one_hosts_wall_clock_only(bed: Bed, url: str) -> None:
    skew = bed.add_host("skew", faketime="+90s")
    script = "date +%s; env -i /usr/bin/date +%s"  # also a process that dropped its environment
    # each clock read lies between `before` and `after` (the machine's clock), however slow the run
    before = time.time()
    skewed = [int(x) for x in skew.run(["sh", "-c", script], check=True).stdout.split()]
    after = time.time()
    for value in skewed:
        assert before + 85 <= value <= after + 100, (skewed, before, after)
    before = time.time()
    normal = [int(x) for x in bed.hosts["alpha"].run(["sh", "-c", script], check=True).stdout.split()]
    after = time.time()
    for value in normal:
        assert before - 5 <= value <= after + 10, (normal, before, after)
    # time.sleep works there (libfaketime with an unfaked monotonic clock makes it fail with EINVAL)
    code = f"import json, redis, time; time.sleep(0.05); r = redis.Redis.from_url({url!r}); r.ping(); "
    code += "a = time.time(); s, us = r.time(); b = time.time(); print(json.dumps([a, s + us / 1e6, b]))"
    first, theirs, last = json.loads(skew.python(code, check=True).stdout)
    # its clock is ahead of Redis's, which is the bed's one clock: by (first - theirs) .. (last - theirs)
    assert first - theirs <= 100 and last - theirs >= 85, (first, theirs, last)


def test_bed_cleans_up_after_itself(tmp_path: Path, bed: Bed, url: str) -> None:
    before = _root_links()
    other = Bed(tmp_path, "tclean")
    assert other.subnet != bed.subnet
    one = other.add_host("one")
    other.add_host("two")
    other.start_redis(one, "pw")
    processes = [h.init_pid for h in other.hosts.values()] + one.pids()
    names = other.leftovers()
    assert len(names) == 3 and all((NETNS_DIR / n).exists() for n in names)
    # nothing of the other bed in the root netns (other jobs' links may come and go there)
    ours = {BRIDGE, HOST_IFACE, *(host.port for host in other.hosts.values())}
    assert sorted(_root_links() & ours) == sorted(before & ours)
    # two beds are two networks: the other bed cannot reach this one's Redis
    with pytest.raises(OSError):
        one.connect(bed.hosts["redis"].ip, 6379, timeout=1).close()
    other.close()
    other.close()  # idempotent
    assert other.leftovers() == []
    assert [n for n in os.listdir(NETNS_DIR) if n.startswith(other.tag)] == []
    assert [pid for pid in processes if Path(f"/proc/{pid}").exists()] == []


def _root_links() -> set[str]:
    """Names of the links in the machine's root network namespace (``eth0@if12``: ``eth0``)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_cleanup_stale_removes_a_killed_runs_leftovers(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys, time
        from tests.hostbed.bed import Bed
        bed = Bed({str(tmp_path)!r}, "tstale")
        host = bed.add_host("orphan")
        host.spawn(["sleep", "300"])
        print(host.init_pid, flush=True)
        time.sleep(300)
    """)
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert owner.stdout is not None
        init_pid = int(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait()
    prefix = f"{PREFIX}tstale-{owner.pid}-"
    left = sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    assert left == [prefix + "h-orphan", prefix + "switch"]
    assert Path(f"/proc/{init_pid}").exists()  # the killed run's host still runs
    removed = cleanup_stale(f"{PREFIX}tstale-")
    assert sorted(removed) == left
    assert [n for n in os.listdir(NETNS_DIR) if n.startswith(prefix)] == []
    wait_until(lambda: _dead_or_dying(init_pid), WAIT_S, f"the killed host's init {init_pid} to die")


def _dead_or_dying(pid: int) -> bool:
    """Gone, a zombie, or inside exit (PF_EXITING): a killed PID 1 of a PID namespace stays in exit until
    every process of its namespace has been reaped, which for orphans is up to the machine's own init."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    state, flags = fields[0], int(fields[6])
    return state in ("Z", "X") or bool(flags & 0x4)
