"""Sampling assistant replies through the inference engine, for RL rollouts and answer-accuracy evaluation.

A reply is the model's tokens plus, after each `<|python_start|>EXPR<|python_end|>` it writes, the
`<|output_start|>RESULT<|output_end|>` the engine's calculator forces. `Reply.mask` marks which tokens
the model chose (1) and which the tool forced (0): RL must not credit the model for the tool's output.

The engine runs a copy of the training weights in the device's inference dtype (bf16 on accelerators;
the CPU runs the training model itself), refreshed in place from the master weights before every
batch of samples, so every rollout samples from the current weights; refreshing in place keeps the
copy's addresses, so decode graphs captured over it stay valid. Prefix caching is off: cached
keys/values of a prompt would come from the weights of an earlier step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from portachat.device import Device
from portachat.device.inference import training_engine_dtype
from portachat.engine import LLMEngine, SamplingParams
from portachat.engine.calculator import calculate
from portachat.engine.oneshot import engine_for
from portachat.eval.generation import reply_text
from portachat.i18n import _
from portachat.model import GPT
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.bpe import OUTPUT_END, OUTPUT_START, PYTHON_END, PYTHON_START
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from portachat.train.engine_copy import inference_copy, refresh_copy


@dataclass
class Reply:
    token_ids: list[int]  # the reply after the prompt: tool outputs and the closing stop token included
    mask: list[int]  # 1 = sampled by the model, 0 = forced by the tool
    text: str  # decoded, control tokens as literal text (for verifiers)


def tool_mask(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """1 for tokens the model sampled, 0 for the calculator output the engine forced after a call.

    The engine forces <|output_start|>RESULT<|output_end|> right after <|python_end|> exactly when the
    calculator accepts the expression; re-running the (pure) calculator tells those apart from an
    <|output_start|> the model wrote itself."""
    s = tokenizer.special_ids
    mask = [1] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i] == s[PYTHON_END] and i + 1 < len(ids) and ids[i + 1] == s[OUTPUT_START]:
            starts = [j for j in range(i) if ids[j] == s[PYTHON_START]]
            if starts and calculate(tokenizer.decode(ids[starts[-1] + 1 : i])) is not None:
                j = i + 1
                while j < len(ids):
                    mask[j] = 0
                    if ids[j] == s[OUTPUT_END]:
                        break
                    j += 1
                i = j
        i += 1
    return mask


class RolloutEngine:
    """An LLMEngine over the training model's weights (a copy in the inference dtype where the device
    decides one), built on first use."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, dev: Device, max_num_seqs: int = 64) -> None:
        self.model, self.tokenizer, self.dev, self.max_num_seqs = model, tokenizer, dev, max_num_seqs
        self.chat_tokenizer = PortachatChatTokenizer(tokenizer)
        self._engine: LLMEngine | None = None
        self.weights: GPT = model  # what the engine runs: the model itself, or its inference copy

    def engine(self) -> LLMEngine:
        if self._engine is None:  # room for max_num_seqs sequences of the model's context; mode kept
            dtype = training_engine_dtype(self.dev)
            self.weights = self.model if dtype is None else inference_copy(self.model, dtype)
            self._engine = engine_for(self.weights, self.chat_tokenizer, self.dev,
                                      max_num_seqs=self.max_num_seqs)
        return self._engine

    def sample(self, prompts: Sequence[list[int]], max_tokens: int, temperature: float, seeds: Sequence[int]) -> list[Reply]:
        """One reply per prompt (a prompt repeated G times gives a group), each with its own seed."""
        engine = self.engine()
        if self.weights is not self.model:  # the copy samples from this step's weights
            refresh_copy(self.weights, self.model)
            engine.reload_weights()
        was_training = self.model.training
        self.model.eval()
        try:
            limit = engine.max_model_len
            todo = [i for i, p in enumerate(prompts) if len(p) < limit]
            params = [SamplingParams(max_tokens=min(max_tokens, limit - len(prompts[i])), temperature=temperature,
                                     seed=int(seeds[i]), logprobs=False) for i in todo]
            done = engine.generate([list(prompts[i]) for i in todo], params) if todo else []
        finally:
            self.model.train(was_training)
        replies = [Reply([], [], "") for _ in prompts]
        for i, completion in zip(todo, done, strict=True):
            if completion.error:
                raise RuntimeError(_("sampling a rollout failed: {error}").format(error=completion.error))
            ids = list(completion.token_ids)
            replies[i] = Reply(ids, tool_mask(self.tokenizer, ids), reply_text(self.chat_tokenizer, ids))
        return replies
