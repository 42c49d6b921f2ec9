"""Sampling assistant replies with the calculator tool, for RL rollouts and answer-accuracy evaluation.

A reply is the model's tokens plus, after each `<|python_start|>EXPR<|python_end|>` it writes, the
forced `<|output_start|>RESULT<|output_end|>` the tool returns. `reply_mask` marks which tokens the
model chose (1) and which the tool forced (0): RL must not credit the model for the tool's output.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from portachat.model import GPT, generate
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.bpe import ASSISTANT_END, OUTPUT_END, OUTPUT_START, PYTHON_END, PYTHON_START

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def _calc(node: ast.AST) -> object:
    if isinstance(node, ast.Expression):
        return _calc(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)) and not isinstance(node.value, bool):
        if isinstance(node.value, str) and len(node.value) > 100:
            raise ValueError("string too long")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_calc(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _calc(node.left), _calc(node.right)
        if not all(isinstance(v, (int, float)) for v in (left, right)) or any(abs(v) > 1e12 for v in (left, right)):
            raise ValueError("arithmetic on numbers below 1e12 only")
        return _BINOPS[type(node.op)](left, right)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "count"
            and len(node.args) == 1 and not node.keywords):
        text, sub = _calc(node.func.value), _calc(node.args[0])
        if isinstance(text, str) and isinstance(sub, str):
            return text.count(sub)
    raise ValueError("not a calculator expression")


def calculate(expression: str) -> str | None:
    """The calculator tool: integer/float arithmetic and 'word'.count('x'); None when refused."""
    try:
        value = _calc(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError, RecursionError):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 6) if isinstance(value, float) else value)


@dataclass
class Reply:
    token_ids: list[int]  # the reply after the prompt, tool outputs included
    mask: list[int]  # 1 = sampled by the model, 0 = forced by the tool
    text: str


@torch.no_grad()
def sample_reply(
    model: GPT,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float = 1.0,
    seed: int | None = None,
    autocast=None,
) -> Reply:
    """One assistant reply to `prompt_ids` (which end with <|assistant_start|>), running the tool."""
    special = tokenizer.special_ids
    stop = {special[ASSISTANT_END], tokenizer.bos_id, special[PYTHON_END]}
    limit = model.config.max_seq_len - len(prompt_ids)
    budget = min(max_tokens, limit)
    ids: list[int] = []
    mask: list[int] = []
    rounds = 0
    while len(ids) < budget:
        ctx = autocast() if autocast is not None else torch.autocast("cpu", enabled=False)
        with ctx:
            new = list(generate(model, prompt_ids + ids, max_new_tokens=budget - len(ids), temperature=temperature,
                                seed=None if seed is None else seed + rounds, stop_ids=stop))
        rounds += 1
        ids.extend(new)
        mask.extend([1] * len(new))
        if not new or new[-1] != special[PYTHON_END]:
            break
        starts = [i for i, t in enumerate(ids) if t == special[PYTHON_START]]
        expr = tokenizer.decode(ids[starts[-1] + 1 : -1]) if starts else ""
        result = calculate(expr) if starts else None
        forced = [special[OUTPUT_START], *tokenizer.encode(result or ""), special[OUTPUT_END]]
        forced = forced[: budget - len(ids)]
        ids.extend(forced)
        mask.extend([0] * len(forced))
    return Reply(ids, mask, tokenizer.decode(ids))


def sample_replies(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[list[int]],
    max_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    autocast=None,
) -> list[Reply]:
    was_training = model.training
    model.eval()
    try:
        return [sample_reply(model, tokenizer, p, max_tokens, temperature, seed + 1000 * i, autocast)
                for i, p in enumerate(prompts)]
    finally:
        model.train(was_training)
