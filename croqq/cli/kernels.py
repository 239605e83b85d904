"""`croqq kernels`: compile every kernel of the manifest with its reference knobs (`make kernels`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.errors import ConfigError


@app.command()
def kernels(
    out: Path = typer.Option(
        Path("build/kernels"), "--out", help="Build folder (one sub-folder per kernel)."
    ),
    key: str = typer.Option(
        "", "--shape", help="Shape as MxNxK, e.g. 8192x8192x8192 (default: the manifest's reference shape)."
    ),
    seed: str = typer.Option("reference", "--knobs", help="Knob set: reference or naive."),
) -> None:
    """Compile the cuda kernel of every dtype in kernels/manifest.json with nvcc for the manifest's arch."""
    from croqq.backends.cuda import CudaBackend, build_references
    from croqq.domain.manifest import load_manifest
    from croqq.domain.shapes import parse_dims

    if seed not in ("reference", "naive"):
        raise ConfigError(f"--knobs {seed!r}: use reference or naive")
    settings = load_settings()
    manifest = load_manifest(settings.manifest)
    dims = manifest.reference_shape if not key else parse_dims(key)
    backend = CudaBackend(manifest, settings.model_copy(update={"build_dir": out.resolve()}))
    outcomes = build_references(backend, dims, seed)
    table = Table(title=f"{seed} kernels for {'x'.join(map(str, dims))} ({manifest.dsl('cuda').build.arch})")
    for col in ("dtype", "built", "binary or first error"):
        table.add_column(col, overflow="fold")
    for dtype, outcome in outcomes.items():
        where = backend.artifact_binary(outcome.artifact) if outcome.ok else outcome.reason
        table.add_row(dtype, "yes" if outcome.ok else "[red]no[/]", where)
    Console().print(table)
    if not all(o.ok for o in outcomes.values()):
        raise typer.Exit(1)
