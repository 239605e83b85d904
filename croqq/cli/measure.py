"""`croqq measure`: build and time one candidate on this host (the run_command stored in results.tsv)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from croqq.cli import app
from croqq.cli.common import load_settings
from croqq.errors import ConfigError

if TYPE_CHECKING:
    from croqq.domain.manifest import Manifest


def parse_knobs(text: str) -> dict[str, int]:
    """``"TILE_M=128,STAGES=4"`` -> {"TILE_M": 128, "STAGES": 4}."""
    knobs: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ConfigError(f"--knobs: {part!r} is not NAME=INTEGER (e.g. TILE_M=128,STAGES=4)")
        knobs[name.strip()] = int(value)
    return knobs


def parse_pins(pins: list[str]) -> dict[str, str]:
    """``["nvidia-cutlass==4.2.0.0"]`` -> {"nvidia-cutlass": "4.2.0.0"}."""
    parsed: dict[str, str] = {}
    for pin in pins:
        name, sep, version = (part.strip() for part in pin.partition("=="))
        if not (sep and name and version):
            raise ConfigError(f"--requires: {pin!r} is not NAME==VERSION (e.g. nvidia-cutlass==4.2.0.0)")
        parsed[name] = version
    return parsed


def pinned(manifest: Manifest, dsl: str, pins: dict[str, str]) -> Manifest:
    """The manifest with the dsl's packages at the versions a stored kernel was built with (its headers
    and its content hash are then those of that version)."""
    spec = manifest.dsl(dsl)
    packages = {
        name: pkg.model_copy(update={"version": pins.get(name, pkg.version)})
        for name, pkg in spec.build.packages.items()
    }
    build = spec.build.model_copy(update={"packages": packages})
    dsls = {**manifest.dsls, dsl: spec.model_copy(update={"build": build})}
    return manifest.model_copy(update={"dsls": dsls})


@app.command()
def measure(
    key: str = typer.Option(..., "--key", help="Shape key, e.g. f16_4096x8192x4096."),
    knobs: str = typer.Option("", "--knobs", help="NAME=VALUE,...; unset knobs take the reference kernel's."),
    source: Path | None = typer.Option(
        None,
        "--source",
        help="A candidate source file, e.g. a stored tuning/<gpu>/<dsl>/shapes/<key>/srcs/iterNNN_<tag>.cu: "
        "its includes are resolved next to it, so the stored headers are used (instead of --knobs).",
    ),
    gpu_type: str = typer.Option(
        "", "--gpu", help="The GPU type the measurement was stored for (a label; shown in the output)."
    ),
    dsl: str | None = typer.Option(
        None,
        "--dsl",
        help="Kernel family; default CROQQ_DSL, else from_current_best's (replay with backend=replay).",
    ),
    requires: list[str] = typer.Option(
        [],
        "--requires",
        help="NAME==VERSION of a package whose headers the kernel was built with (a stored run_command "
        "names each): another installed version is refused in one line; the build uses this one.",
    ),
    gpu_index: int = typer.Option(0, "--gpu-index", help="Which GPU of this host (simulated without NVML)."),
) -> None:
    """Build one candidate (knobs, or a source file) and measure it on one GPU of this host; print one
    JSON line (no cluster). Run in the results repo, `--source` reproduces a stored measurement."""
    from croqq.backends import backend_manifest, make_backend
    from croqq.backends._base import GpuContext
    from croqq.backends.toolchain import knob_candidate, require_package, toolchain_id
    from croqq.domain.knobs import seed_knobs, source_candidate
    from croqq.domain.shapes import parse_key
    from croqq.domain.source import SourceError, load_stored, read_file
    from croqq.probes import make_probe

    settings = load_settings()
    manifest = backend_manifest(settings)  # with backend=replay: plus the replay dsl
    dsl = manifest.family(dsl or settings.dsl)
    shape = parse_key(key)
    pins = parse_pins(requires)
    for name, version in pins.items():  # before any build: the stored kernel's own requirement
        require_package(name, version, str(source) if source is not None else f"--requires {name}")
    manifest = pinned(manifest, dsl, pins)
    if source is not None and knobs:
        raise ConfigError("--source and --knobs are exclusive: a source file sets its own knobs")
    if source is not None:
        try:
            text, headers = load_stored(str(source.resolve()), read_file)
        except SourceError as exc:
            raise ConfigError(f"--source: {exc}") from exc
        tool = toolchain_id(settings, manifest, dsl)
        cand = source_candidate(manifest, dsl, shape.dtype, text, headers, tool)
    else:
        chosen = seed_knobs(manifest, dsl, shape.dtype, "reference") | parse_knobs(knobs)
        cand = knob_candidate(manifest, settings, dsl, shape, chosen)
    probe = make_probe(settings)
    gpus = {g.index: g for g in probe.discover()}
    if gpu_index not in gpus:
        raise ConfigError(f"--gpu-index {gpu_index}: this host has GPU indexes {sorted(gpus)}")
    info = gpus[gpu_index]
    backend = make_backend(settings, manifest)
    build = backend.build(shape, cand)
    if not build.ok:
        typer.echo(json.dumps({"key": key, "built": False, "reason": build.reason}))
        raise typer.Exit(1)
    gpu = GpuContext(uuid=info.uuid, index=info.index, gpu_type=info.gpu_type, probe=probe)
    (result,) = backend.measure(gpu, shape, [build.artifact])
    typer.echo(
        json.dumps(
            {
                "key": key,
                "gpu": info.gpu_type,
                "stored_for": gpu_type or info.gpu_type,
                "content_hash": cand.content_hash,
                "knobs": cand.knobs,
                **result.model_dump(
                    include={
                        "outcome",
                        "tflops",
                        "hw_eff_pct",
                        "median_ms",
                        "min_ms",
                        "max_ms",
                        "repeats",
                        "verified",
                    }
                ),
            }
        )
    )
