"""Agent CLI presets: argv construction, env names, parsing of recorded outputs (tests/fixtures/agents)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from croqq.errors import ConfigError
from croqq.proposers.agent import presets
from croqq.proposers.agent.presets import PRESETS, AgentReport, AgentRun, Preset, preset_for
from croqq.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "agents"
WS = Path("/tmp/ws 1")
PROMPT = "# Task\nMake it faster: {workspace} stays literal."
PROMPT_FILE = WS / "TASK.md"
READS = ["--read", "best.cu", "--read", "context.json", "--read", "history.md", "--read", "ideas.md"]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def run(stdout: str = "", exit_code: int | None = 0, stderr: str = "", **kw: object) -> AgentRun:
    return AgentRun(exit_code=exit_code, stdout=stdout, stderr=stderr, wall_s=12.4, **kw)  # type: ignore[arg-type]


def command(name: str, model: str) -> list[str]:
    return PRESETS[name].command(PROMPT, WS, model, PROMPT_FILE)


# -- argv ---------------------------------------------------------------------------------------------

EXPECTED_ARGV: dict[str, tuple[list[str], list[str], list[str]]] = {
    # name: (before the model flag, the model flag pair, after it)
    "claude": (
        ["claude", "-p", PROMPT, "--output-format", "json"],
        ["--model", "sonnet"],
        [
            "--permission-mode",
            "dontAsk",
            "--allowedTools",
            "Read,Glob,Grep,Edit,Write",
            "--disallowedTools",
            "Bash,WebFetch,WebSearch",
            "--max-turns",
            "40",
        ],
    ),
    "codex": (
        [
            "codex",
            "exec",
            "--sandbox",
            "workspace-write",
            "-C",
            str(WS),
            "--skip-git-repo-check",
            "--ephemeral",
            "--json",
        ],
        ["-m", "sonnet"],
        ["-c", 'approval_policy="never"', PROMPT],
    ),
    "opencode": (
        ["opencode", "run", "--format", "json"],
        ["-m", "sonnet"],
        ["--agent", "build", "--auto", PROMPT],
    ),
    "cursor": (
        ["agent", "-p", "--output-format", "json"],
        ["--model", "sonnet"],
        ["--workspace", str(WS), "--trust", PROMPT],
    ),
    "gemini": (
        ["gemini", "-p", PROMPT, "--approval-mode", "auto_edit", "--output-format", "json"],
        ["-m", "sonnet"],
        [],
    ),
    "aider": (
        [
            "aider",
            "--message-file",
            str(PROMPT_FILE),
            "--yes-always",
            "--no-auto-commits",
            "--no-dirty-commits",
            "--edit-format",
            "whole",
            "--no-suggest-shell-commands",
            "--no-check-update",
            "--no-fancy-input",
            "--no-pretty",
            "--no-git",
            "--no-analytics",
            "--input-history-file",
            ".agent-home/aider.input.history",
            "--chat-history-file",
            ".agent-home/aider.chat.history.md",
        ],
        ["--model", "sonnet"],
        ["candidate.cu", *READS],
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ARGV))
def test_argv_with_model(name: str) -> None:
    before, model, after = EXPECTED_ARGV[name]
    assert command(name, "sonnet") == [*before, *model, *after]


@pytest.mark.parametrize("name", sorted(EXPECTED_ARGV))
def test_argv_without_model_drops_the_flag_pair(name: str) -> None:
    before, _, after = EXPECTED_ARGV[name]
    args = command(name, "")
    assert args == [*before, *after]
    assert "" not in args and "{model}" not in " ".join(args)


def test_model_with_spaces_and_placeholder_text_is_one_literal_element() -> None:
    args = PRESETS["codex"].command("p", WS, "a b {prompt}", PROMPT_FILE)
    assert args[args.index("-m") + 1] == "a b {prompt}"
    assert args[-1] == "p"


def test_scripted_runs_the_script_next_to_the_module_isolated() -> None:
    args = command("scripted", "sonnet")
    script = Path(presets.__file__).resolve().parent / "scripted.py"
    assert args == [sys.executable, "-I", "-S", str(script)]
    assert Path(args[-1]).is_absolute()


def test_the_table_holds_the_six_clis_and_scripted() -> None:
    assert set(PRESETS) == {"claude", "codex", "opencode", "cursor", "gemini", "aider", "scripted"}
    assert all(p.exit_codes[0] == "success" for p in PRESETS.values())
    assert PRESETS["gemini"].exit_codes[53] == "turn limit reached"
    assert PRESETS["gemini"].exit_codes[42] == "bad input"


@pytest.mark.parametrize(
    ("name", "env"),
    [
        ("claude", ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")),
        ("codex", ("OPENAI_API_KEY", "CODEX_API_KEY")),
        ("cursor", ("CURSOR_API_KEY",)),
        ("gemini", ("GEMINI_API_KEY", "GOOGLE_API_KEY")),
        ("aider", ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")),
        ("scripted", ()),
    ],
)
def test_env_names(name: str, env: tuple[str, ...]) -> None:
    assert PRESETS[name].env == env


def test_opencode_env_has_provider_keys_and_its_config() -> None:
    env = PRESETS["opencode"].env
    assert {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENCODE_CONFIG", "OPENCODE_PERMISSION"} <= set(env)
    assert all(name.isupper() for name in env)


# -- preset_for ---------------------------------------------------------------------------------------


def test_preset_for_command_splits_like_a_shell_and_substitutes_only_present_placeholders() -> None:
    preset = preset_for(
        Settings(
            proposer="agent",
            agent="command",
            agent_command="""my-agent --dir {workspace} --note 'a b' "x y" '{"k": 1}'""",
        )
    )
    assert preset.name == "command" and preset.output == "command" and preset.env == ()
    assert preset.command(PROMPT, WS, "sonnet", PROMPT_FILE) == [
        "my-agent",
        "--dir",
        str(WS),
        "--note",
        "a b",
        "x y",
        '{"k": 1}',
    ]


def test_a_command_agent_reports_usage_in_a_result_line_or_prints_plain_text() -> None:
    preset = preset_for(Settings(proposer="agent", agent="command", agent_command="my-agent"))
    line = (
        '{"type": "result", "subtype": "success", "num_turns": 3, "total_cost_usd": 0.02,'
        ' "usage": {"input_tokens": 900, "output_tokens": 200}}'
    )
    report = preset.parse(run(f"thinking...\n{line}\n"))
    assert report.ok and (report.turns, report.input_tokens, report.output_tokens) == (3, 900, 200)
    assert report.cost_usd == 0.02
    plain = preset.parse(run("wrote candidate.cu\n"))
    assert plain.ok and plain.turns is None and plain.cost_usd is None
    failed = preset.parse(run('{"type": "result", "is_error": true, "result": "no idea left"}\n'))
    assert not failed.ok and failed.error == "command reported failure: no idea left"


def test_preset_for_command_optional_group() -> None:
    preset = preset_for(
        Settings(proposer="agent", agent="command", agent_command="bot '[--model {model}]' {prompt_file}")
    )
    assert preset.command(PROMPT, WS, "m1", PROMPT_FILE) == ["bot", "--model", "m1", str(PROMPT_FILE)]
    assert preset.command(PROMPT, WS, "", PROMPT_FILE) == ["bot", str(PROMPT_FILE)]


def test_preset_for_adds_agent_env_names_once() -> None:
    preset = preset_for(
        Settings(proposer="agent", agent="claude", agent_env=" HTTPS_PROXY, ANTHROPIC_API_KEY,,MY_KEY ")
    )
    assert preset.env == ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "HTTPS_PROXY", "MY_KEY")
    assert PRESETS["claude"].env == ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")  # table untouched


def test_preset_for_scripted_and_a_cli() -> None:
    assert preset_for(Settings(proposer="agent", agent="scripted")) == PRESETS["scripted"]
    assert preset_for(Settings(proposer="agent", agent="gemini")).argv == PRESETS["gemini"].argv


@pytest.mark.parametrize("cmd", ["", "   ", "agent 'unclosed", 'agent "half'])
def test_preset_for_bad_command_is_a_config_error(cmd: str) -> None:
    with pytest.raises(ConfigError) as info:
        preset_for(Settings(proposer="agent", agent="command", agent_command=cmd))
    message = str(info.value)
    assert "CROQQ_AGENT_COMMAND" in message and "\n" not in message and len(message) <= 300


def test_preset_for_bad_env_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="CROQQ_AGENT_ENV"):
        preset_for(Settings(proposer="agent", agent="claude", agent_env="GOOD,BAD-NAME"))


# -- parsing recorded outputs ---------------------------------------------------------------------------


def test_claude_success() -> None:
    report = PRESETS["claude"].parse(run(fixture("claude_success.json")))
    assert report == AgentReport(
        ok=True,
        error="",
        summary="Wrote candidate.cu: 128x256 tiles with a 4-stage cp.async pipeline and a swizzled "
        "shared-memory layout; SUMMARY.txt says why.",
        turns=7,
        input_tokens=21 + 9842 + 88412,
        output_tokens=3120,
        cost_usd=0.4213,
    )


def test_claude_max_turns_exit_1() -> None:
    report = PRESETS["claude"].parse(run(fixture("claude_error_max_turns.json"), exit_code=1))
    assert not report.ok
    assert report.error == "claude exited 1 (error): error_max_turns"
    assert (report.turns, report.output_tokens, report.cost_usd) == (41, 18220, 1.8721)
    assert report.summary == ""


def test_claude_max_turns_even_with_exit_0_is_not_ok() -> None:
    report = PRESETS["claude"].parse(run(fixture("claude_error_max_turns.json")))
    assert not report.ok and report.error == "claude reported failure: error_max_turns"


def test_claude_is_error_with_exit_0() -> None:
    report = PRESETS["claude"].parse(run(fixture("claude_is_error_exit0.json")))
    assert not report.ok
    assert report.error.startswith("claude reported failure: API Error: 529")
    assert "overloaded_error" in report.error
    assert (report.turns, report.input_tokens, report.output_tokens, report.cost_usd) == (1, 0, 0, 0.0)


def test_claude_takes_the_last_result_after_other_output() -> None:
    stdout = 'warning: something\n{"type":"system"}\n' + fixture("claude_success.json")
    assert PRESETS["claude"].parse(run(stdout)).turns == 7


def test_codex_success() -> None:
    report = PRESETS["codex"].parse(run(fixture("codex_success.jsonl")))
    assert report == AgentReport(
        ok=True,
        error="",
        summary="Done: candidate.cu uses 4 pipeline stages and BLOCK_K=64; the idea is in SUMMARY.txt.",
        turns=1,
        input_tokens=48210,
        output_tokens=5102,
        cost_usd=None,
    )


def test_codex_sums_turns() -> None:
    turn = '{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":0,"output_tokens":3}}\n'
    report = PRESETS["codex"].parse(run(turn * 3))
    assert (report.ok, report.turns, report.input_tokens, report.output_tokens) == (True, 3, 30, 9)


def test_codex_turn_failed() -> None:
    report = PRESETS["codex"].parse(run(fixture("codex_turn_failed.jsonl"), exit_code=1))
    assert not report.ok
    assert report.error == (
        "codex exited 1 (error): stream disconnected before completion: "
        "error sending request for url (https://api.openai.com/v1/responses)"
    )
    assert (report.turns, report.input_tokens, report.output_tokens) == (0, None, None)


def test_codex_error_event_with_exit_0_is_not_ok() -> None:
    stdout = '{"type":"turn.started"}\n{"type":"error","message":"quota exceeded"}\n'
    report = PRESETS["codex"].parse(run(stdout))
    assert not report.ok and report.error == "codex reported failure: quota exceeded"


def test_codex_without_a_terminal_event_printed_no_result() -> None:
    report = PRESETS["codex"].parse(
        run('{"type":"thread.started","thread_id":"t"}\n{"type":"turn.started"}\n')
    )
    assert not report.ok
    assert report.error.startswith('printed no codex result JSON (got \'{"type":"thread.started"')


def test_opencode_success() -> None:
    report = PRESETS["opencode"].parse(run(fixture("opencode_success.jsonl")))
    assert report.ok and report.error == ""
    assert report.summary == "Wrote candidate.cu with split-K=2 and SUMMARY.txt."
    assert report.turns == 2
    assert report.input_tokens == 5120 + 1000 + 6400 + 4096 + 512
    assert report.output_tokens == 240 + 1810
    assert report.cost_usd == pytest.approx(0.0334)


def test_opencode_error_event() -> None:
    stdout = (
        '{"type":"step_start","part":{"type":"step-start"}}\n'
        '{"type":"error","timestamp":1,"sessionID":"ses_1",'
        '"error":{"name":"APIError","data":{"message":"Invalid API key","statusCode":401}}}\n'
    )
    report = PRESETS["opencode"].parse(run(stdout))
    assert not report.ok and report.error == "opencode reported failure: Invalid API key"
    report = PRESETS["opencode"].parse(run(stdout, exit_code=1))
    assert report.error == "opencode exited 1 (error): Invalid API key"


def test_cursor_success() -> None:
    report = PRESETS["cursor"].parse(run(fixture("cursor_success.json")))
    assert report == AgentReport(
        ok=True,
        error="",
        summary="Created candidate.cu (warp-specialized producer/consumer, 2 consumer warpgroups)"
        " and SUMMARY.txt.",
    )


def test_cursor_failure_is_exit_code_and_stderr() -> None:
    report = PRESETS["cursor"].parse(run("", exit_code=1, stderr="\nError: Authentication required.\n\n"))
    assert report == AgentReport(ok=False, error="cursor exited 1 (error): Error: Authentication required.")


def test_gemini_success_pretty_printed_after_a_log_line() -> None:
    report = PRESETS["gemini"].parse(run(fixture("gemini_success.json")))
    assert report.ok and report.error == ""
    assert report.summary.startswith("I wrote candidate.cu: a 256x128 tile")
    assert report.input_tokens == 40210 + 1500
    assert report.output_tokens == 3890 + 20
    assert (report.turns, report.cost_usd) == (None, None)


def test_gemini_turn_limit() -> None:
    report = PRESETS["gemini"].parse(run(fixture("gemini_turn_limit.json"), exit_code=53))
    assert not report.ok
    assert report.error.startswith(
        "gemini exited 53 (turn limit reached): Reached max session turns for this session."
    )
    assert (report.input_tokens, report.output_tokens) == (800000, 41000)


def test_gemini_bad_input_without_json() -> None:
    report = PRESETS["gemini"].parse(run("", exit_code=42, stderr="Unknown argument: bogus"))
    assert report.error == "gemini exited 42 (bad input): Unknown argument: bogus"


def test_aider_success() -> None:
    report = PRESETS["aider"].parse(run(fixture("aider_success.txt")))
    assert report == AgentReport(
        ok=True,
        error="",
        summary="",
        turns=2,
        input_tokens=12000 + 15000,
        output_tokens=2300 + 412,
        cost_usd=0.12,
    )


def test_aider_token_suffixes_and_no_tokens_line() -> None:
    report = PRESETS["aider"].parse(
        run("Tokens: 1.5M sent, 999 received. Cost: $3.10 message, $3.10 session.")
    )
    assert (report.input_tokens, report.output_tokens, report.cost_usd) == (1_500_000, 999, 3.10)
    report = PRESETS["aider"].parse(run("nothing to see"))
    assert report == AgentReport(ok=True, error="")


@pytest.mark.parametrize("name", ["scripted", "command"])
def test_text_presets_ok_iff_exit_0(name: str) -> None:
    preset = PRESETS.get(name) or preset_for(Settings(proposer="agent", agent="command", agent_command="bot"))
    assert preset.parse(run("anything at all")) == AgentReport(ok=True, error="")
    failed = preset.parse(run("out\nlast out line\n", exit_code=3))
    assert failed == AgentReport(ok=False, error=f"{name} exited 3: last out line")
    failed = preset.parse(run("out", exit_code=1, stderr="Traceback ...\nValueError: boom\n"))
    assert failed.error == f"{name} exited 1 (error): ValueError: boom"
    killed = preset.parse(run("", exit_code=-9))
    assert killed.error == f"{name} killed by signal 9 (SIGKILL)"


# -- everywhere: timeouts, garbage, one-line errors -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_timed_out(name: str) -> None:
    report = PRESETS[name].parse(run("", exit_code=None, timed_out=True))
    assert report == AgentReport(ok=False, error=f"{name} timed out after 12 s")


def test_timed_out_keeps_the_usage_already_reported() -> None:
    report = PRESETS["codex"].parse(run(fixture("codex_success.jsonl"), exit_code=-9, timed_out=True))
    assert not report.ok and report.error == "codex timed out after 12 s"
    assert report.input_tokens == 48210


JSON_PRESETS = ["claude", "codex", "opencode", "cursor", "gemini"]


@pytest.mark.parametrize("name", JSON_PRESETS)
def test_garbage_with_exit_0_printed_no_result(name: str) -> None:
    report = PRESETS[name].parse(run(fixture("garbage.txt")))
    assert report == AgentReport(
        ok=False,
        error=f'printed no {name} result JSON (got "Error: EACCES: permission denied, open '
        f"'/home/agent/.config/\")",
    )


@pytest.mark.parametrize("name", JSON_PRESETS)
def test_garbage_with_exit_2(name: str) -> None:
    report = PRESETS[name].parse(run(fixture("garbage.txt"), exit_code=2, stderr="fatal: no network\n"))
    assert report == AgentReport(ok=False, error=f"{name} exited 2: fatal: no network")


def test_truncated_json_is_noted() -> None:
    stdout = fixture("claude_success.json")[:150]
    report = PRESETS["claude"].parse(run(stdout, truncated=True, stderr="warn: x"))
    assert not report.ok
    assert report.error.startswith('printed no claude result JSON (got \'{"type":"result"')
    assert report.error.endswith("; output truncated); stderr: warn: x")


def test_another_preset_does_not_accept_a_foreign_result() -> None:
    assert not PRESETS["gemini"].parse(run(fixture("codex_success.jsonl"))).ok
    assert not PRESETS["codex"].parse(run(fixture("claude_success.json"))).ok


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_errors_and_summaries_are_one_bounded_line(name: str) -> None:
    long = "x" * 2000 + "\n" + "y " * 500
    result = '{"type":"result","subtype":"success","is_error":true,"result":"' + "z\\n" * 600 + '"}'
    runs = [run(long, exit_code=1, stderr=long), run(result, exit_code=1)]
    if name in ("claude", "cursor"):
        runs.append(run(result))
    for r in runs:
        report = PRESETS[name].parse(r)
        assert not report.ok
        assert 0 < len(report.error) <= 300 and "\n" not in report.error
        assert len(report.summary) <= 300 and "\n" not in report.summary
        assert report.error.startswith(f"{name} ")


def test_preset_is_frozen() -> None:
    with pytest.raises(AttributeError):
        PRESETS["claude"].executable = "other"  # type: ignore[misc]
    assert isinstance(PRESETS["claude"], Preset)
