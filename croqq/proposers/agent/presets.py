"""Agent CLI presets: how to launch each coding agent for one IDEATE step, and how to read its output.

A :class:`Preset` is plain data: the executable, an argv *template*, the names of the environment
variables handed through (API keys; nothing else of croqq's environment), the known exit codes and the
name of the output format. All presets live in one table, :data:`PRESETS`; :func:`preset_for` picks one
from the settings (and builds ``command`` from ``CROQQ_AGENT_COMMAND``). Each row is written as the
command line in the CLI's docs and split like a shell, once, at import; the flags are each CLI's
non-interactive, edit-in-the-workdir, no-shell mode (listed in ``kernels/AGENTS.md``, "Presets").

argv template (the arguments after the executable; never run through a shell):

* ``{prompt}`` (TASK.md's text), ``{workspace}``, ``{model}`` and ``{prompt_file}`` are replaced
  wherever they occur in an element, in one pass (a value containing ``{workspace}`` stays as it is);
  any other braces are left alone.
* An element written ``"[--model {model}]"`` is an *optional group*: its words become separate argv
  elements, and the whole group is dropped when a placeholder in it has an empty value.

The launcher (another module) sets cwd to the workspace, stdin to /dev/null, its own process group and
the wall-clock limit, and hands back an :class:`AgentRun`. :meth:`Preset.parse` turns that into an
:class:`AgentReport`: one parser per output format reads the verdict, the final message and the usage
it reports; the exit code, the timeout and a missing result are judged the same way for every preset.
The prompt must not start with ``-`` (TASK.md starts with a heading), else the CLIs read it as a flag.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from croqq.errors import ConfigError
from croqq.proposers.agent.contract import BEST, CANDIDATE, CONTEXT, HISTORY, IDEAS, SCRATCH
from croqq.settings import Settings

LINE_MAX = 300  # error and summary lines
Network = Literal["none", "host"]
SCRIPTED = Path(__file__).resolve().parent / "scripted.py"
STDLIB_PYTHON = (sys.executable, "-I", "-S")
"""How croqq starts its standard-library-only scripts (the launcher, the scripted agent): isolated and
without ``site``, whose imports (an editable install's path finder pulls in pathlib and urllib) cost about
three times the rest of an interpreter's start, twice per agent call."""

_PLACEHOLDER = re.compile(r"\{(prompt|workspace|model|prompt_file)\}")
_GROUP = re.compile(r"^\[(.+)\]$", re.DOTALL)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class AgentRun:
    """What the jailed launcher observed."""

    exit_code: int | None  # None: killed at the wall-clock timeout; negative: killed by that signal
    stdout: str  # possibly truncated
    stderr: str
    wall_s: float
    timed_out: bool = False
    truncated: bool = False
    limit: str = ""  # the resource limit that stopped it, in words ("process limit (64 processes)")


@dataclass(frozen=True)
class AgentReport:
    """What a preset makes of an :class:`AgentRun` (usage fields None where the CLI does not report them)."""

    ok: bool  # exit code 0 and, where the CLI has one, a successful JSON verdict
    error: str  # one line naming the preset and what went wrong when not ok ("" when ok)
    summary: str = ""  # the agent's final message, one line, at most 300 characters
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True)
class _Parsed:
    """What an output parser found: the agent's own verdict ("" = success) and what it reported."""

    error: str = ""
    summary: str = ""
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True)
class Preset:
    name: str  # claude|codex|opencode|cursor|gemini|aider|scripted|command
    executable: str  # argv[0] as configured (looked up on PATH by the caller)
    argv: tuple[str, ...]  # the template of the arguments after the executable (see the module doc)
    env: tuple[str, ...]  # environment variable names passed through to the agent
    exit_codes: Mapping[int, str]  # known exit codes -> meaning
    output: str  # a key of _PARSERS
    network: Network = "host"  # "none": no network at all (jailed); "host": the host's (an API endpoint)

    def command(self, prompt: str, workspace: Path, model: str, prompt_file: Path) -> list[str]:
        """The argv to run (no shell): the template with its placeholders filled in."""
        values = {
            "prompt": prompt,
            "workspace": str(workspace),
            "model": model,
            "prompt_file": str(prompt_file),
        }

        def fill(element: str) -> str:
            return _PLACEHOLDER.sub(lambda m: values[m[1]], element)

        args = [self.executable]
        for element in self.argv:
            group = _GROUP.match(element)
            if group and _PLACEHOLDER.search(element):
                words = group[1].split()
                if all(values[name] for word in words for name in _PLACEHOLDER.findall(word)):
                    args += [fill(word) for word in words]
            else:
                args.append(fill(element))
        return args

    def parse(self, run: AgentRun) -> AgentReport:
        """Judge a finished (or killed) run: exit code, timeout, then the CLI's own verdict."""
        parsed = _PARSERS[self.output](run.stdout)
        usage = parsed or _Parsed()
        if run.timed_out or run.exit_code is None:
            error = f"{self.name} timed out after {run.wall_s:.0f} s"
        elif run.exit_code != 0:
            if run.exit_code < 0:
                error = f"{self.name} killed by signal {-run.exit_code} ({_signal_name(-run.exit_code)})"
            else:
                meaning = self.exit_codes.get(run.exit_code)
                error = f"{self.name} exited {run.exit_code}" + (f" ({meaning})" if meaning else "")
            detail = usage.error or _last_line(run.stderr) or _last_line(run.stdout)
            error += f": {detail}" if detail else ""
        elif parsed is None:
            got = _one_line(run.stdout)[:60]
            note = "; output truncated" if run.truncated else ""
            stderr = _last_line(run.stderr)
            error = f"printed no {self.name} result JSON (got {got!r}{note})" + (
                f"; stderr: {stderr}" if stderr else ""
            )
        elif parsed.error:
            error = f"{self.name} reported failure: {parsed.error}"
        else:
            error = ""
        if error and run.limit:
            error = f"{self.name} hit its {run.limit}; {error.removeprefix(self.name + ' ')}"
        return AgentReport(
            ok=not error,
            error=_one_line(error)[:LINE_MAX],
            summary=_one_line(usage.summary)[:LINE_MAX],
            turns=usage.turns,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=usage.cost_usd,
        )


# -- output parsers: stdout -> _Parsed, or None when no result was printed ---------------------------


def _parse_result_json(stdout: str) -> _Parsed | None:
    """claude and cursor ``--output-format json``: the last ``{"type": "result", ...}`` object."""
    results = [o for o in _json_objects(stdout) if o.get("type") == "result"]
    if not results:
        return None
    r = results[-1]
    subtype = str(r.get("subtype", ""))
    result = r.get("result")
    problems = [subtype] if subtype and subtype != "success" else []
    if r.get("is_error") is True:
        problems.append(str(result) if result else "is_error")
    usage = _dict(r.get("usage"))
    prompt = (
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    )  # every prompt token read
    return _Parsed(
        error="; ".join(problems),
        summary=result if isinstance(result, str) else "",
        turns=_int(r.get("num_turns")),
        input_tokens=_isum(usage.get(key) for key in prompt),
        output_tokens=_int(usage.get("output_tokens")),
        cost_usd=_float(r.get("total_cost_usd")),
    )


def _parse_codex_jsonl(stdout: str) -> _Parsed | None:
    """``codex exec --json`` events: turn.completed usage summed, turn.failed / error fail the run."""
    usages, failures, messages, ended = [], [], [], False
    for event in _json_objects(stdout):
        kind = event.get("type")
        if kind == "turn.completed":
            usages.append(_dict(event.get("usage")))
            ended = True
        elif kind == "turn.failed":
            failures.append(_message(event.get("error")) or "turn failed")
            ended = True
        elif kind == "error":
            failures.append(_message(event) or "error event")
            ended = True
        elif kind == "item.completed":
            item = _dict(event.get("item"))
            if item.get("type", item.get("item_type")) in ("agent_message", "assistant_message"):
                messages.append(str(item.get("text", "")))
    if not ended:
        return None
    return _Parsed(
        error=failures[-1] if failures else "",
        summary=messages[-1] if messages else "",
        turns=len(usages),
        input_tokens=_isum(u.get("input_tokens") for u in usages),
        output_tokens=_isum(u.get("output_tokens") for u in usages),
    )


def _parse_opencode_jsonl(stdout: str) -> _Parsed | None:
    """``opencode run --format json`` events: step_finish cost and tokens summed, error fails the run."""
    steps, failures, texts = [], [], []
    for event in _json_objects(stdout):
        kind, part = event.get("type"), _dict(event.get("part"))
        if kind == "step_finish":
            steps.append(part)
        elif kind == "error":
            failures.append(_message(event.get("error")) or "error event")
        elif kind == "text" and part.get("text"):
            texts.append(str(part["text"]))
    if not steps and not failures:
        return None
    tokens = [_dict(s.get("tokens")) for s in steps]
    cache = [_dict(t.get("cache")) for t in tokens]  # input counts only the uncached prompt tokens
    return _Parsed(
        error=failures[-1] if failures else "",
        summary=texts[-1] if texts else "",
        turns=len(steps),
        input_tokens=_isum(
            [*(t.get("input") for t in tokens), *(c.get(k) for c in cache for k in ("read", "write"))]
        ),
        output_tokens=_isum(t.get("output") for t in tokens),
        cost_usd=_sum(s.get("cost") for s in steps),
    )


def _parse_gemini_json(stdout: str) -> _Parsed | None:
    """``gemini --output-format json``: ``{response, stats, error?}``; tokens summed over stats.models."""
    found = [o for o in _json_objects(stdout) if {"response", "stats", "error"} & o.keys()]
    if not found:
        return None
    r = found[-1]
    tokens = [_dict(_dict(m).get("tokens")) for m in _dict(_dict(r.get("stats")).get("models")).values()]
    error = r.get("error")
    return _Parsed(
        error=(_message(error) or "error") if error else "",
        summary=r["response"] if isinstance(r.get("response"), str) else "",
        input_tokens=_isum(t.get("prompt", t.get("input")) for t in tokens),
        output_tokens=_isum(t.get("candidates", t.get("output")) for t in tokens),
    )


_AIDER_TOKENS = re.compile(r"^Tokens:.*$", re.MULTILINE)
_AIDER_COUNT = r"([\d.,]+)\s*([kKmM]?)\s+{}\b"
_AIDER_SESSION_COST = re.compile(r"\$\s*([\d.,]+)\s+session")


def _parse_aider_text(stdout: str) -> _Parsed:
    """aider prints one "Tokens: 12k sent, 1.2k received. Cost: $0.02 message, $0.05 session." line per
    LLM call. Tokens are summed over the lines; the cost is the last line's session cost (one aider
    process is one session, so that is this run's total)."""
    lines = _AIDER_TOKENS.findall(stdout)

    def count(line: str, word: str) -> int | None:
        m = re.search(_AIDER_COUNT.format(word), line)
        return round(float(m[1].replace(",", "")) * {"k": 1e3, "m": 1e6}.get(m[2].lower(), 1)) if m else None

    cost = _AIDER_SESSION_COST.search(lines[-1]) if lines else None
    return _Parsed(
        turns=len(lines) or None,
        input_tokens=_isum(count(line, "sent") for line in lines),
        output_tokens=_isum(count(line, "received") for line in lines),
        cost_usd=float(cost[1].replace(",", "")) if cost else None,
    )


def _parse_text(stdout: str) -> _Parsed:
    """Plain text: nothing to read (croqq takes the idea from SUMMARY.txt)."""
    return _Parsed()


def _parse_command(stdout: str) -> _Parsed:
    """A ``command`` agent: plain text, unless it printed a result object as claude's JSON does (a line
    ``{"type": "result", "num_turns": 3, "usage": {"input_tokens": 900, "output_tokens": 200},
    "total_cost_usd": 0.02}``): then its turns, tokens and cost are the call's (and ``is_error`` or a
    ``subtype`` other than ``success`` fails it)."""
    return _parse_result_json(stdout) or _Parsed()


_PARSERS: Mapping[str, Callable[[str], _Parsed | None]] = MappingProxyType(
    {
        "claude-json": _parse_result_json,
        "cursor-json": _parse_result_json,
        "codex-jsonl": _parse_codex_jsonl,
        "opencode-jsonl": _parse_opencode_jsonl,
        "gemini-json": _parse_gemini_json,
        "aider-text": _parse_aider_text,
        "text": _parse_text,
        "command": _parse_command,
    }
)


# -- the table ----------------------------------------------------------------------------------------


def _preset(
    name: str, command: str, env: str, output: str, network: Network = "host", **codes: str
) -> Preset:
    """A table row: the command line as in the CLI's docs (split like a shell), the env names, the
    output format, the network policy and extra exit codes as ``_42="bad input"``."""
    executable, *argv = shlex.split(command)
    exit_codes = {0: "success", 1: "error", **{int(k.lstrip("_")): v for k, v in codes.items()}}
    return Preset(
        name, executable, tuple(argv), tuple(env.split()), MappingProxyType(exit_codes), output, network
    )


_OPTIONAL_MODEL = "'[--model {model}]'"
PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        p.name: p
        for p in (
            _preset(
                "claude",
                f"claude -p {{prompt}} --output-format json {_OPTIONAL_MODEL} --permission-mode dontAsk"
                " --allowedTools Read,Glob,Grep,Edit,Write --disallowedTools Bash,WebFetch,WebSearch"
                " --max-turns 40",
                env="ANTHROPIC_API_KEY CLAUDE_CODE_OAUTH_TOKEN",
                output="claude-json",
            ),
            _preset(
                "codex",
                "codex exec --sandbox workspace-write -C {workspace} --skip-git-repo-check --ephemeral --json"
                " '[-m {model}]' -c approval_policy='\"never\"' {prompt}",
                env="OPENAI_API_KEY CODEX_API_KEY",
                output="codex-jsonl",
            ),
            _preset(
                "opencode",
                "opencode run --format json '[-m {model}]' --agent build --auto {prompt}",
                env="ANTHROPIC_API_KEY OPENAI_API_KEY OPENROUTER_API_KEY GEMINI_API_KEY"
                " OPENCODE_CONFIG OPENCODE_PERMISSION",
                output="opencode-jsonl",
            ),
            _preset(
                "cursor",
                f"agent -p --output-format json {_OPTIONAL_MODEL} --workspace {{workspace}}"
                " --trust {prompt}",
                env="CURSOR_API_KEY",
                output="cursor-json",
            ),
            _preset(
                "gemini",
                "gemini -p {prompt} --approval-mode auto_edit --output-format json '[-m {model}]'",
                env="GEMINI_API_KEY GOOGLE_API_KEY",
                output="gemini-json",
                _42="bad input",
                _53="turn limit reached",
            ),
            # --no-git and the history files in the scratch folder: else aider creates .git and .aider.*
            # files in the workspace, which must hold nothing but the answer.
            _preset(
                "aider",
                "aider --message-file {prompt_file} --yes-always --no-auto-commits --no-dirty-commits"
                " --edit-format whole --no-suggest-shell-commands --no-check-update --no-fancy-input"
                f" --no-pretty --no-git --no-analytics --input-history-file {SCRATCH}/aider.input.history"
                f" --chat-history-file {SCRATCH}/aider.chat.history.md {_OPTIONAL_MODEL} {CANDIDATE}"
                f" --read {BEST} --read {CONTEXT} --read {HISTORY} --read {IDEAS}",
                env="OPENAI_API_KEY ANTHROPIC_API_KEY",
                output="aider-text",
            ),
            _preset(
                "scripted",
                shlex.join([*STDLIB_PYTHON, str(SCRIPTED)]),
                env="",
                output="text",
                network="none",
            ),
        )
    }
)


def preset_for(settings: Settings) -> Preset:
    """The preset of ``settings.agent`` with ``settings.agent_env``'s names added to its env;
    ``command`` is ``settings.agent_command`` split like a shell (run without one)."""
    if settings.agent == "command":
        try:
            words = shlex.split(settings.agent_command)
        except ValueError as e:
            raise ConfigError(
                _one_line(f"CROQQ_AGENT_COMMAND={settings.agent_command!r} does not parse ({e})")[:LINE_MAX]
            ) from None
        if not words:
            raise ConfigError("CROQQ_AGENT=command needs CROQQ_AGENT_COMMAND (the agent command to run)")
        preset = Preset("command", words[0], tuple(words[1:]), (), PRESETS["scripted"].exit_codes, "command")
    else:
        preset = PRESETS[settings.agent]
    extra = [name.strip() for name in settings.agent_env.split(",") if name.strip()]
    bad = [name for name in extra if not _ENV_NAME.match(name)]
    if bad:
        raise ConfigError(f"CROQQ_AGENT_ENV: {bad[0]!r} is not an environment variable name")
    return replace(preset, env=tuple(dict.fromkeys((*preset.env, *extra))))


# -- helpers ------------------------------------------------------------------------------------------

_JSON_START = re.compile(r"^[ \t]*[\[{]", re.MULTILINE)
_DECODER = json.JSONDecoder()


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object that starts a line (one-line NDJSON or pretty-printed; top-level arrays are
    flattened), skipping any other text; a truncated object at the end is ignored."""
    found: list[dict[str, Any]] = []
    pos = 0
    while m := _JSON_START.search(text, pos):
        try:
            value, pos = _DECODER.raw_decode(text, m.end() - 1)
        except ValueError:
            pos = m.end()
            continue
        values = value if isinstance(value, list) else [value]
        found += [v for v in values if isinstance(v, dict)]
    return found


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _message(error: object) -> str:
    """The message of an error object in any of the shapes the CLIs use (or a plain string)."""
    if isinstance(error, str):
        return error
    e = _dict(error)
    data = _dict(e.get("data"))
    for value in (e.get("message"), data.get("message"), e.get("name"), e.get("type")):
        if isinstance(value, str) and value:
            return value
    return ""


def _float(value: object) -> float | None:
    """A JSON number as a float (None for anything else, booleans included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    number = _float(value)
    return None if number is None else round(number)


def _sum(values: Iterable[object]) -> float | None:
    """The sum of the numbers among values, None when there are none."""
    numbers = [n for n in map(_float, values) if n is not None]
    return sum(numbers) if numbers else None


def _isum(values: Iterable[object]) -> int | None:
    return _int(_sum(values))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return _one_line(lines[-1]) if lines else ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
