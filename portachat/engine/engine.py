"""LLMEngine: requests in, streamed outputs out, one scheduler step at a time.

    engine = LLMEngine(model, tokenizer, EngineConfig())
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=64))
    while engine.has_unfinished():
        for out in engine.step(): ...

A step = schedule (which tokens of which sequences) -> one forward -> sample -> per-sequence
bookkeeping (calculator tool, detokenization, stop conditions, freeing blocks of finished ones).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from portachat.device import Device, diagnose, get_device
from portachat.device.fast_path_choice import kv_block_size
from portachat.device.graphs import GraphCapturer
from portachat.device.inference import choose_kv_cache_dtype, decode_compile, decode_graphs
from portachat.engine.block_manager import BlockManager
from portachat.engine.calculator import calculate
from portachat.engine.config import EngineConfig
from portachat.engine.detokenizer import Detokenizer
from portachat.engine.limits import check_context
from portachat.engine.offline import Completion, generate
from portachat.engine.runner import ModelRunner
from portachat.engine.sampler import sample
from portachat.engine.sampling_params import check_params
from portachat.engine.scheduler import Scheduler
from portachat.engine.sequence import Sequence
from portachat.engine.setup import kv_blocks, weights_dtype
from portachat.engine.speculative import Speculator
from portachat.engine.structured.compile import Constraints
from portachat.engine.structured.masks import TokenMasks, allocate_bitmask
from portachat.engine.types import EngineError, RequestOutput, SamplingParams
from portachat.i18n import _
from portachat.model.gpt import GPT
from portachat.model.lora import LoraWeights, load_lora
from portachat.model.lora_batch import AdapterSet
from portachat.tokenizer.protocol import ChatTokenizer

MAX_TOOL_EXPRESSION_TOKENS = 128  # a tool call longer than this is abandoned (no output forced)


class LLMEngine:
    def __init__(
        self,
        model: GPT,
        tokenizer: ChatTokenizer,
        config: EngineConfig | None = None,
        device: Device | None = None,
        runner_cls: type[ModelRunner] = ModelRunner,
    ) -> None:
        """`runner_cls` runs the forward (portachat.engine.build picks the tensor-parallel one for a shard)."""
        self.config = config = config or EngineConfig()
        self.device = device = device or get_device()
        if config.block_size is None:  # the device's block size (128 on Ascend)
            block_size, _why = kv_block_size(device.kind, device.attention_backend)
            self.config = config = dataclasses.replace(config, block_size=block_size)
        self.tokenizer = tokenizer
        cfg = model.config
        # Weights: cast in place (the engine owns a frozen model it is given).
        dtype, self.dtype_reason = weights_dtype(model, config, device)
        self.dtype = dtype
        model.to(device=device.torch_device, dtype=dtype).eval()
        self.model = model

        self.max_model_len = config.max_model_len or cfg.max_seq_len
        if config.max_num_seqs < 1 or config.max_num_batched_tokens < 1 or config.block_size < 1:
            raise EngineError(_("max_num_seqs, max_num_batched_tokens and block_size must be positive"))
        try:
            kv_choice = choose_kv_cache_dtype(device, dtype, config.kv_cache_dtype)
        except ValueError as exc:
            raise EngineError(str(exc), kind="invalid") from exc
        self.kv_dtype, self.kv_dtype_reason = kv_choice.value, kv_choice.reason
        num_blocks, self.kv_reason = kv_blocks(self.model, config, device, self.dtype, self.kv_dtype, self.max_model_len)
        min_blocks = -(-self.max_model_len // config.block_size)
        if num_blocks < min_blocks:
            raise EngineError(
                _("the KV cache holds {tokens} tokens ({reason}), less than one sequence of --max-model-len "
                  "{max_model_len}; lower --max-model-len or raise --kv-cache-gb").format(
                    tokens=num_blocks * config.block_size, reason=self.kv_reason, max_model_len=self.max_model_len),
                kind="invalid",
            )
        self.blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = runner_cls(
            model, num_blocks, config.block_size, self.max_model_len, device.torch_device, dtype, self.kv_dtype
        )
        compile_choice = decode_compile(device, config.compile, packed=self.runner.packed is not None,
                                        paged_kernels=self.runner.slot_major)
        self.compiled = bool(compile_choice.value)
        self.compile_reason = compile_choice.reason
        if self.compiled:
            self.runner.enable_compile()
        sharded = any(isinstance(p, DTensor) for p in model.parameters())
        graphs = decode_graphs(device, False if config.enforce_eager else None, packed=self.runner.packed is not None,
                               compiled=self.compiled, sharded=sharded, paged_kernels=self.runner.slot_major)  # fmt: skip
        self.graphs_reason = graphs.reason
        if graphs.value:
            self.runner.enable_decode_graphs(config.max_num_seqs, GraphCapturer(device.type))
        self.speculator: Speculator | None = None
        if config.speculative is not None:
            self.speculator = Speculator(config.speculative, self.blocks, self.max_model_len, device.torch_device)
        self.stop_ids = set(tokenizer.stop_ids)
        self.tools = tokenizer.tool_tokens
        self._seqs: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._adapter_salts: dict[str, int] = {}
        self._seed_source = torch.Generator().manual_seed(torch.initial_seed() % 2**63)
        self.num_steps = 0
        self._constraints = None  # structured.compile.Constraints, built on the first constrained request
        self._mask_thread: ThreadPoolExecutor | None = None
        self._structured_lock = threading.Lock()

    # ------------------------------------------------------------------ requests

    def add_request(
        self, prompt_ids: list[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        params = params or SamplingParams()
        check_params(params, self.model.config.vocab_size)
        if not prompt_ids:
            raise EngineError(
                _("the prompt is empty: give at least one token (e.g. the BOS token)"), kind="invalid"
            )
        vocab = self.model.config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt_ids):
            raise EngineError(_("prompt token ids must be integers in [0, {vocab})").format(vocab=vocab), kind="invalid")
        check_context(len(prompt_ids), params.max_tokens, self.max_model_len)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineError(
                _("the waiting queue is full ({count} requests); retry later").format(count=self.config.max_waiting),
                kind="queue_full",
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._seqs:
            raise EngineError(_("request id {id} is already in use").format(id=repr(request_id)), kind="invalid")
        matcher = self._matcher(params) if params.structured is not None else None
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        salt = None
        if params.adapter is not None:
            lora = self.runner.lora
            if lora is None or params.adapter not in lora:
                loaded = ", ".join(lora.names) if lora else _("none")
                raise EngineError(_("unknown LoRA adapter {name} (loaded: {loaded})").format(
                    name=repr(params.adapter), loaded=loaded), kind="invalid")
            salt = self._adapter_salts[params.adapter]
        seq = Sequence(
            cache_salt=salt,
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            params=params,
            detokenizer=Detokenizer(self.tokenizer.token_bytes, params.stop),
            generator=torch.Generator().manual_seed(seed) if params.temperature > 0 else None,
            arrival=next(self._arrivals),
            matcher=matcher,
        )
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def prepare_structured(self) -> None:
        """Build the grammar library's view of the tokenizer now (a second or so for a 49k
        vocabulary on a CPU) rather than inside the first constrained request's step, where it
        would stall every stream. The server calls it at load; EngineError without llguidance."""
        with self._structured_lock:  # the server's request threads may get here first
            if self._constraints is None:
                self._constraints = Constraints(self.tokenizer, self.model.config.vocab_size,
                                                self.config.grammar_cache_bytes)
                self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="portachat-masks")

    def compile_constraint(self, spec) -> None:
        """Compile and cache a constraint on the caller's thread (StructuredError when it cannot be),
        so that admitting the request later costs the engine loop only a copy."""
        self.prepare_structured()
        self._constraints.compile(spec)

    def _matcher(self, params: SamplingParams):
        """A grammar matcher for a constrained request (StructuredError, an `invalid` EngineError,
        when the library cannot compile it)."""
        self.prepare_structured()
        return self._constraints.matcher(params.structured)

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks (no-op for unknown or finished ids)."""
        seq = self._seqs.pop(request_id, None)
        if seq is not None and not seq.finished:
            seq.finish_reason = "abort"
            self.scheduler.remove(seq)
            self._release(seq)

    # ------------------------------------------------------------------ LoRA adapters

    def add_adapter(self, name: str, lora: LoraWeights | str | Path) -> None:
        """Load a LoRA adapter (a PEFT directory, or weights already read) that requests then name in
        SamplingParams.adapter; rows of different adapters and of the base share every step."""
        if not name or not isinstance(name, str):
            raise EngineError(_("a LoRA adapter needs a non-empty name"), kind="invalid")
        if name in self.adapters_in_use():
            raise EngineError(_("LoRA adapter {name} has requests in flight; replace it when they finish").format(
                name=repr(name)))
        if self.runner.lora is None:
            self.runner.lora = AdapterSet(self.model, self.device.torch_device, self.dtype)
        self.runner.lora.add(name, lora if isinstance(lora, LoraWeights) else load_lora(lora))
        self._adapter_salts[name] = hash(("lora", name, next(self._arrivals)))  # new weights, new cache chain

    def refresh_adapter(self, name: str, lora: LoraWeights) -> None:
        """New values for loaded adapter `name` (one being trained: GRPO with LoRA), copied in place;
        keys and values cached under the old values are dropped."""
        if self.runner.lora is None or name not in self.runner.lora:
            raise EngineError(_("LoRA adapter {name} is not loaded").format(name=repr(name)), kind="invalid")
        self.runner.lora.refresh(name, lora)
        self.blocks.clear_prefix_cache()

    def remove_adapter(self, name: str) -> None:
        """Drop a LoRA adapter (refused while requests use it; unknown names are a no-op)."""
        if name in self.adapters_in_use():
            raise EngineError(_("LoRA adapter {name} has requests in flight; remove it when they finish").format(
                name=repr(name)))
        if self.runner.lora is not None:
            self.runner.lora.remove(name)
        self._adapter_salts.pop(name, None)

    @property
    def adapters(self) -> list[str]:
        return self.runner.lora.names if self.runner.lora is not None else []

    def adapters_in_use(self) -> set[str]:
        return {s.params.adapter for s in self._seqs.values() if not s.finished and s.params.adapter}

    def reload_weights(self) -> None:
        """Call after changing the model's weights in place (e.g. an RL update) so that every later
        step uses them. Cached prefixes are dropped; requests in flight keep the K/V they have."""
        self.runner.reload_weights()
        self.blocks.clear_prefix_cache()

    @property
    def uses_decode_graphs(self) -> bool:
        """Whether decode-only steps replay from device graphs (False after a failed capture)."""
        graphs = self.runner.graphs
        return graphs is not None and graphs.replays

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> dict:
        b = self.blocks
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_cache_usage": b.usage(),
            "num_blocks": b.num_blocks,
            "block_size": b.block_size,
            "prefix_cache_queries": b.prefix_queries,
            "prefix_cache_hits": b.prefix_hits,
            "prefix_cache_hit_rate": b.prefix_hits / b.prefix_queries if b.prefix_queries else 0.0,
            "num_preemptions": self.scheduler.num_preemptions,
            "max_model_len": self.max_model_len,
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(self.kv_dtype).removeprefix("torch."),
            "compiled": self.compiled,
            "decode_graphs": self.uses_decode_graphs,
            "decode_graphs_captured": len(self.runner.graphs.graphs) if self.runner.graphs else 0,
            "packed_weights": self.runner.packed is not None,
            "paged_kernels": self.runner.slot_major,  # decode attention and K/V writes through Ascend's kernels
            "lora_adapters": self.adapters,
            "lora_steps": self.runner.lora_steps,  # steps with LoRA rows ...
            "lora_mixed_steps": self.runner.lora_mixed_steps,  # ... of which mixed two or more adapters / the base
            **(self.speculator.stats() if self.speculator is not None else {}),
        }

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        self.num_steps += 1
        sampling = [s for s in batch if s.samples]
        try:
            if self.speculator is not None:
                self.speculator.propose(batch, self.scheduler.max_num_batched_tokens)
            masks = self._start_masks([s.seq for s in sampling])
            inputs = self.runner.prepare(batch)
            logits = self.runner.forward(inputs)
            emitted, logprobs, tops = self._choose(logits, sampling, self._finish_masks(masks))
        except Exception as exc:  # a device failure fails this step's requests, not the engine
            return self._fail(batch, exc)
        for s in batch:
            if not s.draft:
                s.seq.num_computed = s.start + s.num_tokens
                self.blocks.register_full_blocks(s.seq)
        outputs = []
        for i, s in enumerate(sampling):
            if not s.draft:
                self._append(s.seq, emitted[i][0], logprobs[i] if logprobs is not None else None,
                             tops[i] if tops is not None else None)
            else:
                fed = s.seq.token_ids + s.draft  # the tokens whose K/V this step wrote
                before = len(s.seq.token_ids)
                for j, token in enumerate(emitted[i]):  # one by one: a stop among them ends the reply there
                    self._append(s.seq, token, None)
                    if s.seq.finished or len(s.seq.token_ids) != before + j + 1:
                        break  # finished, or a tool result was forced in: later tokens no longer follow
                if not s.seq.finished:
                    self.speculator.settle(s, fed)
            outputs.append(self._output(s.seq))
        return outputs

    def _choose(self, logits: torch.Tensor, sampling: list, masks: TokenMasks | None
                ) -> tuple[list[list[int]], list[float] | None, list | None]:
        """Tokens to emit per sampling sequence: one sampled token, or (speculating) the accepted
        drafts and one token of the target's; logprobs only come from plain rows. Constrained rows
        never speculate (speculation_allowed), so their masks apply to plain rows only."""
        if not any(s.draft for s in sampling):
            tokens, logprobs, tops = sample(logits, [s.seq for s in sampling], masks)
            return [[t] for t in tokens], logprobs, tops
        first, at = [], 0
        for s in sampling:
            first.append(at)
            at += len(s.draft) + 1
        plain = [i for i, s in enumerate(sampling) if not s.draft]
        emitted: list[list[int]] = [[] for _ in sampling]
        logprobs = tops = None
        if plain:
            rows = torch.tensor([first[i] for i in plain], device=logits.device)
            plain_masks = None
            if masks is not None:  # rows of `sampling` -> rows of the plain subset
                position = {i: j for j, i in enumerate(plain)}
                plain_masks = TokenMasks([position[r] for r in masks.rows], masks.bitmask)
            tokens, plain_logprobs, plain_tops = sample(logits.index_select(0, rows), [sampling[i].seq for i in plain], plain_masks)
            for j, i in enumerate(plain):
                emitted[i] = [tokens[j]]
            if plain_logprobs is not None:
                logprobs = [0.0] * len(sampling)
                for j, i in enumerate(plain):
                    logprobs[i] = plain_logprobs[j]
            if plain_tops is not None:
                tops = [[] for _ in sampling]
                for j, i in enumerate(plain):
                    tops[i] = plain_tops[j]
        for i, s in enumerate(sampling):
            if s.draft:
                emitted[i] = self.speculator.verify(s, logits[first[i] : first[i] + len(s.draft) + 1])
        return emitted, logprobs, tops

    def _start_masks(self, seqs: list[Sequence]) -> tuple[list[int], torch.Tensor, Future] | None:
        """Start filling the next-token masks of the constrained rows on the mask thread, so they
        are computed while the forward runs (llguidance releases the GIL)."""
        rows = [i for i, seq in enumerate(seqs) if seq.matcher is not None]
        if not rows:
            return None
        bitmask = allocate_bitmask(len(rows), self.model.config.vocab_size)
        job = self._mask_thread.submit(self._constraints.fill, [seqs[i].matcher for i in rows], bitmask)
        return rows, bitmask, job

    @staticmethod
    def _finish_masks(started: tuple[list[int], torch.Tensor, Future] | None) -> TokenMasks | None:
        if started is None:
            return None
        rows, bitmask, job = started
        job.result()
        return TokenMasks(rows, bitmask)

    def _fail(self, batch, exc: Exception) -> list[RequestOutput]:
        diagnosis = diagnose(exc)
        if diagnosis is not None:
            message = diagnosis.line(exc)
        else:
            message = _("the model step failed ({error})").format(error=f"{type(exc).__name__}: {str(exc)[:300]}")
        outputs = []
        for s in batch:
            seq = s.seq
            seq.finish_reason, seq.error = "error", message
            self.scheduler.remove(seq)
            self._seqs.pop(seq.request_id, None)
            self._release(seq)
            outputs.append(self._output(seq))
        return outputs

    def _append(self, seq: Sequence, token: int, logprob: float | None,
                top: list[tuple[int, float]] | None = None) -> None:
        """Add a sampled token, then whatever it implies: tool output, stop, length."""
        p = seq.params
        forced: list[int] = []
        # Forced calculator output would bypass a grammar: constrained rows run without the tool.
        tools = self.tools if p.use_tools and seq.matcher is None else None
        if tools is not None:
            if token == tools.python_start:
                seq.in_tool_call, seq.tool_expression = True, []
            elif seq.in_tool_call and token == tools.python_end:
                seq.in_tool_call = False
                result = calculate(self.tokenizer.decode(seq.tool_expression))
                if result is not None:
                    forced = [tools.output_start, *self.tokenizer.encode(result), tools.output_end]
            elif seq.in_tool_call:
                seq.tool_expression.append(token)
                if len(seq.tool_expression) > MAX_TOOL_EXPRESSION_TOKENS:
                    seq.in_tool_call = False
        is_stop = (token in self.stop_ids and not p.ignore_eos) or token in p.stop_token_ids
        self._push(seq, token, logprob if p.logprobs else None, show=not is_stop, top=top)
        if is_stop:
            return self._finish(seq, "stop")
        if seq.matcher is not None:
            if not seq.matcher.consume_token(token):  # the mask allowed it: a library fault, not the user's
                seq.error = _("structured output: the grammar rejected token {token} ({error})").format(
                    token=token, error=seq.matcher.get_error())
                return self._finish(seq, "error")
            if seq.matcher.is_stopped():  # the grammar is complete: nothing more may follow
                return self._finish(seq, "stop")
        room = min(p.max_tokens - seq.num_output, self.max_model_len - len(seq.token_ids))
        for t in forced[: max(room, 0)]:
            self._push(seq, t, 0.0 if p.logprobs else None, show=True)
        if seq.detokenizer.stopped:
            return self._finish(seq, "stop")
        if seq.num_output >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return self._finish(seq, "length")

    def _push(self, seq: Sequence, token: int, logprob: float | None, show: bool,
              top: list[tuple[int, float]] | None = None) -> None:
        seq.token_ids.append(token)
        seq.new_token_ids.append(token)
        if logprob is not None:
            seq.new_logprobs.append(logprob)
            seq.logprobs.append(logprob)
            if seq.params.top_logprobs:  # forced tool tokens have no alternatives
                seq.new_top_logprobs.append(top or [])
        seq.detokenizer.add(token, decode=show)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        self._seqs.pop(seq.request_id, None)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if self.speculator is not None:
            self.speculator.release(seq.request_id)

    def _output(self, seq: Sequence) -> RequestOutput:
        out = RequestOutput(
            request_id=seq.request_id,
            text=seq.detokenizer.delta(final=seq.finished),
            token_ids=seq.new_token_ids,
            logprobs=seq.new_logprobs if seq.params.logprobs else None,
            top_logprobs=seq.new_top_logprobs if seq.params.logprobs and seq.params.top_logprobs else None,
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            error=seq.error,
            prompt_tokens=seq.num_prompt,
            completion_tokens=seq.num_output,
            stop_string=seq.detokenizer.matched if seq.finished else None,
        )
        seq.new_token_ids, seq.new_logprobs, seq.new_top_logprobs = [], [], []
        return out

    # ------------------------------------------------------------------ offline batch

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Completion]:
        """Run prompts to completion (queued as the queue bound allows) and return them in order.
        A prompt the engine refuses (too long, bad parameters) comes back with finish_reason
        "error" and the reason in `error`; the others run normally."""
        return generate(self, prompts, params, progress)
