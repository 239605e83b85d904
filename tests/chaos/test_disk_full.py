"""A full disk on the writer's host or on a build host: the work waits, an alarm says what to free, nothing
half-written is left, and once space returns the sweep finishes with every iteration stored exactly once.

Each test puts the folder on its own small tmpfs (we are root in CI; skipped where mount is refused) and
fills it with a filler file, as a runaway log would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from croqq.backends.cuda import CudaBackend
from croqq.backends.sim import SimBackend
from croqq.backends.toolchain import knob_candidate
from croqq.chaos.invariants import fsck_problems, repo_problems
from croqq.delivery import keys
from croqq.domain.knobs import seed_knobs
from croqq.domain.manifest import load_manifest
from croqq.domain.records import BuildOutcome
from croqq.domain.shapes import parse_key
from croqq.errors import DiskFullError
from croqq.monitor import metrics
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.settings import PROJECT_ROOT, Settings
from croqq.store.gitrepo import GitRepo
from croqq.work import alarms

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]
Disk = Callable[[Path, int], Path]


@pytest.fixture
def small_disk() -> Iterator[Disk]:
    """``small_disk(folder, kib)``: a tmpfs of ``kib`` KiB mounted on ``folder`` (unmounted afterwards)."""
    mounted: list[Path] = []

    def mount(folder: Path, kib: int) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """Write a filler file until the disk is full (or only about ``leave`` bytes are free)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
            if free <= leave:
                break
            os.write(fd, b"\0" * min(1 << 16, max(4096, free - leave)))
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)
    return filler


def leftovers(repo: Path) -> list[str]:
    """Temporary files the writer or git would leave half-written."""
    tmp = [*repo.rglob("*.croqq-tmp"), *(repo / ".git" / "objects").rglob("tmp_*")]
    packs = {p.stem for p in (repo / ".git" / "objects" / "pack").glob("*.pack")}
    indexes = {p.stem for p in (repo / ".git" / "objects" / "pack").glob("*.idx")}
    return [str(p) for p in tmp] + [f"{stem}.pack without .idx" for stem in sorted(packs - indexes)]


# -- the pieces ------------------------------------------------------------------------------------------


def test_a_commit_that_runs_out_of_space_leaves_the_branch_and_the_disk_clean(
    tmp_path: Path, small_disk: Disk
) -> None:
    repo_dir = small_disk(tmp_path / "disk", 2048) / "results"
    repo = GitRepo(repo_dir, index_flush_s=0.0)
    first = repo.commit({"a.txt": b"one\n"}, "first")
    filler = fill(repo_dir.parent, leave=64 << 10)
    big = os.urandom(256 << 10)  # incompressible: its pack cannot fit in what is left
    with pytest.raises(DiskFullError, match="no space left on device writing the results repo"):
        repo.commit({"a.txt": b"two\n", "big.bin": big}, "too big")
    assert repo.head() == first and repo.read("a.txt") == b"one\n"
    assert leftovers(repo_dir) == [] and fsck_problems(repo_dir) == []
    filler.unlink()
    second = repo.commit({"a.txt": b"two\n", "big.bin": big}, "fits now")
    repo.close()
    assert second != first and (repo_dir / "big.bin").read_bytes() == big
    assert fsck_problems(repo_dir) == [] and leftovers(repo_dir) == []


def test_no_commit_starts_below_the_reserve(tmp_path: Path, small_disk: Disk) -> None:
    repo_dir = small_disk(tmp_path / "disk", 1024) / "results"
    repo = GitRepo(repo_dir, reserve_bytes=256 << 10, retry_s=2.0)
    tip = repo.head()
    filler = fill(repo_dir.parent, leave=128 << 10)
    held = r"KiB free, under the 256 KiB reserve\): free space there; croqq retries every 2s$"
    with pytest.raises(DiskFullError, match=held) as caught:
        repo.commit({"small.txt": b"fits, but eats into the reserve\n"}, "held back")
    assert caught.value.path == str(repo_dir) and repo.head() == tip
    filler.unlink()
    assert repo.commit({"small.txt": b"now\n"}, "stored") != tip
    repo.close()


FAKE_NVCC = """#!/bin/sh
[ "$1" = --version ] && { echo "fake nvcc, release 0.1"; exit 0; }
# writes an object file the size of a small real one, as nvcc -c would
head -c 262144 /dev/zero > cand.o
"""


def sim_build(
    build_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source_tail: str = ""
) -> BuildOutcome:
    fakebin = tmp_path / "bin"
    fakebin.mkdir(exist_ok=True)
    (fakebin / "nvcc").write_text(FAKE_NVCC)
    (fakebin / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakebin}:/usr/bin:/bin")
    settings = Settings(time_scale=0.0, sim_compile="nvcc", build_dir=build_dir)
    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    shape = parse_key("f16_4096x8192x8192")
    knobs = seed_knobs(manifest, "cuda", shape.dtype, "reference")
    cand = knob_candidate(manifest, settings, "cuda", shape, knobs)
    cand = cand.model_copy(update={"source": cand.source + source_tail})
    return SimBackend(manifest, settings).build(shape, cand)


def test_a_compile_that_fills_the_build_disk_is_the_hosts_fault_not_the_candidates(
    tmp_path: Path, small_disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_dir = small_disk(tmp_path / "build", 1024)
    filler = fill(build_dir, leave=128 << 10)  # the sources fit; the 256 KiB object file does not
    with pytest.raises(DiskFullError, match="no space left on device writing the build folder") as caught:
        sim_build(build_dir, tmp_path, monkeypatch)
    assert "free space there" in str(caught.value) and caught.value.path == str(build_dir)
    assert sorted(p.name for p in build_dir.iterdir()) == ["filler"]  # the compile folder is gone
    # a candidate that prints the words itself gets no such excuse: its failure is its own
    sneaky = sim_build(build_dir, tmp_path, monkeypatch, '\n// "No space left on device"\n')
    assert not sneaky.ok and "No space left on device" in sneaky.reason
    filler.unlink()
    assert sim_build(build_dir, tmp_path, monkeypatch).ok


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_real_nvcc_running_out_of_space_for_its_temporaries_is_the_hosts_fault(
    tmp_path: Path, small_disk: Disk
) -> None:
    """nvcc writes its intermediate files (several MiB) to TMPDIR, which croqq points at the build folder."""
    build_dir = small_disk(tmp_path / "build", 64 << 10)
    settings = Settings(time_scale=0.0, sim_compile="nvcc", build_dir=build_dir, compile_timeout_s=3600.0)
    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    shape = parse_key("f16_4096x8192x8192")
    cand = knob_candidate(manifest, settings, "cuda", shape, seed_knobs(manifest, "cuda", "f16", "reference"))
    filler = fill(build_dir, leave=1 << 20)
    with pytest.raises(DiskFullError, match="no space left on device writing the build folder"):
        SimBackend(manifest, settings).build(shape, cand)
    assert sorted(p.name for p in build_dir.iterdir()) == ["filler"]
    filler.unlink()
    outcome = SimBackend(manifest, settings).build(shape, cand)
    assert outcome.ok, outcome.log


def test_a_cuda_build_that_fills_the_build_disk_is_the_hosts_fault(tmp_path: Path, small_disk: Disk) -> None:
    build_dir = small_disk(tmp_path / "build", 1024)
    nvcc = tmp_path / "nvcc"  # writes a 256 KiB binary to its -o argument, as nvcc would
    find_out = 'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done'
    nvcc.write_text(f'#!/bin/sh\n{find_out}\n[ -n "$out" ] && head -c 262144 /dev/zero > "$out"\n')
    nvcc.chmod(0o755)
    manifest = load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")
    spec = manifest.dsls["cuda"].build.model_copy(update={"compiler": str(nvcc)})
    manifest = manifest.model_copy(
        update={"dsls": {"cuda": manifest.dsls["cuda"].model_copy(update={"build": spec})}}
    )
    settings = Settings(build_dir=build_dir, run_dir=tmp_path / "run")
    shape = parse_key("f16_4096x8192x8192")
    cand = knob_candidate(manifest, settings, "cuda", shape, seed_knobs(manifest, "cuda", "f16", "reference"))
    filler = fill(build_dir, leave=128 << 10)
    with pytest.raises(DiskFullError, match="no space left on device writing the build folder"):
        CudaBackend(manifest, settings).build(shape, cand)
    assert [p for p in build_dir.rglob("gemm*") if p.suffix != ".cuh"] == []  # no partial binary left
    filler.unlink()
    assert CudaBackend(manifest, settings).build(shape, cand).ok


# -- whole clusters ----------------------------------------------------------------------------------------


def alarm_rows(client: redis.Redis) -> list[alarms.Alarm]:
    return [a for a in alarms.active(client) if a.name == "disk_full"]


def exported_alarms(client: redis.Redis) -> list[dict[str, str]]:
    """The croqq_alarm series the exporter publishes now."""
    found = []
    for family in metrics.families(metrics.read(client)):
        found += [s.labels for s in family.samples if s.name == "croqq_alarm"]
    return found


def status_text(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "croqq", "status"],
        env={**os.environ, **env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    return done.stdout


def stored(client: redis.Redis) -> int:
    return int(client.hget(keys.STATS, "stored") or 0)


def full_disk_sweep(
    cluster: LocalCluster, disk: Path, role: str, min_stored: int
) -> tuple[alarms.Alarm, str, list[dict[str, str]], float, int, int]:
    """Submit a sweep, fill ``disk`` once ``min_stored`` iterations are stored, wait for ``role``'s alarm,
    read what the user sees, free the disk and wait for the alarm to clear. Returns (the alarm, status
    text, exported series, seconds from the fill to the alarm, shapes parked while the disk was full,
    iterations stored while it was)."""
    client = cluster.client
    wait_until(lambda: stored(client) >= min_stored, 300, f"{min_stored} iterations stored", every_s=0.1)
    filler = fill(disk)
    filled = time.monotonic()
    wait_until(lambda: any(a.source.startswith(role) for a in alarm_rows(client)), 300, f"{role}'s disk_full")
    detect_s = time.monotonic() - filled
    (alarm,) = [a for a in alarm_rows(client) if a.source.startswith(role)]
    status, exported = status_text(cluster.env), exported_alarms(client)
    before = stored(client)
    time.sleep(3 * cluster.settings.disk_retry_s)  # let STOREs / builds retry against the full disk
    during = stored(client) - before
    parked = cluster.snapshot().total.error
    filler.unlink()
    wait_until(lambda: not alarm_rows(client), 300, "the disk_full alarm to clear")
    return alarm, status, exported, detect_s, parked, during


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("group", [1, 4], ids=["one-commit-per-store", "group-commit"])
def test_a_full_disk_on_the_writers_host_holds_stores_until_space_returns(
    cluster_env: dict[str, str], small_disk: Disk, short_tmp: Path, group: int
) -> None:
    disk = small_disk(short_tmp / "disk", 32 << 10)
    env = cluster_env | {
        "CROQQ_RESULTS_REPO": str(disk / "results"),
        "CROQQ_TEST_BARRIERS": "false",
        "CROQQ_TIME_SCALE": "0.002",
        "CROQQ_DISK_RESERVE_BYTES": str(1 << 20),
        "CROQQ_DISK_RETRY_S": "1",
        "CROQQ_STORE_GROUP": str(group),
        "CROQQ_SIM_GPUS": "3",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=10, limit=6)
        alarm, status, exported, detect_s, parked, during = full_disk_sweep(cluster, disk, "writer", 6)
        snap = cluster.wait_done(sub, timeout_s=600)
    print(f"\nwriter disk full (store_group {group}): alarm after {detect_s:.1f}s; croqq status shows:")
    print("\n".join(line for line in status.splitlines() if "disk_full" in line or "ALARMS" in line))
    assert alarm.message.startswith(f"no space left on device writing the results repo {disk / 'results'}")
    assert "free space there; croqq retries every 1s" in alarm.message
    assert "disk_full" in status and alarm.message in status
    assert {"name": "disk_full", "source": alarm.source} in exported
    assert during == 0 and parked == 0  # STOREs stopped; no shape was blamed for the disk
    log = (Path(env["CROQQ_RUN_DIR"]) / "logs" / "writer.log").read_text()
    assert "ALARM disk_full" in log and "alarm disk_full" in log and "cleared" in log
    assert snap.total.done == 6 and snap.total.error == 0
    repo = disk / "results"
    assert repo_problems(repo) == [] and leftovers(repo) == []
    assert [f for f in repo.rglob("attempts.jsonl") if "space" in f.read_text()] == []


FAKE_NVCC_CLUSTER = """#!/bin/sh
[ "$1" = --version ] && { echo "fake nvcc, release 0.1"; exit 0; }
# a compiler that writes a 64 KiB object file next to its source, as nvcc -c does
head -c 65536 /dev/zero > cand.o
"""


@pytest.mark.timeout(1800)
def test_a_full_disk_on_a_build_host_holds_builds_until_space_returns(
    cluster_env: dict[str, str], small_disk: Disk, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = small_disk(short_tmp / "build", 8 << 10)
    fakebin = short_tmp / "bin"
    fakebin.mkdir()
    (fakebin / "nvcc").write_text(FAKE_NVCC_CLUSTER)
    (fakebin / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakebin}:/usr/bin:/bin")  # what the cluster's processes inherit
    env = cluster_env | {
        "CROQQ_BUILD_DIR": str(disk),
        "CROQQ_SIM_COMPILE": "nvcc",
        "CROQQ_TEST_BARRIERS": "false",
        "CROQQ_TIME_SCALE": "0.002",
        "CROQQ_DISK_RESERVE_BYTES": "0",  # no pre-check: the compile itself runs into the full disk
        "CROQQ_DISK_RETRY_S": "1",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=10, limit=4)
        alarm, status, exported, detect_s, parked, _ = full_disk_sweep(cluster, disk, "build", 4)
        snap = cluster.wait_done(sub, timeout_s=600)
    print(f"\nbuild disk full: alarm after {detect_s:.1f}s; croqq status shows:")
    print("\n".join(line for line in status.splitlines() if "disk_full" in line or "ALARMS" in line))
    assert alarm.message.startswith(f"no space left on device writing the build folder {disk}")
    assert "disk_full" in status and alarm.message in status
    assert {"name": "disk_full", "source": alarm.source} in exported
    assert parked == 0
    assert snap.total.done == 4 and snap.total.error == 0
    repo = Path(env["CROQQ_RESULTS_REPO"])
    assert repo_problems(repo) == []
    blamed = [f for f in repo.rglob("attempts.jsonl") if "space" in f.read_text()]
    assert blamed == []  # the host's full disk was never recorded as a candidate's compile failure
