"""Agents held to limits: a fork bomb, a memory hog, a disk filler and a CPU spinner each end as an attempt
whose one-line reason names the limit they hit, in every jail mode, and leave nothing behind: no process,
no cgroup, no workspace (and so no huge file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from croqq.domain.records import Rejection
from croqq.proposers.agent.limits import Limits, _own_cgroup, enforcement
from croqq.proposers.agent.proposer import AgentProposer
from tests.agents import FIXTURES, MANIFEST, MODES, context, fixture_agent

HOSTILE = [
    ("fork_bomb.py", {"agent_max_procs": 64, "agent_timeout_s": 5.0}, "process limit (64 processes)"),
    ("memory_hog.py", {"agent_memory_mb": 256}, "memory limit (256 MiB)"),
    ("disk_filler.py", {"agent_max_file_mb": 64}, "file size limit (64 MiB)"),
    ("cpu_spinner.py", {"agent_cpu_s": 2}, "CPU time limit (2 s)"),
]


def _processes_running(script: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(script).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _agent_cgroups() -> list[Path]:
    found: list[Path] = []
    for controller in ("pids", "memory"):
        own = _own_cgroup(controller)
        if own is not None:
            found += own[0].glob(f"croqq-agent-{os.getpid()}-*")
    return found


def _workspaces() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("croqq-ws-*"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("script", "limits", "words"), HOSTILE, ids=[h[0][:-3] for h in HOSTILE])
def test_a_hostile_agent_is_an_attempt_naming_its_limit_and_leaves_nothing_behind(
    mode: str, script: str, limits: dict[str, object], words: str
) -> None:
    settings = fixture_agent(script, agent_jail=mode, **limits)
    if script == "fork_bomb.py" and enforcement(Limits.of(settings))["processes"].startswith("NOT"):
        pytest.skip("root without a cgroup: nothing can hold a fork bomb here")
    before = _workspaces()
    answer = AgentProposer(MANIFEST, settings).propose(context())
    assert isinstance(answer, Rejection) and answer.kind == "agent", answer
    assert answer.reason.startswith(f"agent command hit its {words}"), answer.reason
    assert "\n" not in answer.reason
    assert _processes_running(FIXTURES / script) == []
    assert _agent_cgroups() == []
    assert _workspaces() - before == set()


def test_the_limits_are_off_where_set_to_zero() -> None:
    settings = fixture_agent("cpu_spinner.py", agent_cpu_s=0, agent_memory_mb=0, agent_max_procs=0)
    how = enforcement(Limits.of(settings.model_copy(update={"agent_max_file_mb": 0})))
    assert set(how.values()) == {"off"}


def test_without_a_cgroup_memory_is_held_by_the_address_space_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where no cgroup can be made (a container with /sys/fs/cgroup read-only) falls back to
    RLIMIT_AS: the hog's allocation fails inside it instead of the OOM killer stopping it."""
    monkeypatch.setattr("croqq.proposers.agent.limits._own_cgroup", lambda controller: None)
    settings = fixture_agent("memory_hog.py", agent_jail="none", agent_memory_mb=256)
    assert enforcement(Limits.of(settings))["memory"] == "RLIMIT_AS"
    answer = AgentProposer(MANIFEST, settings).propose(context())
    assert isinstance(answer, Rejection), answer
    assert answer.reason.startswith("agent command hit its memory limit (256 MiB); exited 1"), answer.reason
    assert "MemoryError" in answer.reason
