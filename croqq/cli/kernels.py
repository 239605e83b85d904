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
    dsl: str = typer.Option(
        "", "--dsl", help="Only this kernel family (default: every dsl of the manifest)."
    ),
) -> None:
    """Compile the kernel of every dtype of every family (dsl) in kernels/manifest.json for its arch."""
    from croqq.backends.cuda import CudaBackend, build_references
    from croqq.domain.manifest import load_manifest
    from croqq.domain.shapes import parse_dims

    if seed not in ("reference", "naive"):
        raise ConfigError(f"--knobs {seed!r}: use reference or naive")
    settings = load_settings()
    manifest = load_manifest(settings.manifest)
    dims = manifest.reference_shape if not key else parse_dims(key)
    backend = CudaBackend(manifest, settings.model_copy(update={"build_dir": out.resolve()}))
    if dsl:
        manifest.dsl(dsl)  # an unknown one: a ConfigError naming the manifest's
    dsls = [dsl] if dsl else list(manifest.dsls)
    outcomes = build_references(backend, dims, seed, dsls)
    table = Table(title=f"{seed} kernels for {'x'.join(map(str, dims))}")
    for col in ("dsl", "dtype", "arch", "built", "binary or first error"):
        table.add_column(col, overflow="fold")
    for (family, dtype), outcome in outcomes.items():
        where = backend.artifact_binary(outcome.artifact) if outcome.ok else outcome.reason
        arch = manifest.dsl(family).build.arch
        table.add_row(family, dtype, arch, "yes" if outcome.ok else "[red]no[/]", where)
    Console().print(table)
    if not all(o.ok for o in outcomes.values()):
        raise typer.Exit(1)
