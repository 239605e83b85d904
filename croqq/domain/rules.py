"""A kernel family's knob rules: which knob combinations the hardware cannot run, and why.

A rule is a Python-syntax boolean expression that must hold, over the knob names, the shape (``M``, ``N``,
``K``) and the dtype's element sizes (``A_BYTES``, ``C_BYTES``), with a one-line reason::

    {"require": "STAGES * (TILE_M + TILE_N) * TILE_K * A_BYTES <= 232448", "why": "stages exceed 227 KiB"}

Only arithmetic (``+ - * / // % **``), comparisons, ``and``/``or``/``not``, ``x if c else y`` and
``min``/``max`` are allowed: the manifest is data, never code. A knob candidate that breaks a rule becomes an
attempt with the rule's reason before any compile (the compiler's own ``static_assert`` stays the backstop
for what no rule says).
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

SHAPE_NAMES = ("M", "N", "K", "A_BYTES", "C_BYTES")

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
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
            ast.Load, ast.And, ast.Or, ast.Not, ast.USub, *_BINARY, *_COMPARE,
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


def holds(text: str, env: Mapping[str, int | float]) -> bool:
    return bool(_eval(parse(text), env))


def _eval(node: ast.expr, env: Mapping[str, int | float]) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return env[name]
        case ast.BinOp(left=left, op=op, right=right):
            return _BINARY[type(op)](_eval(left, env), _eval(right, env))
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _eval(operand, env)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_eval(operand, env)
        case ast.BoolOp(op=ast.And(), values=values):
            return all(_eval(v, env) for v in values)
        case ast.BoolOp(op=ast.Or(), values=values):
            return any(_eval(v, env) for v in values)
        case ast.IfExp(test=test, body=body, orelse=orelse):
            return _eval(body, env) if _eval(test, env) else _eval(orelse, env)
        case ast.Call(func=ast.Name(id=fn), args=args):
            return _CALLS[fn](*(_eval(a, env) for a in args))
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            values = [_eval(left, env), *(_eval(c, env) for c in comparators)]
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(ops, values, values[1:], strict=False))
    raise ValueError(f"cannot evaluate {ast.dump(node)}")  # parse() admits nothing else


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
