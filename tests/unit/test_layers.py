"""croqq's layers point down only: a module imports its own package, a lower layer, or a base module.

The layers, lowest first: domain; store and delivery; the plug-in families (probes, backends, proposers);
placement; work; processes; the read-only views (report, monitor) and the stress command (chaos), which
only the CLI imports; the CLI. Base modules (errors, settings, logs, patience) import no layer, and every
layer may import them. Packages of the same rank do not import each other. Every import counts, a lazy
one inside a function or one only for type checking included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

CROQQ = Path(__file__).resolve().parents[2] / "croqq"
BASE = -1
RANK = {
    "__init__": BASE,
    "errors": BASE,
    "settings": BASE,
    "logs": BASE,
    "patience": BASE,
    "diskspace": BASE,
    "domain": 0,
    "store": 1,
    "delivery": 1,
    "probes": 2,
    "backends": 3,
    "proposers": 4,
    "placement": 5,
    "work": 6,
    "processes": 7,
    "report": 8,
    "monitor": 8,
    "chaos": 8,
    "cli": 9,
    "__main__": 10,  # `python -m croqq`: the CLI
}
FORBIDDEN = ("croqq.bench", "tests", "benchmarks")  # tooling lives beside the package, never in it


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in ``path`` (croqq uses no relative imports)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module


def part_of(module: str) -> str:
    """The layer a croqq module belongs to: its top-level package or base module."""
    return module.split(".")[1] if "." in module else "__init__"


def allowed(source: str, target: str) -> bool:
    return source == target or RANK[target] < RANK[source] or RANK[source] == RANK[target] == BASE


def violations(root: Path) -> list[str]:
    """``file:line a -> b`` for each import of ``root``'s modules that points up, sideways or out."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        source = rel.parts[1].removesuffix(".py")
        for line, module in imports(path):
            where = f"{rel}:{line}"
            if any(module == name or module.startswith(f"{name}.") for name in FORBIDDEN):
                found.append(f"{where} {source} -> {module} (tooling: the package never imports it)")
            elif module.startswith("croqq."):
                target = part_of(module)
                if source not in RANK or target not in RANK:
                    unplaced = source if source not in RANK else target
                    found.append(f"{where} {source} -> {target} ({unplaced}: give it a rank in RANK)")
                elif not allowed(source, target):
                    found.append(f"{where} {source} -> {target}")
    return found


def test_layers_point_down_only() -> None:
    found = violations(CROQQ)
    print("\n".join(found))
    assert not found, (
        f"{len(found)} import(s) against the layers (a lower layer takes a callback or an argument)"
    )


def test_an_upward_import_is_named_by_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "croqq"
    (root / "delivery").mkdir(parents=True)
    (root / "delivery" / "ledger.py").write_text(
        "from croqq.domain import fsm\n\ndef f():\n    from croqq.placement.assign import x\n"
    )
    (root / "errors.py").write_text("import croqq.work\nfrom croqq.bench import samples\n")
    assert violations(root) == [
        "croqq/delivery/ledger.py:4 delivery -> placement",
        "croqq/errors.py:1 errors -> work",
        "croqq/errors.py:2 errors -> croqq.bench (tooling: the package never imports it)",
    ]
