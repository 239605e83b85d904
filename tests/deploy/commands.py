"""What the deployment tests share (``from commands import ...``: pytest puts this folder on sys.path):
the repo's paths, YAML loading, and what makes a `croqq ...` command line in docker-compose.yml or k8s/
valid: a real subcommand, its options parsed exactly as `croqq` parses them, without running anything."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click
import typer
import yaml

ROOT = Path(__file__).resolve().parents[2]

# The `croqq health --role` of each long-running command (the role its heartbeat file is named by).
HEALTH_ROLE = {
    "coordinator": "coordinator",
    "writer": "writer",
    "beat": "beat",
    "build-worker": "build",
    "ideate-worker": "ideate",
    "worker": "worker",
    "flower": "flower",
    "exporter": "exporter",
}

# Typer (0.29+) parses with its own copy of click, whose errors derive from TyperException.
USAGE_ERRORS: tuple[type[Exception], ...] = (
    click.UsageError,
    *[getattr(typer, "TyperException", click.UsageError)],
)


class InvalidCommand(AssertionError):
    """A croqq command line that `croqq` would refuse (the message is click's)."""


@functools.cache
def croqq_cli() -> Any:
    from croqq.cli import _register, app

    _register()
    return typer.main.get_command(app)


def parse_croqq(argv: list[str]) -> dict[str, object]:
    """The parameters ``croqq ARGS...`` parses to; InvalidCommand for an unknown subcommand, an unknown
    option, a bad or a missing value. Nothing is invoked."""
    if not argv or argv[0] != "croqq":
        raise InvalidCommand(f"not a croqq command line: {argv}")
    group = croqq_cli()
    try:
        top = group.make_context("croqq", list(argv[1:]))
        rest = [*getattr(top, "_protected_args", []), *top.args]  # the subcommand and its arguments
        name, command, args = group.resolve_command(top, rest)
        if command is None:
            raise InvalidCommand(f"no croqq command {rest[:1]}")
        return dict(command.make_context(name, args, parent=top).params)
    except USAGE_ERRORS as exc:
        raise InvalidCommand(f"croqq {' '.join(argv[1:])}: {exc.format_message()}") from exc  # type: ignore[attr-defined]


def croqq_argv(argv: object) -> list[str] | None:
    """``argv`` when it is a croqq command line, else None (redis-server, a shell probe)."""
    if isinstance(argv, list) and argv and argv[0] == "croqq":
        return [str(a) for a in argv]
    return None


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
