"""`croqq import`: bring a CroqTile-style tuning tree into the results repo (read-only on the tree)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.errors import ConfigError

if TYPE_CHECKING:
    from croqq.store.importer.store import Written

COLUMNS = {  # summary field -> its column's title
    "source": "source",
    "key": "key",
    "imported_as": "as",
    "rows": "rows",
    "measured": "measured",
    "best_tflops": "best",
    "best_iter": "best id",
    "reference_tflops": "reference",
    "duplicate_ids": "dup ids",
    "problems": "problems",
}


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | dict):
        return str(len(value))
    return str(value)


def _print_table(objects: list[dict[str, object]], written: list[Written], dry_run: bool) -> None:
    table = Table(title="croqq import" + (" (dry run: nothing written)" if dry_run else ""))
    for col, title in COLUMNS.items():
        table.add_column(title, overflow="fold", no_wrap=col not in ("source", "key"), min_width=8)
    for obj in objects:
        table.add_row(*(_cell(obj.get(col)) for col in COLUMNS))
    console = Console()
    if not console.is_terminal:  # a file or a pipe: one line per log, not folded to 80 columns
        console = Console(width=240)
    console.print(table)
    problems = 0
    for obj, w in zip(objects, written, strict=True):
        if w.imported_as != "resumable" and w.why:
            console.print(f"{obj['source']}: {w.imported_as}: {w.why}", markup=False, highlight=False)
        for p in obj["problems"]:  # type: ignore[attr-defined]
            where = f" line {p['line']}" if p.get("line") else ""
            console.print(f"{obj['source']}{where}: {p['reason']}", markup=False, highlight=False)
            problems += 1
    kinds = [w.imported_as for w in written]
    iters, atts = sum(w.iterations for w in written), sum(w.attempts for w in written)
    verb = "would import" if dry_run else "imported"
    typer.echo(
        f"{verb} {len(objects)} log(s): {kinds.count('resumable')} resumable, {kinds.count('history')} "
        f"history, {kinds.count('skipped')} skipped; {iters} iteration(s), {atts} attempt(s); "
        f"{problems} problem(s)"
    )


def _check_paths(src: Path, into: Path) -> None:
    s, r = src.resolve(), into.resolve()
    if r == s or s in r.parents:
        raise ConfigError(
            f"the results repo {into} is inside {src}; import never writes to the tree it reads"
        )


def _ask_for_reconcile(settings) -> None:  # type: ignore[no-untyped-def]
    """A running Redis forgets its reconcile marker, so the writer registers the imported shapes (with
    their tried ideas and history) from the repo when it next starts or reconciles."""
    from croqq.delivery import keys
    from croqq.delivery.redis_client import connect, require_redis

    try:
        require_redis(settings, timeout_s=1.0)
    except ConfigError:
        return
    connect(settings).delete(keys.REDIS_RUN)


@app.command("import")
def import_tree(
    src: Path = typer.Argument(
        ..., help="A CroqTile-style tuning tree, one shape folder or one results.tsv."
    ),
    into: Path | None = typer.Option(None, "--into", help="Results repo (default CROQQ_RESULTS_REPO)."),
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU type the imported shapes resume on (default: the cluster's one type)."
    ),
    dsl: str = typer.Option("cuda", "--dsl", help="Kernel language of the imported sources."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Read and report; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per source log."),
) -> None:
    """Import a team's tuning history: per source log, every row becomes an iteration or an attempt of
    its shape (resumable by a later `croqq submit` with the same --gpu and --dsl) or, for what croqq
    cannot tune, read-only history. Idempotent; never writes to SRC. Stop the writer first."""
    from croqq.backends import backend_manifest
    from croqq.cli.repo import writer_lock
    from croqq.domain.knobs import include_resolver
    from croqq.domain.source import read_from
    from croqq.placement import registry
    from croqq.store.gitrepo import GitRepo
    from croqq.store.importer.read import read_tree
    from croqq.store.importer.store import import_logs
    from croqq.store.importer.summary import summarize

    settings = load_settings()
    manifest = backend_manifest(settings)
    manifest.dsl(dsl)
    repo_path = into or settings.results_repo
    logs = read_tree(src, gpu)  # a path that is no tree: one line, before anything else
    _check_paths(src, repo_path)
    if gpu is None:
        from croqq.delivery.redis_client import require_redis

        try:
            require_redis(settings, timeout_s=1.0)
        except ConfigError:
            raise ConfigError("no cluster to ask for its GPU type; pass --gpu TYPE") from None
    gpu_type = registry.pick_gpu_type(settings, manifest, gpu)
    root = src if src.is_dir() else src.parent
    lease = None if dry_run else writer_lock(settings, "croqq import")
    scratch = tempfile.TemporaryDirectory() if dry_run and not repo_path.exists() else None
    try:
        path = Path(scratch.name) / "repo" if scratch else repo_path
        repo = GitRepo(path, settings.results_branch, settings.sync_worktree, create=True)
        try:
            offered = read_from(include_resolver(manifest, dsl, settings.kernels_dir))
            written = import_logs(repo, logs, root, gpu_type, dsl, dry_run, manifest, offered)
        finally:
            repo.close()
    finally:
        if lease is not None:
            lease.release()
        if scratch is not None:
            scratch.cleanup()
    objects = []
    for log, w in zip(logs, written, strict=True):
        obj = summarize(log)
        out = w.as_json()
        obj["imported_as"] = w.imported_as
        obj["problems"] = [*obj["problems"], *out.pop("store_problems")]  # type: ignore[misc]
        obj["written"] = out
        objects.append(obj)
    if not dry_run and any(w.iterations or w.attempts for w in written):
        _ask_for_reconcile(settings)
    if as_json:
        typer.echo(json.dumps(objects, indent=1))
    else:
        _print_table(objects, written, dry_run)
