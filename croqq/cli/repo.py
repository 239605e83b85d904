"""`croqq validate` and `croqq clean`: check and repair the results repo."""

from __future__ import annotations

from pathlib import Path

import typer

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.errors import ConfigError


def _dsl_filter(dsl: str) -> str | None:
    if dsl == "all":
        return None
    from croqq.backends import backend_manifest

    backend_manifest(load_settings()).dsl(dsl)
    return dsl


def _repo_path(repo: Path | None) -> Path:
    path = repo or load_settings().results_repo
    if not path.exists():
        raise ConfigError(f"results repo {path} does not exist (set CROQQ_RESULTS_REPO or pass --repo)")
    return path


@app.command()
def validate(
    dsl: str = typer.Option(..., "--dsl", help="A dsl of the manifest, or 'all'."),
    repo: Path | None = typer.Option(None, "--repo", help="Results repo (default CROQQ_RESULTS_REPO)."),
) -> None:
    """Check the results repo's committed state: schemas, agreement between files, contiguous iteration ids,
    paths and #includes inside the repo. Exit 0 valid, 1 invalid (one line per problem), 2 usage."""
    from croqq.store.validate import validate_repo

    problems = validate_repo(_repo_path(repo), _dsl_filter(dsl), load_settings().results_branch)
    for problem in problems:
        typer.echo(str(problem))
    if problems:
        typer.echo(
            f"{len(problems)} problem(s); `croqq clean --dsl {dsl} --invalid-only` resets those shapes",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo("results repo is valid")


@app.command()
def clean(
    dsl: str = typer.Option(..., "--dsl", help="A dsl of the manifest, or 'all'."),
    invalid_only: bool = typer.Option(False, "--invalid-only", help="Reset only the shapes validate names."),
    repo: Path | None = typer.Option(None, "--repo", help="Results repo (default CROQQ_RESULTS_REPO)."),
) -> None:
    """Reset shape state in one commit: with --invalid-only only the invalid shapes, otherwise every shape
    that is not complete (completed shapes are kept). Needs the writer lock: stop the writer first."""
    from croqq.store.clean import clean as do_clean
    from croqq.store.gitrepo import GitRepo

    settings = load_settings()
    path = _repo_path(repo)
    lease = writer_lock(settings)
    try:
        git = GitRepo(path, settings.results_branch, settings.sync_worktree, create=False)
        report = do_clean(git, _dsl_filter(dsl), invalid_only)
        git.close()
    finally:
        if lease is not None:
            lease.release()
    keys = report.keys
    typer.echo(f"reset {len(keys)} shape(s)" + (f": {', '.join(keys)}" if keys else ""))
    if keys:
        _forget_live_state(settings, keys)


def writer_lock(settings, command: str = "croqq clean"):  # type: ignore[no-untyped-def]
    """Hold the writer lease while ``command`` writes the repo (only one process writes it); None without
    Redis."""
    from croqq.delivery.leases import Lease, owner_id
    from croqq.delivery.redis_client import connect, require_redis

    try:
        require_redis(settings, timeout_s=1.0)
    except ConfigError:
        return None
    lease = Lease(
        connect(settings), "writer", owner_id(command.rsplit(maxsplit=1)[-1]), settings.lease_ttl_s * 6
    )
    lease.acquire(wait_s=0, what=f"the writer lock (a writer is running; stop it before `{command}`)")
    return lease


def _forget_live_state(settings, keys: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Drop the cleaned shapes' live state so the next submit starts them afresh."""
    from croqq.delivery import keys as rkeys
    from croqq.delivery.redis_client import connect, require_redis

    try:
        require_redis(settings, timeout_s=1.0)
    except ConfigError:
        return
    from croqq.delivery.redis_client import strs
    from croqq.delivery.state import ShapeState

    client = connect(settings)
    for sid in strs(client.smembers(rkeys.SHAPES)):
        if sid.rsplit("/", 1)[-1] not in keys:
            continue
        raw = client.get(rkeys.shape(sid))
        state = ShapeState.loads(raw) if raw else None
        pipe = client.pipeline()
        pipe.delete(rkeys.shape(sid), rkeys.ideas(sid), rkeys.history(sid))
        pipe.srem(rkeys.SHAPES, sid)
        pipe.hdel(rkeys.SUMMARY, sid)
        pipe.zrem(rkeys.pending(sid.split("/", 1)[0]), sid)
        if state is not None and state.gpu_uuid:
            pipe.srem(rkeys.active(state.gpu_uuid), sid)
        pipe.execute()


repo_app = typer.Typer(
    help="Check the results repo's objects and refs, and repair it from its remote.", no_args_is_help=True
)
app.add_typer(repo_app, name="repo")


@repo_app.command("check")
def repo_check(
    repo: Path | None = typer.Option(None, "--repo", help="Results repo (default CROQQ_RESULTS_REPO)."),
) -> None:
    """Read every ref, pack and loose object (the writer's check, in full) and run `git fsck --full`.
    Exit 0 intact, 1 damaged (one line per problem). Safe while the writer runs."""
    from croqq.store.integrity import RepoCheck
    from croqq.store.repair import fsck_lines

    path = _repo_path(repo)
    lines = [d.line for d in RepoCheck(path, load_settings().results_branch).run()]
    lines += [f"git fsck: {line}" for line in fsck_lines(path)]
    for line in lines:
        typer.echo(line)
    if lines:
        typer.echo("the results repo is damaged; `croqq repo repair` re-fetches it from its remote", err=True)
        raise typer.Exit(1)
    typer.echo("results repo is intact")


@repo_app.command("repair")
def repo_repair(
    remote: str = typer.Option("", "--from", help="Remote to re-fetch from (default CROQQ_RESULTS_REMOTE)."),
    repo: Path | None = typer.Option(None, "--repo", help="Results repo (default CROQQ_RESULTS_REPO)."),
) -> None:
    """Move damaged packs, objects and refs aside, keep what is intact, re-fetch the rest from the remote
    and, when the local history cannot be read, move the branch to the remote's tip (the iterations after
    the last push are then run again). Needs the writer lock: stop the writer first."""
    from croqq.store.repair import repair

    settings = load_settings()
    path = _repo_path(repo)
    lease = writer_lock(settings, "croqq repo repair")
    try:
        report = repair(path, settings.results_branch, remote or settings.results_remote)
    finally:
        if lease is not None:
            lease.release()
    for line in report.lines:
        typer.echo(line)
    for file in report.quarantined:
        typer.echo(f"moved aside: {file}")
    typer.echo(f"results repo repaired: {settings.results_branch} at {report.after}")
    _clear_alarm(settings)


def _clear_alarm(settings) -> None:  # type: ignore[no-untyped-def]
    from croqq.delivery.redis_client import connect, require_redis
    from croqq.processes.runtime import REPO_ALARM
    from croqq.work.alarms import clear_everywhere

    try:
        require_redis(settings, timeout_s=1.0)
    except ConfigError:
        return
    clear_everywhere(connect(settings), REPO_ALARM)
