"""The one engine training samples from: RL and GRPO rollouts, the RL probe, held-out answers that share
it, and on-policy distillation's replies.

One LLMEngine (paged KV cache, continuous batching) runs over a frozen copy of the training weights
(train.engine_copy) in the dtype the device layer picks (device.inference.rollout_engine_dtype: the
compute dtype on accelerators; fp32 on a CPU, where a frozen copy takes the engine's fused CPU forward,
which weights under training cannot), which `sync` refreshes in place before every batch: no reload,
the same addresses (re-fusing reuses the fused tensors; captured decode graphs stay valid). Under FSDP2
each rank keeps a whole copy for its engine and gathers the shards into it in place (a collective: every
rank samples, and so syncs, at the same points of the step). With a LoRA adapter in training
(--lora-rank) the engine runs the frozen base weights (shared, so on a CPU they take the engine's fused
forward once) and the adapter as one of its batched LoRA adapters, whose values `sync` copies in place.
`sample_groups`: the G replies of a prompt share its KV blocks (each group's first reply is admitted
alone, the other G - 1 once its prompt is computed, so they find the prompt's full blocks in the prefix
cache, cleared at every sync: keys and values from older weights must not be reused). Between batches
the engine sleeps: its KV cache's memory is given back while the trainer runs (engine.kv_sleep).

A reply is the model's tokens plus, after each `<|python_start|>EXPR<|python_end|>` it writes, the
`<|output_start|>RESULT<|output_end|>` the engine's calculator forces. `Reply.mask` marks which tokens
the model chose (1) and which the tool forced (0): RL must not credit the model for the tool's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from portachat.checkpoint.sharded import is_sharded, whole_copy
from portachat.device import Device
from portachat.device.inference import rollout_engine_dtype
from portachat.engine import LLMEngine, SamplingParams
from portachat.engine.calculator import calculate
from portachat.engine.kv_sleep import KVSleep
from portachat.engine.oneshot import engine_for, eval_mode
from portachat.engine.types import EngineError
from portachat.eval.generation import as_chat_tokenizer, reply_text
from portachat.i18n import _
from portachat.model import GPT
from portachat.ops.cpu_linear import fused_forward_available
from portachat.quant import model_dtype
from portachat.tokenizer.protocol import ChatTokenizer
from portachat.train.engine_copy import inference_copy, refresh_copy
from portachat.train.lora import adapter_weights, without_adapters

POLICY = "policy"  # the engine's name for the LoRA adapter being trained


@dataclass
class Reply:
    token_ids: list[int]  # the reply after the prompt: tool outputs and the closing stop token included
    mask: list[int]  # 1 = sampled by the model, 0 = forced by the tool
    text: str  # up to its stop token, tool calls as literal markers (for verifiers)


def tool_mask(tokenizer: Any, ids: list[int]) -> list[int]:
    """1 for tokens the model sampled, 0 for the calculator output the engine forced after a call (all 1
    for a tokenizer without the calculator's tokens).

    The engine forces <|output_start|>RESULT<|output_end|> right after <|python_end|> exactly when the
    calculator accepts the expression; re-running the (pure) calculator tells those apart from an
    <|output_start|> the model wrote itself."""
    chat_tok = as_chat_tokenizer(tokenizer)
    tools = chat_tok.tool_tokens
    mask = [1] * len(ids)
    if tools is None:
        return mask
    i = 0
    while i < len(ids):
        if ids[i] == tools.python_end and i + 1 < len(ids) and ids[i + 1] == tools.output_start:
            starts = [j for j in range(i) if ids[j] == tools.python_start]
            if starts and calculate(chat_tok.decode(ids[starts[-1] + 1 : i])) is not None:
                j = i + 1
                while j < len(ids):
                    mask[j] = 0
                    if ids[j] == tools.output_end:
                        break
                    j += 1
                i = j
        i += 1
    return mask


class Rollout:
    """An engine over `model`'s current weights, built on first use. `tokenizer`: ours or the model's
    ChatTokenizer (None: ids only). `max_model_len`: None = the model's context. `lora`: the model carries a LoRA adapter
    being trained (only the adapter changes). `copy=False`: run the training weights themselves even
    where the device layer would copy them (benchmarks)."""

    def __init__(self, model: GPT, tokenizer: Any, dev: Device, max_num_seqs: int, max_model_len: int | None = None,
                 lora: bool = False, copy: bool = True) -> None:
        self.model, self.dev = model, dev
        self.tokenizer: ChatTokenizer | None = as_chat_tokenizer(tokenizer) if tokenizer is not None else None
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len or model.config.max_seq_len
        self.adapter = POLICY if lora else None
        self.copy = copy
        self._engine: LLMEngine | None = None
        self.kv: KVSleep | None = None
        self.weights: GPT = model  # what the engine runs: the model itself, or its inference copy
        self.freed_bytes = 0  # KV cache bytes given back at the last sleep

    def engine(self) -> LLMEngine:
        if self._engine is None:
            if self.adapter is not None:  # the frozen base, shared (or in the inference dtype), and the adapter
                if is_sharded(self.model):
                    raise EngineError(_("GRPO with --lora-rank keeps a whole model on every device: pass --fsdp off"),
                                      kind="invalid")
                self.weights = self._rollout_weights(without_adapters(self.model), frozen=True)
            else:
                self.weights = self._rollout_weights(self.model, frozen=False)
            self._engine = engine_for(self.weights, self.tokenizer, self.dev, max_num_seqs=self.max_num_seqs,
                                      max_model_len=self.max_model_len, prefix_caching=True)
            self.kv = KVSleep(self._engine)
            if self.adapter is not None:
                self._engine.add_adapter(self.adapter, adapter_weights(self.model))
        return self._engine

    def _rollout_weights(self, model: GPT, frozen: bool) -> GPT:
        """The model the engine runs: a copy in the device's rollout dtype (the CPU's fp32 copy only
        where the engine fuses its products), whole under FSDP2 (a collective), or the model itself.
        `frozen` weights (LoRA's base) never change, so the engine fuses them as they are: no same-dtype copy."""
        dtype = rollout_engine_dtype(self.dev) if self.copy else None
        if dtype == model_dtype(model) and (frozen or not fused_forward_available(self.dev.type, dtype)):
            dtype = None  # a copy in the same dtype is worth it only for the fused forward of changing weights
        if is_sharded(model):  # FSDP2: the engine needs whole weights (gathered: a collective)
            return inference_copy(whole_copy(model), dtype or torch.float32)
        return model if dtype is None else inference_copy(model, dtype)

    def sync(self) -> None:
        """Make the engine sample from the model's current weights: the copy refreshed in place (or the
        adapter's values, with LoRA), fused products rebuilt over the same memory, cached prefixes dropped."""
        engine = self.engine()
        if self.adapter is not None:  # the base never changes: only the adapter's values are copied in
            engine.refresh_adapter(self.adapter, adapter_weights(self.model))
            return
        if is_sharded(self.model):  # every rank gathers the whole weights together, then copies in place
            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
            with torch.no_grad():
                for name, p in self.weights.named_parameters():
                    p.copy_(state[name])
        elif self.weights is not self.model:
            refresh_copy(self.weights, self.model)
        engine.reload_weights()

    def sleep(self) -> int:
        """Give the KV cache back until the next batch; returns the bytes freed."""
        self.freed_bytes = self.kv.sleep() if self.kv is not None else 0
        return self.freed_bytes

    def reply(self, ids: list[int]) -> Reply:
        if self.tokenizer is None:
            return Reply(ids, [1] * len(ids), "")
        return Reply(ids, tool_mask(self.tokenizer, ids), reply_text(self.tokenizer, ids))

    def sample(self, prompts: Sequence[list[int]], max_tokens: int, temperature: float,
               seeds: Sequence[int]) -> list[Reply]:
        """One reply per prompt (a prompt repeated G times gives a group), each with its own seed; a prompt
        that fills the context gets an empty reply."""
        engine = self.engine()
        self.kv.wake()
        self.sync()
        limit = self.max_model_len
        todo = [i for i, p in enumerate(prompts) if len(p) < limit]
        params = [SamplingParams(max_tokens=min(max_tokens, limit - len(prompts[i])), temperature=temperature,
                                 seed=int(seeds[i]), logprobs=False, adapter=self.adapter) for i in todo]
        with eval_mode(self.model):
            done = engine.generate([list(prompts[i]) for i in todo], params) if todo else []
        replies = [Reply([], [], "") for _ in prompts]
        for i, completion in zip(todo, done, strict=True):
            if completion.error:
                raise RuntimeError(_("sampling a rollout failed: {error}").format(error=completion.error))
            replies[i] = self.reply(list(completion.token_ids))
        return replies

    def sample_groups(self, prompts: Sequence[list[int]], group_size: int, max_tokens: int, temperature: float,
                      seed: int) -> list[list[list[int]]]:
        """For each prompt, `group_size` replies (token ids, the closing stop token included); reply k of
        prompt g samples with seed `seed + g * group_size + k`."""
        engine = self.engine()
        self.kv.wake()
        self.sync()
        replies: list[list[list[int]]] = [[[] for _ in range(group_size)] for _ in prompts]
        which: dict[str, tuple[int, int]] = {}
        followers_due = set(range(len(prompts)))

        def add(g: int, k: int) -> None:
            room = self.max_model_len - len(prompts[g])
            if room < 1:
                raise EngineError(_("a prompt of {n} tokens leaves no room for a reply in {limit} tokens").format(
                    n=len(prompts[g]), limit=self.max_model_len), kind="too_long")
            params = SamplingParams(max_tokens=min(max_tokens, room), temperature=temperature,
                                    seed=seed + g * group_size + k, logprobs=False, adapter=self.adapter)
            which[engine.add_request(list(prompts[g]), params)] = (g, k)

        with eval_mode(self.model):
            for g in range(len(prompts)):
                add(g, 0)
            while engine.has_unfinished():
                for out in engine.step():
                    g, k = which[out.request_id]
                    if out.error:
                        raise RuntimeError(_("sampling a rollout failed: {error}").format(error=out.error))
                    replies[g][k].extend(out.token_ids)
                    if k == 0 and g in followers_due:  # the prompt is computed: its blocks are cached now
                        followers_due.discard(g)
                        for j in range(1, group_size):
                            add(g, j)
        return replies
