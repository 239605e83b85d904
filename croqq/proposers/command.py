"""The ``command`` proposer: an external agent (an LLM harness, a script) run as a subprocess.

Protocol: ``settings.proposer_command`` is split with :func:`shlex.split` and run without a shell, in its
own process group. It gets the :class:`~croqq.proposers._base.ProposeContext` as JSON on stdin and must
print one JSON object on stdout within ``settings.agent_timeout_s``::

    {"summary": "raise STAGES 4->5 to hide memory latency", "knobs": {"STAGES": 5}, "tag": "stages5"}

``knobs`` may name only the knobs that change; the others are taken from ``ctx.best_knobs``. ``tag`` is
optional (it is derived from the summary). When stdout holds more than the object (an agent's progress
lines), the last line is tried as well.

Failures, by whether running the agent again can help:

- timed out (the whole process group is killed), crashed or exited non-zero: :class:`RetryableError`;
- repeated an idea whose content hash is in ``ctx.tried``: :class:`RetryableError` (an agent is
  not deterministic; the next call may think of something new);
- the executable is missing or not executable: :class:`ConfigError`;
- printed something that is not a proposal, or knobs outside the manifest's space:
  :class:`RetryableError` too (the step is retried a few times, then the shape is parked as 'error').

Every message is one line that names the command and what was wrong.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from croqq.domain.manifest import Manifest
from croqq.domain.records import Idea
from croqq.errors import ConfigError, RetryableError
from croqq.proposers._base import ProposeContext, Proposer
from croqq.settings import Settings

log = logging.getLogger(__name__)

REPLY_SHAPE = '{"summary": str, "knobs": {NAME: int, ...}, "tag": str (optional)}'


class AgentReply(BaseModel):
    """What the agent prints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    summary: str = Field(min_length=1)
    knobs: dict[str, int]
    tag: str | None = None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


class CommandProposer(Proposer):
    """Runs the configured agent command once per idea (see the module docstring)."""

    name = "command"

    def __init__(self, manifest: Manifest, settings: Settings) -> None:
        super().__init__(manifest, settings)
        try:
            self.argv = shlex.split(settings.proposer_command)
        except ValueError as exc:
            raise ConfigError(f"CROQQ_PROPOSER_COMMAND {settings.proposer_command!r}: {exc}") from exc
        if not self.argv:
            raise ConfigError("proposer=command needs CROQQ_PROPOSER_COMMAND (the agent command to run)")
        self.label = shlex.join(self.argv)[:120]

    def propose(self, ctx: ProposeContext) -> Idea:
        started = time.monotonic()
        reply = self._parse(self._run(ctx))
        knobs = {**ctx.best_knobs, **reply.knobs}
        try:
            idea = self.make_idea(ctx, knobs, reply.summary, reply.tag)
        except ConfigError as exc:
            raise RetryableError(f"agent command {self.label!r} proposed invalid knobs: {exc}") from exc
        if idea.content_hash in ctx.tried:
            raise RetryableError(
                f"agent repeated an idea already tried for {ctx.shape.key} "
                f"({idea.content_hash[:12]}: {reply.summary[:80]!r}); command {self.label!r}"
            )
        log.info(
            "agent proposed for %s iter %d in %.1f s: %s",
            ctx.shape.key,
            ctx.iteration,
            time.monotonic() - started,
            idea.summary,
        )
        return idea

    def _run(self, ctx: ProposeContext) -> str:
        """Run the agent with the context on stdin; its stdout, or an error that says what went wrong."""
        timeout = self.settings.agent_timeout_s
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise ConfigError(f"agent command {self.label!r}: executable {self.argv[0]!r} not found") from exc
        except PermissionError as exc:
            raise ConfigError(f"agent command {self.label!r}: {self.argv[0]!r} is not executable") from exc
        with proc:
            try:
                out, err = proc.communicate(ctx.model_dump_json(), timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                self._kill(proc)
                raise RetryableError(f"agent command {self.label!r} timed out after {timeout:g} s") from exc
        if proc.returncode != 0:
            raise RetryableError(
                f"agent command {self.label!r} {self._status(proc.returncode)}: "
                f"{_last_line(err)[:200] or 'no output on stderr'}"
            )
        return out

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        """Kill the agent's whole process group (it may have started helpers), then reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()

    @staticmethod
    def _status(code: int) -> str:
        if code < 0:
            return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def _parse(self, stdout: str) -> AgentReply:
        text = stdout.strip()
        if not text:
            raise RetryableError(f"agent command {self.label!r} printed nothing; expected {REPLY_SHAPE}")
        try:
            return AgentReply.model_validate_json(text)
        except ValidationError as exc:
            error = exc
        last = _last_line(text)
        if last != text:
            try:
                return AgentReply.model_validate_json(last)
            except ValidationError:
                pass
        raise RetryableError(
            f"agent command {self.label!r} printed no valid proposal ({_first_error(error)}); "
            f"expected {REPLY_SHAPE}, got {last[:80]!r}"
        )
