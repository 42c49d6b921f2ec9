"""The calculator tool: arithmetic the model asks for between <|python_start|> and <|python_end|>.

The expression is parsed, never executed: only numbers, + - * / // % **, unary signs, parentheses
and nanochat's `"text".count("t")` pass the whitelist. Sizes are capped so that `9**9**9` or a
megabyte of input cannot stall the engine.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_EXPRESSION_CHARS = 256
MAX_INT_DIGITS = 60  # results and operands beyond this are refused (no giant powers)
MAX_EXPONENT = 64

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Refused(ValueError):
    pass


def _check_number(value: object) -> object:
    if isinstance(value, bool):
        raise _Refused("booleans are not numbers here")
    if isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
        raise _Refused("number too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused("not a finite number")
    return value


def _eval(node: ast.AST) -> object:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, (int, float)):
            return _check_number(node.value)
        raise _Refused(f"constant {node.value!r} not allowed")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        operand = _eval(node.operand)
        if isinstance(operand, str):
            raise _Refused("sign of a string")
        return _check_number(_UNARY[type(node.op)](operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(left, str) or isinstance(right, str):
            raise _Refused("arithmetic on strings")
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise _Refused("exponent too large")
        return _check_number(_BINARY[type(node.op)](left, right))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "count"
        and len(node.args) == 1
        and not node.keywords
    ):
        text, needle = _eval(node.func.value), _eval(node.args[0])
        if not isinstance(text, str) or not isinstance(needle, str):
            raise _Refused(".count() needs strings")
        return text.count(needle)
    raise _Refused(f"{type(node).__name__} not allowed")


def calculate(expression: str) -> str | None:
    """The result as text, or None when the expression is not plain arithmetic (then no output is
    forced and the model carries on, as nanochat does)."""
    expression = expression.strip()
    if not expression or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        value = _eval(ast.parse(expression, mode="eval"))
    except (_Refused, SyntaxError, ZeroDivisionError, OverflowError, ValueError, TypeError, RecursionError):
        return None
    return str(value)
