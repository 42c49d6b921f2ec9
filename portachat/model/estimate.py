"""`portachat estimate memory`: how much device memory a training run or a serving KV cache needs.

Counted from the model's shapes, not measured: parameters, gradients, optimizer states (Muon keeps
one fp32 buffer per matrix, AdamW two per parameter), activations (what autograd saves per token and
layer, with and without activation checkpointing), the logits / loss tensors, the optimizer step's
temporaries, and the KV cache for serving. Works for our depths and for any Hugging Face decoder
config (Llama / Qwen / Mistral style), per device, on N devices with DDP or FSDP2.

The per-token activation counts follow portachat's GPT forward (fp32 RMSNorm, QK-norm, SDPA, gated
MLP) under fp32 or bf16/fp16 autocast; tests check them against the measured peak of real steps.
The loss computes logits only at supervised positions, a chunk at a time (portachat.model.loss), so
that term is bounded by one chunk. Given chat data (its lengths: portachat.data.chat_loader.data_lengths), a
micro-batch is as long as its longest conversation, padded to the device's bucket, not --max-seq-len.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from portachat.device.dtypes import DTYPE_BYTES, KV_DTYPES
from portachat.i18n import N_, _, gettext
from portachat.i18n.width import ljust, rjust
from portachat.model.config import GPTConfig
from portachat.model.gguf import _open, generation_config, gguf_config, read_gguf_metadata
from portachat.model.gguf_tokenizer import build_tokenizer, tokenizer_config
from portachat.model.hf_dir import read_json, read_tokenizer_files
from portachat.model.load import _eos_ids
from portachat.model.loss import loss_chunk_size
from portachat.model.source import GGUF, PORTACHAT, resolve
from portachat.ops.kv_quant import bytes_per_token
from portachat.tokenizer import Tokenizer, render_conversation
from portachat.tokenizer.chat_tokenizer import TemplateChatTokenizer
from portachat.tokenizer.template_masks import render_template_conversation

GIB = 2**30


def model_name(cfg: GPTConfig, name: str | None = None) -> str:
    """What the estimate calls the model: the name given (a path), or our depth."""
    return name or f"portachat d{cfg.n_layer}"


def layer_matrix_params(cfg: GPTConfig) -> int:
    """Elements of one layer's matrices (q, k, v, o and the gated MLP): what Muon updates."""
    d, q, kv = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    return d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size


def matrix_params(cfg: GPTConfig) -> int:
    return cfg.n_layer * layer_matrix_params(cfg)


def embedding_params(cfg: GPTConfig) -> int:
    return cfg.vocab_size * cfg.n_embd


def lm_head_params(cfg: GPTConfig) -> int:
    """The output head's own parameters: none when it is tied to the embeddings."""
    return 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.n_embd


def largest_matrix_group(cfg: GPTConfig) -> int:
    """Elements of the largest same-shape group of layer matrices (Muon orthogonalizes each group at once)."""
    d, q, kv, i = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.intermediate_size
    groups: dict[tuple[int, int], int] = {}
    for shape in ((q, d), (kv, d), (kv, d), (d, q), (i, d), (i, d), (d, i)):
        groups[shape] = groups.get(shape, 0) + shape[0] * shape[1] * cfg.n_layer
    return max(groups.values())


def activation_bytes_per_token_layer(cfg: GPTConfig, dtype: str) -> int:
    """Bytes autograd keeps per token and layer between forward and backward.

    fp32: each RMSNorm keeps its input, rsqrt, normalized input and (for the next matmul) output;
    q/k keep the projection, normalized and rotated copies; attention keeps q, k, v, output,
    log-sum-exp and the re-laid-out output; the MLP keeps gate, silu(gate), up and their product.
    Under bf16/fp16 autocast the matmul operands are half precision while RMSNorm computes in
    fp32 and the residual stream stays fp32.
    """
    d, i, h, g = cfg.n_embd, cfg.intermediate_size, cfg.n_head, cfg.n_kv_head
    q, kv = h * cfg.head_dim, g * cfg.head_dim
    qk_scale = 1 if cfg.qk_norm else 0
    if dtype == "fp32":
        norms = 2 * (3 * d + 1) * 4
        attention = (q * (1 + 2 * qk_scale) + kv * (1 + 2 * qk_scale) + kv + 2 * q + h) * 4 + (h + g) * 4 * qk_scale
        mlp = 4 * i * 4
    else:
        norms = 2 * (8 * d + 4)
        attention = (q * (2 + 6 * qk_scale) + kv * (2 + 6 * qk_scale) + 2 * kv + 4 * q) + 4 * h
        attention += 4 * (h + g) * qk_scale
        mlp = 4 * i * 2
    return norms + attention + mlp


@dataclass
class TrainingSetup:
    batch_size: int  # sequences per device per micro-step
    seq_len: int
    dtype: str = "fp32"  # compute dtype (autocast); weights, grads and optimizer states stay fp32
    optimizer: str = "muon"  # "muon": Muon for layer matrices + AdamW for the rest; "adamw": AdamW for all
    activation_checkpointing: bool = False
    world_size: int = 1
    parallel: str = "ddp"  # "ddp" (replicas) or "fsdp2" (parameters, grads and states sharded)
    supervised_tokens: int | None = None  # loss positions per micro-batch; None = every position


def _fmt(nbytes: float) -> str:
    if nbytes >= GIB:
        return f"{nbytes / GIB:,.2f} GiB"
    return f"{nbytes / 2**20:,.1f} MiB"


def estimate_training(cfg: GPTConfig, setup: TrainingSetup, name: str | None = None) -> dict[str, Any]:
    """Bytes per device, by component, and the expected peak of a training step of `cfg`."""
    if setup.dtype not in DTYPE_BYTES:
        raise ValueError(_("dtype must be one of {choices}, got {value}").format(
            choices=", ".join(DTYPE_BYTES), value=repr(setup.dtype)))
    if setup.optimizer not in ("muon", "adamw"):
        raise ValueError(_("optimizer must be muon or adamw, got {value}").format(value=repr(setup.optimizer)))
    if setup.parallel not in ("ddp", "fsdp2"):
        raise ValueError(_("parallel must be ddp or fsdp2, got {value}").format(value=repr(setup.parallel)))
    n = max(1, setup.world_size)
    shard = n if setup.parallel == "fsdp2" else 1
    half = setup.dtype != "fp32"
    tokens = setup.batch_size * setup.seq_len
    P = cfg.num_params()
    muon_params = matrix_params(cfg) if setup.optimizer == "muon" else 0
    adam_params = P - muon_params

    parameters = 4 * P / shard
    gradients = 4 * P / shard
    optimizer_states = (4 * muon_params + 8 * adam_params) / shard
    # DDP copies gradients into flat communication buckets (a second gradient-sized buffer).
    ddp_buckets = 4 * P if setup.parallel == "ddp" and n > 1 else 0
    # FSDP2 all-gathers one layer's full weights in the compute dtype, and prefetches the next.
    unsharded = 2 * layer_matrix_params(cfg) * (2 if half else 4) if setup.parallel == "fsdp2" and n > 1 else 0

    per_layer = activation_bytes_per_token_layer(cfg, setup.dtype) * tokens
    residual = 4 * cfg.n_embd * tokens  # a block's fp32 input: all checkpointing keeps
    final_norm = (3 * cfg.n_embd * 4 if not half else 8 * cfg.n_embd) * tokens
    if setup.activation_checkpointing:
        activations = cfg.n_layer * residual + per_layer + final_norm  # one block recomputed at a time
    else:
        activations = cfg.n_layer * per_layer + final_norm
    # The loss takes its gradients chunk by chunk at the end of the forward (portachat.model.loss): one fp32
    # [positions, vocab] chunk of logits, turned into its gradient in place (under autocast also the half
    # precision matmul output and gradient beside it), for the supervised positions of one chunk at most;
    # nothing of vocabulary size is kept for the backward.
    supervised = tokens if setup.supervised_tokens is None else min(tokens, setup.supervised_tokens)
    logits = (7 if half else 4) * cfg.vocab_size * min(supervised, loss_chunk_size(cfg.vocab_size))
    # Autocast keeps a half-precision copy of every matmul weight from forward until its backward.
    # (FSDP2's mixed precision gathers weights already in the compute dtype: counted above.)
    head = lm_head_params(cfg) or embedding_params(cfg)
    weight_casts = 2 * (matrix_params(cfg) + head) if half and shard == 1 else 0
    # Optimizer step temporaries: AdamW's foreach math over its params, Muon's stacked Newton-Schulz iterates.
    group = largest_matrix_group(cfg) if setup.optimizer == "muon" else 0
    optimizer_step = (2 * 4 * adam_params) / shard + 6 * 4 * group / shard

    static = parameters + optimizer_states + ddp_buckets
    lm_head_grad = 4 * head / shard
    if setup.activation_checkpointing:
        # The loss's chunks are done before the first block is recomputed: the two never coexist.
        transient = max(logits, per_layer)
        backward_peak = static + unsharded + cfg.n_layer * residual + final_norm + transient + weight_casts + lm_head_grad
    else:
        backward_peak = static + unsharded + activations + logits + weight_casts + lm_head_grad
    step_peak = static + gradients + optimizer_step
    peak = max(backward_peak, step_peak)
    components = {
        "parameters": parameters,
        "gradients": gradients,
        "optimizer_states": optimizer_states,
        "ddp_buckets": ddp_buckets,
        "fsdp_unsharded_layers": unsharded,
        "activations": activations,
        "logits_and_loss": logits,
        "autocast_weight_copies": weight_casts,
        "optimizer_step_temporaries": optimizer_step,
    }
    return {
        "model": model_name(cfg, name),
        "num_params": P,
        "setup": asdict(setup),
        "tokens_per_micro_batch": tokens,
        "loss_positions_per_chunk": int(min(supervised, loss_chunk_size(cfg.vocab_size))),
        "components": {k: int(v) for k, v in components.items()},
        "activations_without_checkpointing": int(cfg.n_layer * per_layer + final_norm),
        "activations_with_checkpointing": int(cfg.n_layer * residual + per_layer + final_norm),
        "peak_bytes": int(peak),
        "peak_phase": "forward/backward" if backward_peak >= step_peak else "optimizer step",
    }


def estimate_kv_cache(
    cfg: GPTConfig, batch_size: int, context: int, dtype: str = "bf16", weights_dtype: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Serving memory: weights plus K and V for every layer, sequence and position, the cache in
    `dtype` (fp32/bf16/fp16/int8/fp8). Weights are in `weights_dtype`, by default `dtype` for a
    float cache and bf16 beside an int8/fp8 one (a quantized cache does not quantize the weights)."""
    if dtype not in KV_DTYPES:
        raise ValueError(_("KV-cache dtype must be one of {choices}, got {value}").format(
            choices=", ".join(KV_DTYPES), value=repr(dtype)))
    weights_dtype = weights_dtype or (dtype if dtype in DTYPE_BYTES else "bf16")
    per_token = bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, KV_DTYPES[dtype])
    kv = per_token * context * batch_size
    weights = cfg.num_params() * DTYPE_BYTES[weights_dtype]
    return {
        "model": model_name(cfg, name),
        "batch_size": batch_size,
        "context": context,
        "dtype": dtype,
        "weights_dtype": weights_dtype,
        "weights_bytes": int(weights),
        "kv_cache_bytes": int(kv),
        "kv_bytes_per_token": int(kv // max(1, batch_size * context)),
        "total_bytes": int(weights + kv),
    }


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """config.json from a Hugging Face model directory, or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(_("{path} does not exist; pass a Hugging Face model directory or its config.json").format(
            path=path)) from None
    except json.JSONDecodeError as e:
        raise ValueError(_("{path} is not valid JSON ({error})").format(path=path, error=e)) from None


# Row labels of the memory table (component keys stay English in --json).
LABELS = {
    "parameters": N_("parameters"),
    "gradients": N_("gradients"),
    "optimizer_states": N_("optimizer states"),
    "ddp_buckets": N_("ddp buckets"),
    "fsdp_unsharded_layers": N_("fsdp unsharded layers"),
    "activations": N_("activations"),
    "logits_and_loss": N_("logits and loss"),
    "autocast_weight_copies": N_("autocast weight copies"),
    "optimizer_step_temporaries": N_("optimizer step temporaries"),
}
PHASES = {"forward/backward": N_("forward/backward"), "optimizer step": N_("optimizer step")}


def _row(label: str, value: str, extra: str = "") -> str:
    return f"{ljust(label, 30)} {rjust(value, 12)}{extra}"


def format_estimate(train: dict[str, Any], serve: dict[str, Any] | None = None) -> str:
    s = train["setup"]
    parallel = s["parallel"] if s["world_size"] > 1 else _("no data parallelism")
    data = train.get("data")
    lines = [
        ljust(_("model"), 12) + ": " + _("{model} ({n}M parameters)").format(
            model=train["model"], n=f"{train['num_params'] / 1e6:,.1f}"),
        ljust(_("training"), 12) + ": " + _(
            "batch {batch} x {seq} tokens per device, {dtype}, {optimizer}, activation checkpointing {ac}, "
            "{n} device(s) with {parallel}").format(
            batch=s["batch_size"], seq=s["seq_len"], dtype=s["dtype"], optimizer=s["optimizer"],
            ac=_("on") if s["activation_checkpointing"] else _("off"), n=s["world_size"], parallel=parallel),
        *([ljust(_("data"), 12) + ": " + _(
            "{n} conversations measured: {mean} tokens on average, {longest} at most ({supervised} supervised on "
            "average); the largest micro-batch holds {rows} x {width} positions (--max-seq-len {seq_len})").format(
            n=data["conversations"], mean=f"{data['mean']:.0f}", longest=data["longest"],
            supervised=f"{data['mean_supervised']:.0f}", rows=s["batch_size"], width=s["seq_len"],
            seq_len=data["max_seq_len"])] if data else []),
        "",
        _row(_("component (per device)"), _("memory")),
    ]
    for name, value in train["components"].items():
        if value:
            lines.append(_row(gettext(LABELS.get(name, name.replace("_", " "))), _fmt(value)))
    lines.append(_row(_("activations w/o checkpointing"), _fmt(train["activations_without_checkpointing"])))
    lines.append(_row(_("activations with checkpointing"), _fmt(train["activations_with_checkpointing"])))
    peak = _("PEAK ({phase})").format(phase=gettext(PHASES.get(train["peak_phase"], train["peak_phase"])))
    lines.append(_row(peak, _fmt(train["peak_bytes"])))
    if serve is not None:
        lines += [
            "",
            ljust(_("serving"), 12) + ": " + _("batch {batch} x {context} context, KV cache {dtype}, weights {weights}").format(
                batch=serve["batch_size"], context=serve["context"], dtype=serve["dtype"], weights=serve["weights_dtype"]),
            _row(_("weights"), _fmt(serve["weights_bytes"])),
            _row(_("KV cache"), _fmt(serve["kv_cache_bytes"]), f"  ({serve['kv_bytes_per_token'] / 1024:,.1f} KiB/token)"),
            _row(_("total"), _fmt(serve["total_bytes"])),
        ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- chat data


def chat_renderer(path: str | Path) -> Callable[[Any, int | None], tuple[list[int], list[int]]]:
    """How training renders a conversation for the model (or tokenizer) at `path`: a portachat checkpoint
    or tokenizer directory (our chat format), a Hugging Face model directory or a .gguf file (the
    model's own chat template, as fine-tuning renders it). No weights are read."""
    path = Path(path)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir() and not (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        ours = Tokenizer.load(path)  # a tokenizer directory (`portachat tokenizer train`)
        return lambda messages, n: render_conversation(ours, messages, n)
    source = resolve(path)
    if source.format == PORTACHAT:
        ours = Tokenizer.load(source.path)
        return lambda messages, n: render_conversation(ours, messages, n)
    if source.format == GGUF:
        metadata = read_gguf_metadata(source.path)
        hf = build_tokenizer(metadata)
        template = TemplateChatTokenizer(hf, tokenizer_config(metadata, hf),
                                         eos_ids=_eos_ids(generation_config(metadata).get("eos_token_id")))
    else:
        hf, tok_config = read_tokenizer_files(source.path)
        generation = read_json(source.path / "generation_config.json", required=False)
        config = read_json(source.path / "config.json", required=False)
        template = TemplateChatTokenizer(hf, tok_config, eos_ids=_eos_ids(generation.get("eos_token_id"),
                                                                         config.get("eos_token_id")))
    return lambda messages, n: render_template_conversation(template, messages, n)


def gguf_hf_config(path: str | Path) -> dict[str, Any]:
    """The Hugging Face config.json a .gguf file's metadata and tensor shapes describe (no tensor read)."""
    with _open(path) as f:
        return gguf_config(f.metadata, {name: info.shape for name, info in f.tensors.items()})
