"""`croqq report`: an HTML report with plots of a results repo (see croqq/report)."""

from __future__ import annotations

from pathlib import Path

import typer

from croqq.cli import app
from croqq.cli.common import load_settings

HELP = (
    "Write OUT/index.html, one self-contained page (images embedded, nothing fetched from the network) "
    "built from the results repo's branch tip alone: it works on a clone, with no cluster running.\n\n"
    "Sections: a summary per run and dtype (shapes done/active/pending, iterations, speedup over the "
    "baseline and over cuBLAS); for every sweep line of the manifest's scenarios (CROQQ_MANIFEST, by "
    "default the kernels/manifest.json croqq ships with), best and baseline TFLOPS against the swept size, "
    "with the cuBLAS line where measured; TFLOPS per iteration (KEEP / DISCARD / FAIL, best-so-far "
    "staircase) for the --key shapes and the --top N best speedups; the outcome mix per dtype; GPU duty "
    "over time; a table of every shape.\n\n"
    "Progress goes to stderr: a bar on a terminal, otherwise a line every few seconds. Bad input (not a "
    "results repo, an unknown --key/--dtype/--gpu/--dsl, an unwritable --out) exits 2 with one line; a repo "
    "with nothing stored exits 1. An error never leaves a half-written report."
)


@app.command(help=HELP)
def report(
    repo: Path | None = typer.Option(None, "--repo", help="Results repo (default CROQQ_RESULTS_REPO)."),
    out: Path = typer.Option(
        Path("croqq-report"),
        "--out",
        help="Folder for index.html; an existing report there is replaced at the end, atomically.",
    ),
    key: list[str] = typer.Option(
        [], "--key", help="Draw this shape's iterations (repeatable), e.g. f16_4096x8192x8192."
    ),
    top: int = typer.Option(6, "--top", min=0, help="Also draw the N shapes with the best speedup."),
    dtype: str | None = typer.Option(None, "--dtype", help="Only this dtype (f16, e4m3, ...)."),
    gpu: str | None = typer.Option(None, "--gpu", help="Only this GPU type (a tuning/<gpu> folder)."),
    dsl: str | None = typer.Option(None, "--dsl", help="Only this kernel language (cuda, ...)."),
) -> None:
    """The report; see HELP."""
    from croqq.domain.manifest import load_manifest
    from croqq.report.build import Options, build
    from croqq.report.model import Selection

    settings = load_settings()
    opts = Options(
        repo=repo or settings.results_repo,
        out=out,
        branch=settings.results_branch,
        manifest=load_manifest(settings.manifest),
        selection=Selection(gpu=gpu, dsl=dsl, dtype=dtype, keys=tuple(dict.fromkeys(key))),
        top=top,
    )
    result = build(opts)
    typer.echo(
        f"wrote {result.index} ({result.shapes} shapes, {result.iterations} iterations, "
        f"{result.figures} figures, {result.seconds:.1f} s)"
    )
