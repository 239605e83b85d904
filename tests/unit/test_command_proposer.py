"""The command proposer runs an external agent with the context on stdin and turns its one JSON line
into an Idea; every way the agent can misbehave becomes one error line that names the command."""

from __future__ import annotations

import shlex
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from croqq.domain.knobs import make_candidate, seed_knobs
from croqq.domain.manifest import Manifest, load_manifest
from croqq.domain.shapes import parse_key
from croqq.errors import ConfigError, RetryableError, TerminalError
from croqq.proposers._base import ProposeContext
from croqq.proposers.command import CommandProposer
from croqq.settings import PROJECT_ROOT, Settings

AGENT = Path(__file__).resolve().parent.parent / "fixtures" / "agent_echo.py"
SHAPE = parse_key("f16_4096x8192x8192")


@cache
def manifest() -> Manifest:
    return load_manifest(PROJECT_ROOT / "kernels" / "manifest.json")


def reference() -> dict[str, int]:
    return seed_knobs(manifest(), "cuda", SHAPE.dtype, "reference")


def agent(mode: str = "step", timeout: float = 30.0) -> CommandProposer:
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENT))} {mode}"
    settings = Settings(proposer="command", proposer_command=command, agent_timeout_s=timeout)
    return CommandProposer(manifest(), settings)


def context(iteration: int = 1) -> ProposeContext:
    return ProposeContext(
        shape=SHAPE,
        dsl="cuda",
        gpu_type="sm90_Simulated_H100_SXM",
        iteration=iteration,
        knob_space=manifest().dsl("cuda").knobs,
        best_knobs=reference(),
        best_tflops=500.0,
        peak_tflops=989.4,
        strategy="escalate",
        consecutive_discards=6,
        bottleneck="memory",
        tried=[make_candidate(manifest(), "cuda", SHAPE, reference()).content_hash],
    )


def changed(knobs: dict[str, int]) -> list[str]:
    return [k for k in knobs if knobs[k] != reference()[k]]


def test_agent_reply_becomes_an_idea_with_its_hash() -> None:
    idea = agent().propose(context())
    assert idea.proposer == "command" and idea.strategy == "escalate"
    assert idea.summary.startswith("agent_echo:") and "4096x8192" in idea.summary  # it saw the context
    assert idea.tag.startswith("echo-") and len(changed(idea.knobs)) == 1
    assert idea.content_hash == make_candidate(manifest(), "cuda", SHAPE, idea.knobs).content_hash


def test_knobs_left_out_are_taken_from_the_best() -> None:
    full, partial = agent("step").propose(context()), agent("partial").propose(context())
    assert partial.knobs == full.knobs


def test_progress_lines_before_the_json_are_tolerated() -> None:
    assert agent("chatty").propose(context()).knobs == agent("step").propose(context()).knobs


def test_a_repeated_idea_is_retryable() -> None:
    with pytest.raises(RetryableError, match="agent repeated an idea"):
        agent("repeat").propose(context())


def test_prose_instead_of_json_is_a_retryable_one_line_error_naming_the_command() -> None:
    with pytest.raises(RetryableError, match=r"agent_echo\.py garbage.*no valid proposal") as exc:
        agent("garbage").propose(context())
    assert not isinstance(exc.value, TerminalError) and "\n" not in str(exc.value)


def test_knobs_outside_the_space_are_refused() -> None:
    with pytest.raises(RetryableError, match=r"invalid knobs.*TILE_M=96"):
        agent("bad-knobs").propose(context())


def test_a_crashing_agent_is_retryable_with_its_last_stderr_line() -> None:
    with pytest.raises(RetryableError, match="exited with status 3: agent_echo: simulated crash"):
        agent("crash").propose(context())


def test_a_slow_agent_is_killed_at_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(RetryableError, match=r"timed out after 0\.5 s"):
        agent("sleep", timeout=0.5).propose(context())
    assert time.monotonic() - started < 10


def test_a_missing_executable_is_a_config_error() -> None:
    settings = Settings(proposer="command", proposer_command="/nonexistent/agent --go")
    with pytest.raises(ConfigError, match="not found"):
        CommandProposer(manifest(), settings).propose(context())


def test_an_empty_or_unbalanced_command_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="CROQQ_PROPOSER_COMMAND"):
        CommandProposer(manifest(), Settings(proposer="search", proposer_command="  "))
    with pytest.raises(ConfigError, match="CROQQ_PROPOSER_COMMAND"):
        CommandProposer(manifest(), Settings(proposer="search", proposer_command="agent 'unterminated"))
