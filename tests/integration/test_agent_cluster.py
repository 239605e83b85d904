"""Source-level tuning through the whole cluster with a real agent subprocess per IDEATE: the scripted
reference agent rewrites sources, every stored kernel compiles from the repo alone, an agent that keeps
failing is backed off and reported unhealthy while its shapes wait (never parked), and one that keeps
giving the same refused answer parks its shapes with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from croqq.delivery import keys
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths
from croqq.store.render import parse_tsv
from croqq.store.validate import validate_repo
from croqq.work import agents

pytestmark = pytest.mark.slow
RUN = "tuning/sm90_Simulated_H100_SXM/cutlass"  # the default (from_current_best) family
PATHS = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
AGENT = {"CROQQ_PROPOSER": "agent", "CROQQ_AGENT": "scripted"}


def _rounds(repo: Path, key: str) -> list[dict[str, object]]:
    return _rounds_of(repo, PATHS.rounds_raw(key))


def _rounds_of(repo: Path, path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (repo / path).read_text().splitlines()]


@pytest.mark.timeout(1800)
def test_the_scripted_agent_tunes_sources_end_to_end(cluster_env: dict[str, str]) -> None:
    with LocalCluster(cluster_env | AGENT) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=8, limit=3)
        snap = cluster.wait_done(sub, timeout_s=600)
        assert snap.total.done == 3 and snap.total.error == 0
        scratch = cluster.submit("f16", max_iter=2, limit=1, mode="from_scratch")
        assert cluster.wait_done(scratch, timeout_s=600).total.done == 1
        health = agents.health(cluster.client)
        assert [a.name for a in health] == ["scripted"]
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    naive = RunPaths("sm90_Simulated_H100_SXM", "cuda")  # from scratch: the mma.sync family's naive seed
    (key,) = json.loads((repo / naive.root / "state.json").read_text())["shapes"]
    rows = parse_tsv((repo / naive.results_tsv(key)).read_text())
    assert [r.iter for r in rows] == [0, 1, 2]
    assert all(r.run_command.endswith(f"--dsl cuda --source {r.kernel}") for r in rows)
    assert "#define TILE_M 64\n" in (repo / rows[0].kernel).read_text()
    changes: set[str] = set()
    by_agent = 0
    for key in json.loads((repo / RUN / "state.json").read_text())["shapes"]:
        rows = parse_tsv((repo / PATHS.results_tsv(key)).read_text())
        assert [r.iter for r in rows] == list(range(9))
        assert all("--source" in r.run_command and r.kernel in r.run_command for r in rows)
        for rnd in _rounds(repo, key)[1:]:
            idea = rnd["idea"]
            assert isinstance(idea, dict) and idea["source"] == ""
            if idea["proposer"] == "neighbour":  # a neighbour's best, offered without an agent call
                assert idea["agent"] is None
                continue
            assert idea["proposer"] == "scripted" and idea["agent"]["wall_s"] > 0
            changes.add(str(idea["change"]))
            by_agent += 1
        for row in rows:
            text = (repo / row.kernel).read_text()
            assert '#include "../../../headers/' in text  # its headers are in the repo
    assert health[0].calls >= by_agent > 0  # every agent call counted, failed ones too
    assert changes == {"knobs", "structural"}  # two knob-only changes in a row ask for a structural one
    assert validate_repo(repo, None) == []


def scripted_behind(tmp_path: Path, name: str, prelude: str) -> str:
    """A command agent: ``prelude`` (Python, may exit), then the scripted agent; its command line."""
    from croqq.proposers.agent.presets import SCRIPTED

    script = tmp_path / f"{name}.py"
    script.write_text(
        f"import os, pathlib, runpy, sys\n{prelude}\n"
        f"sys.argv = [{str(SCRIPTED)!r}]\nrunpy.run_path({str(SCRIPTED)!r}, run_name='__main__')\n"
    )
    return f"{sys.executable} -I {script}"


@pytest.mark.timeout(1800)
def test_an_agent_stuck_on_one_answer_parks_its_shapes_with_why(
    cluster_env: dict[str, str], tmp_path: Path
) -> None:
    """It returns the best kernel unchanged, every time: each answer is a repeat, an attempt; after
    CROQQ_MAX_ATTEMPTS_IN_A_ROW of them the shape is parked with the reason, not called on for ever."""
    stuck = 'os.environ["CROQQ_SCRIPTED_MISBEHAVE"] = "unchanged"'
    env = cluster_env | {
        "CROQQ_PROPOSER": "agent",
        "CROQQ_AGENT": "command",
        "CROQQ_AGENT_COMMAND": scripted_behind(tmp_path, "stuck_agent", stuck),
        "CROQQ_MAX_ATTEMPTS_IN_A_ROW": "3",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=3, limit=2)
        snap = cluster.wait_done(sub, timeout_s=600)
        assert (snap.total.done, snap.total.error) == (0, 2)
        for shape in snap.shapes.values():
            assert "3 attempts in a row and nothing measured" in shape.error and "croqq retry" in shape.error
            assert shape.current_iter == 0  # the baseline, then only attempts
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    for key in json.loads((repo / RUN / "state.json").read_text())["shapes"]:
        attempts = [json.loads(line) for line in (repo / PATHS.attempts(key)).read_text().splitlines()]
        assert [a["attempt_no"] for a in attempts] == [1, 2, 3]
        assert all("returned the best source unchanged" in a["reason"] for a in attempts)


@pytest.mark.timeout(1800)
def test_a_failing_agent_is_backed_off_reported_and_its_shapes_wait(
    cluster_env: dict[str, str], tmp_path: Path
) -> None:
    flag = tmp_path / "down"
    flag.write_text("1")
    down = (
        "if pathlib.Path(sys.argv[1]).exists():\n"
        '    print("model endpoint unreachable", file=sys.stderr)\n'
        "    sys.exit(7)"
    )
    env = cluster_env | {
        "CROQQ_PROPOSER": "agent",
        "CROQQ_AGENT": "command",
        "CROQQ_AGENT_COMMAND": f"{scripted_behind(tmp_path, 'flaky_agent', down)} {flag}",
        "CROQQ_AGENT_BACKOFF_AFTER": "2",
        "CROQQ_AGENT_BACKOFF_S": "2",
        "CROQQ_AGENT_BACKOFF_MAX_S": "2",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=3, limit=2)
        client = cluster.client

        def failed() -> bool:
            return int(client.hget(keys.STATS, "attempts:agent") or 0) >= 3

        wait_until(failed, 300, "3 failed agent calls stored as attempts", every_s=0.2)
        (health,) = agents.health(client)
        assert not health.healthy and "exited 7" in health.last_error
        status = subprocess.run(
            [sys.executable, "-m", "croqq", "status"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert "command" in status and ("backed off" in status or "failing" in status)
        summary = cluster.snapshot(sub)
        assert summary.total.error == 0  # waiting, not parked
        flag.unlink()  # the endpoint is back: the next call succeeds and the shapes go on
        snap = cluster.wait_done(sub, timeout_s=600)
        assert snap.total.done == 2 and snap.total.error == 0
        assert agents.health(client)[0].healthy
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    attempts = [
        json.loads(line)
        for key in json.loads((repo / RUN / "state.json").read_text())["shapes"]
        if (repo / PATHS.attempts(key)).exists()
        for line in (repo / PATHS.attempts(key)).read_text().splitlines()
    ]
    assert attempts and all(a["kind"] == "agent" and "exited 7" in a["reason"] for a in attempts)
    assert all(a["reason"].startswith("agent command") and a["agent"]["exit_code"] == 7 for a in attempts)
    assert validate_repo(repo, None) == []


@pytest.mark.timeout(1800)
def test_the_cutlass_family_is_tuned_at_source_level_on_the_simulated_gpu_by_default(
    cluster_env: dict[str, str],
) -> None:
    paths = RunPaths("sm90_Simulated_H100_SXM", "cutlass")
    with LocalCluster(cluster_env | AGENT) as cluster:
        cluster.wait_gpus()
        sub = cluster.submit("f16", max_iter=6, limit=3)  # from_current_best: the cutlass family
        snap = cluster.wait_done(sub, timeout_s=600)
        assert snap.total.done == 3 and snap.total.error == 0
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    state = json.loads((repo / paths.root / "state.json").read_text())["shapes"]
    structural = 0
    for key, entry in state.items():
        rows = parse_tsv((repo / paths.results_tsv(key)).read_text())
        assert [r.iter for r in rows] == list(range(7)) and entry["best_tflops"] > 0
        for row in rows:  # each names its family and the CUTLASS it needs
            assert row.run_command.endswith(
                f"--dsl cutlass --source {row.kernel} --requires nvidia-cutlass==4.2.0.0"
            )
            text = (repo / row.kernel).read_text()
            structural += "using Gemm = cutlass::gemm::device::GemmUniversalAdapter" in text  # inlined
    assert structural > 0  # the scripted agent took CUTLASS kernels into its files and edited them
    assert validate_repo(repo, "cutlass") == []
    key = sorted(state)[0]  # a stored kernel re-measured from the repo alone, as its record says
    best = parse_tsv((repo / paths.results_tsv(key)).read_text())[-1]
    argv = [sys.executable, "-m", "croqq", *best.run_command.split()[1:]]
    env = {"PATH": "/usr/bin:/bin", "CROQQ_PROBE": "sim", "CROQQ_RUN_DIR": str(repo.parent / "measure")}
    again = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    stored = _rounds_of(repo, paths.rounds_raw(key))[-1]["idea"]
    assert json.loads(again.stdout)["content_hash"] == stored["content_hash"]
