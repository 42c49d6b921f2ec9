"""Preference pairs a model makes from its own answers: sample, check, keep a right and a wrong reply.

For each prompt with a verifiable answer (the built-in synthetic tasks' train split, or GSM8K-style
rows of --data) the inference engine samples `num_samples` replies; each is checked (the task's own
verifier, or the final answer against the row's). A prompt with at least one right and one wrong
reply gives pairs {prompt, chosen: a right reply, rejected: a wrong one, answer}; prompts the model
always or never solves give none (no preference to learn). The file is written atomically, in TRL's
conversational layout, for `portachat train dpo --data`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portachat.data.chat_data import load_conversations
from portachat.data.preference_data import PreferencePair, pair_to_row
from portachat.data.synthetic.tasks import task_examples
from portachat.engine import SamplingParams
from portachat.engine.loading import LoadOptions, load_served_model
from portachat.eval.generation import reply_text
from portachat.i18n import _
from portachat.storage.atomic import write_text_atomic
from portachat.train.chat_eval import is_correct
from portachat.train.trainer import TrainingError

PREFS_CONTEXT = 1024  # tokens of prompt + reply the sampling engine makes room for


@dataclass
class Question:
    prompt: list[dict[str, Any]]  # the messages up to the reply
    answer: str
    check: Callable[[str], bool]  # reply text -> right or not


@dataclass
class PrefsOptions:
    model: str  # anything `--model` loads: our checkpoint, an HF directory, a .gguf
    output: str
    data: list[str] = field(default_factory=list)  # rows with answers; empty = the synthetic tasks
    tasks: list[str] | None = None  # synthetic tasks to ask (None: the curriculum's mix)
    num_prompts: int = 256
    num_samples: int = 4  # replies sampled per prompt
    pairs_per_prompt: int = 1
    temperature: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    device: str | None = None
    dtype: str | None = None


@dataclass
class PrefsResult:
    pairs: int
    prompts: int
    right: float  # share of sampled replies that were right
    all_right: int  # prompts every reply solved (no pair)
    all_wrong: int  # prompts no reply solved (no pair)
    path: Path


def questions(opts: PrefsOptions) -> list[Question]:
    """Prompts with their answers and checkers: the rows of --data, or the synthetic tasks' train split."""
    if opts.data:
        convs = [c for c in load_conversations(opts.data, limit=opts.num_prompts) if c.get("answer") is not None]
        if not convs:
            raise TrainingError(_("--data {data}: no rows with a verifiable answer (GSM8K 'question'/'answer', "
                                  "multiple choice, or 'messages' with 'answer')").format(data=", ".join(opts.data)))
        out = []
        for c in convs:
            prompt = list(c["messages"])
            while prompt and prompt[-1]["role"] == "assistant":  # the reference reply is what the model answers
                prompt.pop()
            answer = str(c["answer"])
            out.append(Question(prompt, answer, lambda reply, a=answer: is_correct(reply, a)))
        return out
    try:
        examples = task_examples(opts.num_prompts, "train", seed=f"prefs:{opts.seed}", tasks=opts.tasks)
    except ValueError as exc:
        raise TrainingError(_("--tasks: {error}").format(error=exc)) from None
    return [Question(ex.prompt, ex.answer, ex.verify) for ex in examples]


def make_pairs(items: Sequence[Question], replies: Sequence[Sequence[str]], pairs_per_prompt: int = 1
               ) -> tuple[list[PreferencePair], list[list[bool]]]:  # fmt: skip
    """Pairs from each question's checked replies (distinct right replies against distinct wrong ones)."""
    pairs: list[PreferencePair] = []
    verdicts: list[list[bool]] = []
    for item, texts in zip(items, replies, strict=True):
        marks = [item.check(t) for t in texts]
        verdicts.append(marks)
        right = list(dict.fromkeys(t for t, ok in zip(texts, marks, strict=True) if ok and t.strip()))
        wrong = list(dict.fromkeys(t for t, ok in zip(texts, marks, strict=True) if not ok and t.strip()))
        for chosen, rejected in list(zip(right, wrong, strict=False))[:pairs_per_prompt]:
            pairs.append(PreferencePair(item.prompt, [{"role": "assistant", "content": chosen}],
                                        [{"role": "assistant", "content": rejected}], item.answer))
    return pairs, verdicts


def write_pairs(path: Path, pairs: Sequence[PreferencePair]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(pair_to_row(p), ensure_ascii=False) + "\n" for p in pairs))


def sample_replies(opts: PrefsOptions, items: Sequence[Question]) -> list[list[str]]:
    """`num_samples` replies to each question, through an engine sized for these prompts and replies."""
    # The engine's context only as long as the longest prompt and reply: room for 64 of SmolLM2's full
    # 8,192-token context is gigabytes of KV cache for nothing.
    served = load_served_model(LoadOptions(model=opts.model, device=opts.device, dtype=opts.dtype,
                                           max_model_len=PREFS_CONTEXT, max_num_seqs=64))
    try:
        tok, engine = served.tokenizer, served.engine
        prompts = [tok.render_prompt(q.prompt) for q in items]
        room = served.max_model_len
        flat = [(i, s) for i in range(len(items)) for s in range(opts.num_samples) if len(prompts[i]) < room]
        params = [SamplingParams(max_tokens=min(opts.max_new_tokens, room - len(prompts[i])),
                                 temperature=opts.temperature, seed=opts.seed * 1_000_003 + i * opts.num_samples + s)
                  for i, s in flat]
        done = engine.generate([list(prompts[i]) for i, _s in flat], params)
    finally:
        if served.close is not None:
            served.close()
    texts: list[list[str]] = [[] for _ in items]
    for (i, _s), completion in zip(flat, done, strict=True):
        if completion.error:
            raise TrainingError(_("sampling failed: {error}").format(error=completion.error))
        texts[i].append(reply_text(tok, list(completion.token_ids)))
    return texts


def run_prefs(opts: PrefsOptions, print_fn: Callable[[str], None] = print) -> PrefsResult:
    """Sample the model on verifiable prompts and write its right/wrong replies as preference pairs."""
    if opts.num_samples < 2:
        raise TrainingError(_("--num-samples must be at least 2: a pair needs a right and a wrong reply"))
    items = questions(opts)
    print_fn("[portachat] prefs: " + _("sampling {k} replies to each of {n} prompts from {model}").format(
        k=opts.num_samples, n=len(items), model=opts.model))
    texts = sample_replies(opts, items)
    pairs, verdicts = make_pairs(items, texts, opts.pairs_per_prompt)
    if not pairs:
        raise TrainingError(_("no pairs: no prompt got both a right and a wrong reply among {k} samples. Sample more "
                              "(--num-samples), at another --temperature, or on tasks the model solves sometimes "
                              "(--tasks)").format(k=opts.num_samples))
    path = Path(opts.output)
    write_pairs(path, pairs)
    marks = [m for v in verdicts for m in v]
    result = PrefsResult(len(pairs), len(items), sum(marks) / max(len(marks), 1),
                         sum(1 for v in verdicts if v and all(v)), sum(1 for v in verdicts if v and not any(v)), path)
    print_fn("[portachat] prefs: " + _("{right:.1%} of replies right; {pairs} pairs written to {path} ({all_right} "
                                       "prompts always solved, {all_wrong} never: no pair)").format(
        right=result.right, pairs=result.pairs, path=path, all_right=result.all_right, all_wrong=result.all_wrong))
    return result
