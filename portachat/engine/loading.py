"""From a model path to what the server serves: model + tokenizer (any supported source) behind the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from portachat.device import Device, get_device
from portachat.device.dist import shard_device_index
from portachat.device.dtypes import dtype_name, parse_dtype
from portachat.engine.build import build_engine
from portachat.engine.config import EngineConfig
from portachat.engine.embeddings import (
    DEFAULT_POOLING,
    decoder_embedder,
    load_embedding_model,
    read_pooling_config,
)
from portachat.engine.engine import LLMEngine
from portachat.engine.served import ServedModel
from portachat.engine.speculative import SpeculativeConfig
from portachat.engine.speculative.config import NGRAM_NAMES
from portachat.engine.speculative.vocabulary import check_same_vocabulary
from portachat.engine.types import EngineError
from portachat.engine.workers import start_workers
from portachat.engine.workers.load import load_shard
from portachat.i18n import _
from portachat.model.estimate import load_hf_config
from portachat.model.hf import sizes_config
from portachat.model.load import InferenceModel, load_for_inference
from portachat.model.serve_memory import check_fits
from portachat.model.source import EMBEDDING, ModelSource, resolve
from portachat.ops.inference_dtype import inference_dtype
from portachat.quant import quantize_model
from portachat.tokenizer.protocol import ChatTokenizer


@dataclass
class SpeculativeOptions:
    model: str  # "ngram" / "[ngram]" (prompt lookup), or a draft model: any source --model accepts
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    max_batch: int = 4
    draft_vocab_size: int | None = None  # the draft's head keeps the N most frequent tokens (draft models only)


@dataclass
class LoadOptions:
    model: str  # our checkpoint dir, a Hugging Face dir, or a .gguf file
    device: str | None = None  # None = auto-detect
    dtype: str | None = None  # None = the device layer's inference dtype
    compile: bool | None = None  # None = the device layer's policy
    enforce_eager: bool = False  # no device graphs for decode steps (else: the device layer's policy)
    max_model_len: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    kv_cache_gb: float | None = None
    gpu_memory_utilization: float = 0.9  # fraction of device memory the KV cache may fill up to
    kv_cache_dtype: str = "auto"  # auto|fp32|bf16|fp16|int8|fp8 (vLLM's --kv-cache-dtype)
    max_waiting: int = 256
    enable_prefix_caching: bool = True
    lora: str | None = None  # a PEFT LoRA adapter directory, folded into the weights at load time
    quantize: str | None = None  # "int8" / "int4" weight-only, as the device layer plans it; None = off
    chat_template: str | None = None  # Jinja text replacing the model's own chat template
    data_parallel_size: int = 1  # engine replicas, one per device, behind one front
    pooling: str | None = None  # embeddings: mean/last/cls/... (None: the model's sentence-transformers config, else mean)
    speculative: SpeculativeOptions | None = None  # speculative decoding; None = off
    tensor_parallel_size: int = 1  # ranks the model is split over (worker processes the loader starts)
    grammar_cache_mb: int = 256  # compiled structured-output grammars kept (EngineConfig.grammar_cache_bytes)


def load_embedding_served(options: LoadOptions, device, source: ModelSource) -> ServedModel:
    """An embedding model (BERT encoder or sentence-transformers directory): an embedder, no engine."""
    for name in ("lora", "quantize", "chat_template"):
        if getattr(options, name):
            raise ValueError(_("--{flag} does not apply to an embedding model ({model})").format(
                flag=name.replace("_", "-"), model=options.model))
    embedder = load_embedding_model(source.path, device, options.dtype, options.pooling)
    if options.max_model_len is not None:
        embedder.max_tokens = min(embedder.max_tokens, options.max_model_len)
    return ServedModel(engine=None, tokenizer=None, max_model_len=embedder.max_tokens, embedder=embedder,
                       description=embedder.description + "; " + _("serves /v1/embeddings only"))


def load_served_model(options: LoadOptions, embedding_models: bool = False,
                      on_worker_failure: Callable[[str], None] | None = None,
                      source: ModelSource | None = None) -> ServedModel:
    """Load the model and build its engine(s) (slow: run it off the event loop).

    With --data-parallel-size D the model loads once per replica, replica i on the i-th device.
    With --tensor-parallel-size N > 1 this process becomes rank 0 of N and starts the other ranks;
    with both, it is rank 0 of each replica's group of N (D*N devices, replica i on devices i*N..);
    `on_worker_failure` hears of a worker that died (default: exit the process with status 1). An
    embedding model loads (without an engine) only with `embedding_models`: commands that generate
    text refuse it. `source`: options.model already resolved (else it is resolved here, once)."""
    source = resolve(source or options.model)
    if source.kind == EMBEDDING:
        if not embedding_models:
            raise ValueError(_("{model} is an embedding model: it makes vectors, not text. Serve it with "
                               "`portachat serve --model {model}` (POST /v1/embeddings).").format(model=options.model))
        return load_embedding_served(options, get_device(kind=options.device, dtype=None, compile=options.compile),
                                     source)
    device = get_device(kind=options.device, dtype=None, compile=options.compile)
    _check_fits(options, device, source)
    workers = None
    if options.tensor_parallel_size > 1:
        # Every rank must compute in one dtype (the all-reduces add their partial sums) and run the
        # same eager step: rank 0 decides for all of them. The workers load the path rank 0 resolved
        # (no hub lookup of their own, and `latest` cannot move between ranks).
        dtype = options.dtype or inference_dtype(device).value
        options = replace(options, dtype=str(dtype).removeprefix("torch."), compile=False, enforce_eager=True)
        workers = start_workers(replace(options, model=str(source.path)), device, on_worker_failure)
    try:
        replicas = [_load_engine(options, source, replica=i if options.data_parallel_size > 1 else None,
                                 group=workers.groups[i] if workers is not None and workers.groups else None)
                    for i in range(options.data_parallel_size)]  # fmt: skip
    except BaseException:
        if workers is not None:
            workers.close()
        raise
    engine, tokenizer, loaded, description = replicas[0]
    if options.data_parallel_size > 1:
        devices = ", ".join(str(e.device) for e, *_ in replicas)
        description += "; " + _("{count} data-parallel replicas on {devices}").format(
            count=options.data_parallel_size, devices=devices)
    # A chat model also serves /v1/embeddings: its final hidden states, pooled. Not a tensor-parallel
    # shard: its forward needs every worker, and the workers only follow the engine's steps.
    embedder = None
    if options.tensor_parallel_size == 1:
        pooling = read_pooling_config(loaded.path) if loaded.path.is_dir() else DEFAULT_POOLING
        embedder = decoder_embedder(loaded.model, tokenizer, pooling.with_pooling(options.pooling),
                                    bos=loaded.source == "portachat", max_tokens=engine.max_model_len, name=loaded.name)
    served = ServedModel(
        engine=engine,
        tokenizer=tokenizer,
        max_model_len=engine.max_model_len,
        generation_defaults=loaded.generation,
        description=description,
        bos_for_completions=loaded.bos_for_completions,
        replicas=[e for e, *_ in replicas[1:]],
        embedder=embedder,
    )
    if workers is not None:
        runners = [e.runner for e, *_ in replicas]
        workers.watch(*runners)
        served.failure = workers.status
        served.close = lambda: workers.close(*runners)
        served.worker_pids = workers.pids
    return served


def speculative_config(options: SpeculativeOptions, target: Any, device: Any):
    """The engine's SpeculativeConfig; a draft model is loaded like --model, in the target's dtype on
    its device, and must share the target's vocabulary."""
    # A lone --ngram-prompt-lookup-max below the default min lowers the min with it.
    lookup_min = min(options.prompt_lookup_min, options.prompt_lookup_max)
    if options.prompt_lookup_min != SpeculativeOptions.prompt_lookup_min:
        lookup_min = options.prompt_lookup_min
    tuning = dict(num_speculative_tokens=options.num_speculative_tokens, prompt_lookup_max=options.prompt_lookup_max,
                  prompt_lookup_min=lookup_min, max_batch=options.max_batch)  # fmt: skip
    if options.model.strip().lower() in NGRAM_NAMES:
        if options.draft_vocab_size is not None:
            raise ValueError(_("--speculative-draft-vocab cuts a draft model's output head: prompt lookup (ngram) "
                               "has none; drop the flag or pass a draft model to --speculative-model"))
        return SpeculativeConfig(method="ngram", **tuning)
    draft = load_for_inference(options.model, device=device, dtype=target.dtype)
    check_same_vocabulary(target.model, target.tokenizer, draft.model, draft.tokenizer, options.model)
    return SpeculativeConfig(method="draft_model", draft=draft.model, draft_vocab_size=options.draft_vocab_size,
                             keep_token_ids=tuple(sorted(target.tokenizer.stop_ids)), **tuning)


def _check_fits(options: LoadOptions, device, source: ModelSource) -> None:
    """A model too big for the devices fails here, before any weight is read (a directory with a
    config.json; GGUF files and quantized loads are left to the load itself)."""
    if options.quantize or options.lora:
        return
    try:
        path = source.path
        config = load_hf_config(path) if path.is_dir() and (path / "config.json").is_file() else None
        cfg = sizes_config(config) if config else None
    except Exception:  # noqa: BLE001 - a missing or odd model fails properly when it loads
        return
    if cfg is None:
        return
    dtype = parse_dtype(options.dtype) if options.dtype else inference_dtype(device).value
    name = dtype_name(dtype)
    context = options.max_model_len or int(config.get("max_position_embeddings") or 2048)
    check_fits(cfg, options.tensor_parallel_size, name, context, device.memory().total, str(path),
               device.type)  # fmt: skip


def _load_engine(options: LoadOptions, source: ModelSource, replica: int | None, group=None):
    """Replica `replica`'s engine (None: the only one); with -tp, its shard 0 over the replica's `group`."""
    tp = options.tensor_parallel_size
    index = None if replica is None else shard_device_index(replica, 0, tp)
    device = get_device(kind=options.device, dtype=None, compile=options.compile, replica=index)
    if tp > 1:
        loaded = load_shard(replace(options, model=str(source.path)), device, 0, tp, group)
    else:
        loaded = load_for_inference(source, device=device, dtype=options.dtype, lora=options.lora)
    engine, tokenizer, description = engine_for_model(loaded, options, device)
    return engine, tokenizer, loaded, description


def engine_for_model(loaded: InferenceModel, options: LoadOptions, device: Device
                     ) -> tuple[LLMEngine, ChatTokenizer, str]:  # fmt: skip
    """The engine over a loaded model as `options` set it up (chat template, quantization, KV cache,
    speculation), its tokenizer and a description: what serve, chat, generate and eval run."""
    description = loaded.description
    tokenizer = loaded.tokenizer
    if options.chat_template is not None:
        if not hasattr(tokenizer, "with_chat_template"):
            raise ValueError(_("--chat-template applies to models with a Jinja chat template (Hugging Face "
                               "directories and GGUF files); our own checkpoints use portachat's chat format"))
        tokenizer = tokenizer.with_chat_template(options.chat_template)
        description += "; " + _("chat template from --chat-template")
    if options.quantize and options.tensor_parallel_size == 1:  # shards are quantized by load_shard
        report = quantize_model(loaded.model, options.quantize, device, compiled=options.compile)
        description += f"; {report.summary()}"
    config = EngineConfig(
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        kv_cache_gb=options.kv_cache_gb,
        gpu_memory_utilization=options.gpu_memory_utilization,
        kv_cache_dtype=options.kv_cache_dtype,
        max_waiting=options.max_waiting,
        enable_prefix_caching=options.enable_prefix_caching,
        compile=options.compile,
        enforce_eager=options.enforce_eager,
        dtype="model",  # load_for_inference already put the weights in the chosen dtype
        grammar_cache_bytes=options.grammar_cache_mb * 2**20,
    )
    if options.max_num_batched_tokens is not None:
        config.max_num_batched_tokens = options.max_num_batched_tokens
    if options.speculative is not None:
        config.speculative = speculative_config(options.speculative, loaded, device)
        description += "; " + _("speculative decoding: {model}, {tokens} tokens").format(
            model=options.speculative.model, tokens=options.speculative.num_speculative_tokens)
    engine = build_engine(loaded.model, tokenizer, config, device)
    description += "; " + _("KV cache {dtype} ({reason})").format(
        dtype=str(engine.kv_dtype).removeprefix("torch."), reason=engine.kv_dtype_reason)
    try:
        engine.prepare_structured()  # response_format / tool_choice masks ready before the first request
    except EngineError as exc:  # no llguidance: everything else serves; constrained requests say why they fail
        description += "; " + _("structured output off ({error})").format(error=exc)
    graphs = _("decode graphs on ({reason})") if engine.uses_decode_graphs else _("decode graphs off ({reason})")
    description += "; " + graphs.format(reason=engine.graphs_reason)
    return engine, tokenizer, description
