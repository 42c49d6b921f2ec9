"""The held-out evaluators of the chat-shaped stages (sft/mid, fine-tuning, DPO, RL, distillation).

`answer_accuracy_evaluator`: the model answers each held-out prompt (greedy, calculator on, through the
inference engine); a reply is right when its final answer equals the expected one: "The answer is X."
(the synthetic tasks), "#### X" (GSM8K) or the bare letter (multiple choice).
`val_loss_evaluator`: mean cross-entropy per supervised token on held-out conversations.
Each rank takes its share; sums go over ranks through `collectives.sum_over_ranks`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.data.chat_data import Conversation
from portachat.data.chat_loader import Bucket, rows_to_batch
from portachat.data.synthetic.tasks import extract_answer, final_segment, normalize_answer
from portachat.device import Device, DistEnv
from portachat.device.shapes import pad_bucket
from portachat.engine import SamplingParams
from portachat.engine.oneshot import engine_for, eval_mode
from portachat.eval.generation import as_chat_tokenizer, reply_text
from portachat.model import GPT
from portachat.train.collectives import sum_over_ranks
from portachat.train.engine_copy import engine_weights
from portachat.train.hooks import Evaluator
from portachat.train.rollout import Rollout
from portachat.train.stage import Render

MAX_EVAL_SEQS = 16  # answered at once: a KV cache for 16 replies, not one per held-out question


def reply_answer(reply: str) -> str | None:
    """The final answer a reply gives, in any of the accepted forms."""
    found = extract_answer(reply)
    if found is not None:
        return found
    text = final_segment(reply)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    letter = re.fullmatch(r"\(?([A-J])\)?\.?", text.strip())
    return letter.group(1) if letter else None


def is_correct(reply: str, expected: str) -> bool:
    got = reply_answer(reply)
    return got is not None and normalize_answer(got) == normalize_answer(str(expected))


def greedy_answers(model: GPT, chat_tok: Any, prompts: list[list[int]], dev: Device, max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy reply ids, through an engine over `model` in the device's inference dtype
    (engine_weights: a copy freed after, or the model itself), sized for these prompts and replies."""
    # A KV cache for these prompts and replies, not for 16 x 2,048 tokens (1.5 GB for SmolLM2 in fp32).
    need = max(len(p) for p in prompts) + max_tokens
    context = min(max(model.config.max_seq_len, need), -(-need // 64) * 64)
    with engine_weights(model, dev) as weights:
        engine = engine_for(weights, chat_tok, dev, max_num_seqs=min(len(prompts), MAX_EVAL_SEQS),
                            max_model_len=context)
        with eval_mode(model):  # no LoRA dropout while answering
            done = engine.generate(prompts, [SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0)
                                             for _ in prompts])
        del engine
    return [list(d.token_ids) for d in done]


def answer_accuracy_evaluator(conversations: Sequence[Conversation], tokenizer: Any, prompt: Callable[[Any], list[int]],
                              dev: Device, env: DistEnv, max_tokens: int = 64, name: str = "accuracy",
                              sampler: Rollout | None = None) -> Evaluator:
    """An evaluator hook: fraction of `conversations` (each with "messages" and "answer") answered right.
    `tokenizer`: ours or the model's ChatTokenizer; `prompt(messages)`: the ids asking for the reply.
    `sampler` shares an existing engine over the same model (RL) instead of building one per evaluation."""
    items = [c for c in conversations if c.get("answer") is not None]
    chat_tok = as_chat_tokenizer(tokenizer)
    mine = items[env.rank :: env.world_size]

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        right = 0
        if mine:
            prompts = [prompt(c["messages"]) for c in mine]
            if sampler is not None and sampler.model is model:
                replies = [r.token_ids for r in sampler.sample(prompts, max_tokens, 0.0, seeds=[0] * len(prompts))]
            else:
                replies = greedy_answers(model, chat_tok, prompts, dev, max_tokens)
            right = sum(is_correct(reply_text(chat_tok, ids), c["answer"]) for ids, c in zip(replies, mine, strict=True))
        counts = sum_over_ranks(torch.tensor([right, len(mine)], dtype=torch.int64, device=dev.torch_device), env)
        return {name: counts[0].item() / max(counts[1].item(), 1)} if counts[1] > 0 else {}

    return evaluate


def held_out_sums(convs: Sequence[Conversation], render: Render, pad: int, batch_size: int, seq_len: int,
                  dev: Device, env: DistEnv, bucket: Bucket, loss_sum: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
    """[summed loss, supervised tokens] over held-out conversations, every rank its share, summed over ranks
    (no gradients). `loss_sum(batch on the device)` is the batch's summed loss, computed under autocast."""
    mine = list(convs[env.rank :: env.world_size])
    total = torch.zeros(2, dtype=dev.accumulate_dtype, device=dev.torch_device)
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            rows = [render(c["messages"], seq_len + 1) for c in mine[i : i + batch_size]]
            batch = rows_to_batch(rows, pad, seq_len, bucket).to(dev.torch_device)
            with dev.autocast():
                loss = loss_sum(batch)
            total += torch.stack([loss.to(total.dtype), (batch.targets >= 0).sum().to(total.dtype)])
    return sum_over_ranks(total, env)


def val_loss_evaluator(convs: Sequence[Conversation], render: Render, pad: int, batch_size: int, seq_len: int,
                       dev: Device, env: DistEnv, bucket: Bucket = pad_bucket) -> Evaluator:
    """Mean cross-entropy per supervised token on held-out conversations (every rank its share)."""

    def evaluate(model: GPT, step: int) -> dict[str, float]:
        total = held_out_sums(convs, render, pad, batch_size, seq_len, dev, env, bucket,
                              lambda b: model(b.inputs, b.targets, loss_reduction="sum"))
        return {"val_loss": (total[0] / total[1].clamp(min=1)).item()}

    return evaluate
