"""A kernel family's knob rules: which knob combinations the hardware cannot run, and why.

A rule is a Python-syntax boolean expression that must hold, over the knob names, the shape (``M``, ``N``,
``K``), the dtype's element sizes (``A_BYTES``, ``C_BYTES``) and ``SPARSE`` (1 where A is 2:4 sparse, so a
stage holds half of A's tile), with a one-line reason::

    {"require": "STAGES * (TILE_M + TILE_N) * TILE_K * A_BYTES <= 232448", "why": "stages exceed 227 KiB"}

Only arithmetic (``+ - * / // %``), comparisons, ``and``/``or``/``not``, ``x if c else y`` and
``min``/``max`` are allowed: the manifest is data, never code. A knob candidate that breaks a rule becomes an
attempt with the rule's reason before any compile (the compiler's own ``static_assert`` stays the backstop
for what no rule says).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable, Mapping
from types import CodeType
from typing import Any

SHAPE_NAMES = ("M", "N", "K", "A_BYTES", "C_BYTES", "SPARSE")

_OPERATORS = (
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)  # fmt: skip
_CALLS: dict[str, Callable[..., Any]] = {"min": min, "max": max}


@functools.lru_cache(maxsize=256)
def parse(text: str) -> ast.expr:
    """The rule's expression tree; ValueError naming what is not allowed."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"rule {text!r} is not an expression ({exc.msg})") from exc
    for node in ast.walk(tree):
        allowed = (
            ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.IfExp, ast.Name, ast.Constant, ast.Call,
            ast.Load, ast.And, ast.Or, ast.Not, ast.USub, *_OPERATORS,
        )  # fmt: skip
        if not isinstance(node, allowed):
            raise ValueError(f"rule {text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise ValueError(f"rule {text!r}: only numbers are allowed, not {node.value!r}")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in _CALLS and not node.keywords
        ):
            raise ValueError(f"rule {text!r}: only min(...) and max(...) may be called")
    return tree


def names(text: str) -> set[str]:
    """The variables a rule reads (function names aside)."""
    tree = parse(text)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


@functools.lru_cache(maxsize=256)
def _code(text: str) -> CodeType:
    """The rule compiled, once parse() has admitted only arithmetic over names: evaluated with no builtins
    but min and max it can do nothing else (and a family's space is enumerated by the hundred thousand)."""
    return compile(ast.Expression(parse(text)), f"<rule {text}>", "eval")


def holds(text: str, env: Mapping[str, int | float]) -> bool:
    return bool(eval(_code(text), {"__builtins__": _CALLS}, env))  # parse() checked it


def first_broken(rules: Iterable[tuple[str, str]], env: Mapping[str, int | float]) -> str | None:
    """The reason of the first rule (require, why) that ``env`` breaks, None when all hold."""
    for require, why in rules:
        try:
            ok = holds(require, env)
        except ArithmeticError as exc:  # e.g. a division by a knob that is 0
            return f"{why} (rule: {require}; {exc})"
        if not ok:
            return f"{why} (rule: {require})"
    return None
