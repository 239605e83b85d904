"""The `croqq` command line (Typer + Rich). Every error croqq raises on purpose becomes one line on stderr
and a non-zero exit: 2 for bad input or configuration, 1 for anything else."""

from __future__ import annotations

import sys

import typer

from croqq.errors import ConfigError, CroqqError

app = typer.Typer(
    name="croqq",
    help="A distributed control plane for non-stop GPU kernel tuning (Celery + Redis + git).\n\n"
    "Quick start on a laptop: `croqq up --dtype f16 --exit-when-done` runs a whole local cluster "
    "(embedded Redis, simulated GPUs) and tunes every f16 shape.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from croqq.cli import (  # noqa: F401
        exporter,
        gpu,
        gpu_check,
        importer,
        kernels,
        measure,
        processes,
        repo,
        report,
        retry,
        status,
        stress,
        submit,
        up,
    )


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"croqq: error: {message}", err=True)
    raise typer.Exit(code)


def main() -> None:
    _register()
    try:
        app()
    except ConfigError as exc:
        typer.echo(f"croqq: error: {exc}", err=True)
        sys.exit(2)
    except CroqqError as exc:
        typer.echo(f"croqq: error: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        from croqq.delivery.memory import is_full_error

        if not is_full_error(exc):
            raise
        typer.echo(
            "croqq: error: Redis is full and refuses writes: free memory or raise maxmemory, then try again",
            err=True,
        )
        sys.exit(1)
