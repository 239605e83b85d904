"""An agent named while another proposer is selected is refused in one line naming both variables and the
fix, before anything starts; the default agent (which deploy templates set beside any proposer) is not."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.errors import ConfigError
from croqq.settings import Settings
from tests.output import error_line

Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture


def local(tmp_path: Path) -> dict[str, str]:
    return {"CROQQ_RUN_DIR": str(tmp_path / "run"), "CROQQ_RESULTS_REPO": str(tmp_path / "results")}


def test_croqq_up_with_an_agent_command_but_no_agent_proposer_is_refused_and_starts_nothing(
    tmp_path: Path, croqq: Cli
) -> None:
    env = {**local(tmp_path), "CROQQ_AGENT": "command", "CROQQ_AGENT_COMMAND": "./my-agent"}
    result = croqq(env, "up", "--dtype", "f16", "--exit-when-done")
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "CROQQ_AGENT=command and CROQQ_AGENT_COMMAND set while CROQQ_PROPOSER=model" in line
    assert "set CROQQ_PROPOSER=agent to use it" in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("env", "fix"),
    [
        ({"CROQQ_AGENT": "claude"}, "set CROQQ_PROPOSER=agent to use it, or unset CROQQ_AGENT"),
        (
            {"CROQQ_PROPOSER": "search", "CROQQ_AGENT_COMMAND": "./my-agent"},
            "set CROQQ_PROPOSER=agent CROQQ_AGENT=command to use it, or unset CROQQ_AGENT_COMMAND",
        ),
    ],
)
def test_a_named_agent_the_proposer_would_ignore_is_one_line_naming_the_fix(
    tmp_path: Path, croqq: Cli, env: dict[str, str], fix: str
) -> None:
    result = croqq({**local(tmp_path), **env}, "submit", "--dtype", "f16", "--dry-run")
    assert result.returncode == 2 and fix in error_line(result.stderr)


def test_the_default_agent_beside_another_proposer_and_an_agent_with_its_proposer_are_accepted() -> None:
    assert Settings(proposer="model", agent="scripted", agent_command=" ").proposer == "model"
    assert Settings(proposer="agent", agent="command", agent_command="./my-agent").agent == "command"
    with pytest.raises(ConfigError, match="CROQQ_PROPOSER=search"):
        Settings(proposer="search", agent="gemini")
