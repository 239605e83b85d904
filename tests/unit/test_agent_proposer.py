"""The agent proposer end to end with real subprocesses: the scripted reference agent answers, and every
kind of bad answer becomes a Rejection with one line naming the agent and what was wrong, with nothing
outside the workspace changed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from croqq.domain.records import Idea, Rejection
from croqq.proposers.agent.proposer import AgentProposer
from tests.agents import JAILS, MANIFEST, MODES, context, settings
from tests.output import error_line


def propose(monkeypatch: pytest.MonkeyPatch, misbehave: str = "", **kw: object) -> Idea | Rejection:
    if misbehave:
        monkeypatch.setenv("CROQQ_SCRIPTED_MISBEHAVE", misbehave)
    else:
        monkeypatch.delenv("CROQQ_SCRIPTED_MISBEHAVE", raising=False)
    return AgentProposer(MANIFEST, settings(**kw)).propose(context())


@pytest.mark.parametrize("mode", MODES)
def test_a_good_answer_is_an_idea_with_its_source_and_usage(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    idea = propose(monkeypatch, agent_jail=mode)
    assert isinstance(idea, Idea), idea
    assert idea.proposer == "scripted" and idea.change == "knobs" and idea.phase == "knobs"
    assert '#include "gemm_f16.cuh"' in idea.source and idea.summary
    assert idea.agent is not None and idea.agent.exit_code == 0 and idea.agent.wall_s > 0
    again = AgentProposer(MANIFEST, settings()).propose(context())
    assert isinstance(again, Idea) and again.content_hash == idea.content_hash  # the same workspace


def test_a_structural_answer_is_marked_structural(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CROQQ_SCRIPTED_MISBEHAVE", raising=False)
    idea = AgentProposer(MANIFEST, settings()).propose(context("structural"))
    if isinstance(idea, Rejection):  # the scripted agent's rare deliberately broken edits still pass checks
        pytest.fail(idea.reason)
    assert idea.change == "structural" and '#include "harness.cuh"' in idea.source


BAD = [
    ("nothing", "agent", "wrote no candidate"),
    ("two", "check", "exactly one candidate"),
    ("huge", "check", "bytes"),
    ("include-passwd", "check", "/etc/passwd"),
    ("include-escape", "check", ".."),
    ("garbage", "agent", "wrote no candidate"),
    ("fail", "agent", "exited 3"),
    ("unchanged", "repeat", "unchanged"),
    ("timing", "check", "cudaEvent"),
]


@pytest.mark.parametrize(("misbehave", "kind", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_answers_are_rejected_in_one_line(
    monkeypatch: pytest.MonkeyPatch, misbehave: str, kind: str, words: str
) -> None:
    answer = propose(monkeypatch, misbehave)
    assert isinstance(answer, Rejection), answer
    assert answer.kind == kind and answer.proposer == "scripted"
    assert "\n" not in answer.reason and answer.reason.startswith("agent scripted")
    assert words in answer.reason, answer.reason
    assert answer.agent is not None  # the call's usage is kept even when it failed


def test_a_modified_provided_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = propose(monkeypatch, "modify", agent_jail="none")
    assert isinstance(answer, Rejection) and answer.kind == "check" and "modified best.cu" in answer.reason


@pytest.mark.parametrize("mode", JAILS)
def test_jailed_a_provided_file_cannot_even_be_written(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    jailed = propose(monkeypatch, "modify", agent_jail=mode)
    assert isinstance(jailed, Rejection) and jailed.kind == "agent", jailed  # its write failed: read-only
    assert "Read-only file system" in jailed.reason, jailed.reason


def test_an_agent_that_loops_forever_is_killed_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    answer = propose(monkeypatch, "loop", agent_timeout_s=2.0)
    assert isinstance(answer, Rejection) and answer.kind == "agent"
    # the agent sleeps for hours: finishing within minutes proves it was killed, not waited out
    assert "timed out" in answer.reason and time.monotonic() - started < 300


@pytest.mark.parametrize("mode", JAILS)
def test_a_write_through_a_symlink_out_of_the_workspace_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str
) -> None:
    target = tmp_path / "outside.txt"
    target.write_text("untouched\n")
    monkeypatch.setenv("CROQQ_SCRIPTED_TARGET", str(target))
    answer = propose(monkeypatch, "symlink", agent_jail=mode)
    assert isinstance(answer, Rejection) and "agent scripted" in answer.reason
    assert target.read_text() == "untouched\n"


def test_without_the_jail_an_escaping_symlink_is_still_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "outside.txt"
    target.write_text("x\n")
    monkeypatch.setenv("CROQQ_SCRIPTED_TARGET", str(target))
    answer = propose(monkeypatch, "symlink", agent_jail="none")
    assert isinstance(answer, Rejection) and "symlink out of the workspace" in answer.reason


def test_the_agent_sees_a_scrubbed_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    probe = tmp_path / "env_agent.py"
    probe.write_text(
        "import os, pathlib\n"
        "pathlib.Path('candidate.cu').write_text(pathlib.Path('best.cu').read_text() + '\\n// ' + "
        "' '.join(sorted(k for k in os.environ if k.startswith(('CROQQ', 'REDIS', 'SECRET')))) + '\\n"
        "#define TILE_M 64\\n')\n"
        "pathlib.Path('SUMMARY.txt').write_text('lower TILE_M; env: ' + ' '.join(sorted(os.environ)))\n"
    )
    monkeypatch.setenv("CROQQ_BROKER_URL", "redis://:hunter2@example:6379/0")
    monkeypatch.setenv("CROQQ_REDIS_PASSWORD", "hunter2")
    monkeypatch.setenv("SECRET_TOKEN", "x")
    monkeypatch.setenv("MY_API_KEY", "k")
    answer = AgentProposer(
        MANIFEST,
        settings(agent="command", agent_command=f"{sys.executable} -I {probe}", agent_env="MY_API_KEY"),
    ).propose(context())
    assert isinstance(answer, Idea), answer
    names = answer.summary.split("env: ", 1)[1].split()
    assert "MY_API_KEY" in names and "HOME" in names
    assert not [n for n in names if n.startswith(("CROQQ", "REDIS", "SECRET"))]


def test_a_missing_executable_refuses_the_ideate_worker_at_start_up(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "CROQQ_PROPOSER": "agent",
        "CROQQ_AGENT": "claude",
        "CROQQ_RUN_DIR": str(tmp_path),
        "CROQQ_BROKER_URL": "redis://127.0.0.1:1/0",  # never reached: the check comes first
    }
    result = subprocess.run(
        [sys.executable, "-m", "croqq", "ideate-worker"],
        capture_output=True,
        text=True,
        env={**env, "HOME": os.environ.get("HOME", "/root")},
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "claude" in line and "not found" in line, result.stderr


def test_the_worker_says_once_at_start_up_when_agents_run_without_a_jail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("INFO", logger="croqq.proposers.agent.jail"):
        AgentProposer(MANIFEST, settings(agent_jail="none")).check_ready()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "WITHOUT a jail" in warnings[0].getMessage()


@pytest.mark.parametrize("mode", JAILS)
def test_the_worker_says_at_start_up_how_agents_are_jailed_and_limited(
    caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    with caplog.at_level("INFO", logger="croqq.proposers.agent.jail"):
        AgentProposer(MANIFEST, settings(agent_jail=mode)).check_ready()
    lines = [r.getMessage() for r in caplog.records]
    tool = {"bwrap": "bubblewrap", "unshare": "unshare"}[mode]
    assert lines[0] == f"agents run jailed with {tool}: only their workspace is writable"
    assert lines[1].startswith("agent limits: cpu by RLIMIT_CPU, memory by "), lines
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
