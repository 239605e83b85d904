"""`croqq stress`: run the real local cluster under a seeded fault schedule and check every invariant."""

from __future__ import annotations

from pathlib import Path

import typer

from croqq.cli import app
from croqq.cli.common import load_settings


@app.command()
def stress(
    agents_per_dsl: int = typer.Option(
        8, "--agents-per-dsl", min=1, help="Concurrent tuning loops (shapes) per dsl."
    ),
    round_target: int = typer.Option(
        10, "--round-target", min=2, help="Stored rounds per loop (iter000..R-1)."
    ),
    seed: int = typer.Option(0, "--seed", help="Fault schedule seed: same seed, same schedule."),
    run_name: str = typer.Option(..., "--run-name", help="Results go to experiments/stress/<run-name>/."),
    dsls: str = typer.Option("cuda", "--dsls", help="Comma-separated dsls of the manifest."),
    faults: str = typer.Option("default", "--faults", help="default (every kind) | none | kind,kind,..."),
    fault_count: int = typer.Option(
        0, "--fault-count", min=0, help="Faults to inject (default: 1 per 40 rounds)."
    ),
    sim_gpus: int = typer.Option(8, "--sim-gpus", min=1),
    lease_ttl: float = typer.Option(10.0, "--lease-ttl", min=0.5, help="Lease TTL in seconds."),
    timeout: float = typer.Option(
        3600.0, "--timeout", min=10, help="Give up (and fail) after this many seconds."
    ),
    out: Path = typer.Option(Path("experiments/stress"), "--out", help="Folder for the run's results."),
    store_group: int = typer.Option(
        1, "--store-group", min=1, max=256, help="The writer's group commit: the most STOREs per commit."
    ),
) -> None:
    """Tune N loops per dsl to R rounds on the real cluster (Redis, Celery workers, git writer, simulated
    GPUs) while killing processes mid-step, killing Redis and faulting GPUs; then check that no round was
    lost or duplicated. Exit 1 if any invariant failed."""
    import re

    from croqq.chaos.faults import parse_kinds
    from croqq.chaos.stress import StressConfig, run
    from croqq.domain.manifest import load_manifest
    from croqq.errors import ConfigError
    from croqq.logs import configure

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", run_name):
        raise ConfigError(f"--run-name {run_name!r}: use letters, digits, '.', '_' and '-'")
    manifest = load_manifest(load_settings().manifest)
    chosen = [d.strip() for d in dsls.split(",") if d.strip()]
    for dsl in chosen:
        manifest.dsl(dsl)
    kinds = parse_kinds(faults)
    total = agents_per_dsl * round_target * len(chosen)
    count = fault_count or (max(len(kinds), total // 40) if kinds else 0)
    cfg = StressConfig(
        agents_per_dsl=agents_per_dsl,
        round_target=round_target,
        seed=seed,
        run_name=run_name,
        dsls=chosen,
        kinds=kinds,
        fault_count=count,
        out_root=out,
        sim_gpus=sim_gpus,
        lease_ttl_s=lease_ttl,
        timeout_s=timeout,
        store_group=store_group,
    )
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "stress.log").unlink(missing_ok=True)  # a rerun of the same name starts afresh
    configure("INFO", cfg.out_dir / "stress.log")
    typer.echo(
        f"stress {run_name}: {total} rounds, {count} faults (seed {seed}); "
        f"log in {cfg.out_dir / 'stress.log'}"
    )
    result = run(cfg)
    s = result.summary
    typer.echo(
        f"{s['rounds_stored']}/{s['rounds_expected']} rounds stored, {s['rounds_lost']} lost, "
        f"{s['duplicates']} duplicated; {sum(s['faults_injected'].values())} faults; recovery p50 "
        f"{s['recovery_p50_s']} s, max {s['recovery_max_s']} s; validate ok: {s['validate_ok']}"
    )
    typer.echo(f"report: {cfg.out_dir / 'analysis.md'}")
    if not result.ok:
        for problem in result.problems[:20]:
            typer.echo(f"croqq: invariant failed: {problem}", err=True)
        raise typer.Exit(1)
