"""Reward functions for GRPO: built-ins and the user's own, in TRL's calling convention, weighted.

A reward function is called once per batch of rollouts as TRL calls it:

    f(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns) -> list[float | None]

Prompts and completions are plain strings for plain prompts, and for conversational ones lists of
messages (a completion is `[{"role": "assistant", "content": text}]`); every other dataset column
comes as a keyword argument holding one value per completion. None means "does not apply" (NaN),
and the weighted sum over functions skips it, as TRL's nansum does. So a reward file written for
TRL's GRPOTrainer works unchanged: `--reward my_rewards.py:correctness`.

Built-ins (names for --reward):
  synthetic      1 if the final answer ("The answer is X.", "#### X" or a letter) equals column `answer`
  gsm8k          1 if the reply's final number equals the number in column `answer` (after "####" if any)
  regex:PATTERN  1 if the completion text matches PATTERN (re.search, DOTALL), else 0
  length:N       -(tokens beyond N) / N, at most -1: a soft penalty for replies longer than N tokens
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from portachat.eval.gsm8k import is_correct as gsm8k_correct
from portachat.eval.gsm8k import normalize_number
from portachat.i18n import _
from portachat.train.accumulation import TrainingError
from portachat.train.chat_eval import is_correct as answer_correct

RewardFn = Callable[..., list[float | None]]
BUILTINS = ("synthetic", "gsm8k", "regex:PATTERN", "length:N")


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a completion in either format."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion)


def _answers(kwargs: dict[str, Any], name: str, n: int) -> list[Any]:
    answers = kwargs.get("answer")
    if answers is None:
        raise TrainingError(_("reward {name} compares against an 'answer' column, and the prompts have none; add "
                              "one to --data or choose another --reward").format(name=name))
    return list(answers)[:n]


def synthetic_reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    answers = _answers(kwargs, "synthetic", len(completions))
    return [None if a is None else float(answer_correct(completion_text(c), str(a)))
            for c, a in zip(completions, answers, strict=True)]


def gsm8k_reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    out: list[float | None] = []
    for c, a in zip(completions, _answers(kwargs, "gsm8k", len(completions)), strict=True):
        expected = None if a is None else normalize_number(str(a).rsplit("####", 1)[-1])
        out.append(None if expected is None else float(gsm8k_correct(completion_text(c), expected)))
    return out


def regex_reward(pattern: str) -> RewardFn:
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise TrainingError(_("--reward regex:{pattern}: not a valid regular expression ({error})").format(
            pattern=pattern, error=exc)) from None

    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [float(compiled.search(completion_text(c)) is not None) for c in completions]

    return reward


def length_penalty(limit: int) -> RewardFn:
    def reward(prompts: list, completions: list, completion_ids: list[list[int]], **kwargs: Any) -> list[float | None]:
        return [-min(1.0, max(0, len(ids) - limit) / limit) for ids in completion_ids]

    return reward


def load_user_reward(spec: str) -> RewardFn:
    """`path.py:function` -> the function (the file is imported as a module of its own)."""
    file, _sep, name = spec.rpartition(":")
    path = Path(file).expanduser()
    if not path.is_file():
        raise TrainingError(_("--reward {spec}: no such file {path}").format(spec=spec, path=path))
    module_name = f"portachat_reward_{abs(hash(str(path.resolve())))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up by name
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise TrainingError(_("--reward {spec}: importing {path} failed ({error_type}: {error})").format(
            spec=spec, path=path, error_type=type(exc).__name__, error=exc)) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        found = ", ".join(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise TrainingError(_("--reward {spec}: {path} has no function {name} (functions: {found})").format(
            spec=spec, path=path, name=name, found=found or _("none")))
    return fn


def reward_function(spec: str) -> RewardFn:
    """A --reward argument -> its function: a built-in name or `path.py:function`."""
    if spec == "synthetic":
        return synthetic_reward
    if spec == "gsm8k":
        return gsm8k_reward
    if spec.startswith("regex:"):
        return regex_reward(spec.removeprefix("regex:"))
    if spec.startswith("length:"):
        value = spec.removeprefix("length:")
        if not value.isdigit() or int(value) < 1:
            raise TrainingError(_("--reward length:N needs a positive number of tokens, got {spec}").format(spec=spec))
        return length_penalty(int(value))
    if ":" in spec and spec.rpartition(":")[0].endswith(".py"):
        return load_user_reward(spec)
    raise TrainingError(_("--reward {spec}: not a built-in reward ({builtins}) nor path.py:function").format(
        spec=spec, builtins=", ".join(BUILTINS)))


def _label(spec: str) -> str:
    """A reward's short name: a user function's own name, a built-in's spec."""
    file, _sep, name = spec.rpartition(":")
    return name if file.endswith(".py") else spec


class Rewards:
    """Several reward functions and their weights; `score` gives each completion's weighted sum."""

    def __init__(self, specs: Sequence[str], weights: Sequence[float] | None = None) -> None:
        if not specs:
            raise TrainingError(_("give at least one --reward"))
        if weights is not None and len(weights) != len(specs):
            raise TrainingError(_("--reward-weights has {n} values for {m} rewards; give one per --reward").format(
                n=len(weights), m=len(specs)))
        self.specs = list(specs)
        self.names = [_label(s) for s in specs]  # the metric names: reward/<name>
        self.functions = [reward_function(s) for s in specs]
        self.weights = list(weights) if weights is not None else [1.0] * len(specs)

    def score(self, prompts: list, completions: list, completion_ids: list[list[int]],
              columns: dict[str, list[Any]]) -> tuple[list[float], dict[str, tuple[float, int]]]:
        """(each completion's weighted reward, each function's (sum, count) over the completions it applied to)."""
        n = len(completions)
        total = [0.0] * n
        seen = [False] * n
        applied_to: dict[str, tuple[float, int]] = {}
        for name, fn, w in zip(self.names, self.functions, self.weights, strict=True):
            values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
            if not isinstance(values, (list, tuple)) or len(values) != n:
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                raise TrainingError(_("reward {name} returned {got} values for {n} completions; it must return a "
                                      "list with one float (or None) per completion").format(name=name, got=got, n=n))
            applied = [(i, float(v)) for i, v in enumerate(values) if v is not None and not math.isnan(float(v))]
            for i, v in applied:
                total[i] += w * v
                seen[i] = True
            applied_to[name] = (sum(v for _i, v in applied), len(applied))
        return [t if s else 0.0 for t, s in zip(total, seen, strict=True)], applied_to
