"""Serving memory per device under tensor parallelism: weights, KV cache per token, what fits.

Counted from the shapes the way portachat shards a model (portachat.model.tensor_parallel): layer
matrices and q/k/v biases split by head and MLP row, the LM head by vocabulary rows (a tied one is a view
of the embeddings), embeddings and norms replicated, the
KV cache split by kv head (replicated where ranks outnumber kv heads). Rank 0 owns the largest share
when the split is uneven, so its numbers are the per-device figures.

Given the device type, two more terms follow what the engine really holds there (the device layer
answers both): the packed copies of the weights a CPU keeps for its decode kernels, and a step's
transient activations, in the dtype attention computes in (fp32 on a CPU, as is its KV cache).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from portachat.device.dtypes import DTYPE_BYTES, KV_DTYPES
from portachat.device.inference import kv_cache_dtype
from portachat.i18n import _
from portachat.i18n.width import ljust
from portachat.model.config import GPTConfig
from portachat.model.estimate import _fmt, _row, lm_head_params, matrix_params, model_name
from portachat.model.tensor_parallel import plan_shard, working_sizes
from portachat.ops.cpu_linear import packed_weight_bytes, step_transient_factor
from portachat.ops.kv_quant import bytes_per_token

UTILIZATION = 0.9  # of a device's memory the weights and KV cache may take (vLLM's default)
STEP_TOKENS = 1024  # the engine's default max_num_batched_tokens (tokens per forward step)


def shard_config(cfg: GPTConfig, tp: int) -> GPTConfig:
    """The sizes of rank 0's shard (the largest) of `cfg` split over `tp` ranks."""
    plan = plan_shard(cfg, 0, tp)
    return dataclasses.replace(cfg, n_head=len(plan.q_heads), n_kv_head=len(plan.kv_heads),
                               intermediate_size=len(plan.mlp))  # fmt: skip


def _compute_dtype(dtype: str, device_type: str | None) -> torch.dtype:
    """What keys, values and activations are held in: the device layer's choice beside `dtype` weights
    (an int8/fp8 cache sits beside bf16 weights); without a device, the weights' own dtype."""
    weights = KV_DTYPES[dtype] if dtype in DTYPE_BYTES else torch.bfloat16
    return weights if device_type is None else kv_cache_dtype(device_type, weights)


def _per_device(cfg: GPTConfig, tp: int, dtype: str, device_type: str | None = None) -> tuple[int, int]:
    """Weights and KV bytes per token on one device. An int8/fp8 KV cache sits beside bf16 weights
    and stores one fp32 scale per token and kv head."""
    shard = shard_config(cfg, tp)
    # The LM head is vocab-parallel (rank 0's slice the largest); a tied one is a view of the table.
    head_rows = -(-cfg.vocab_size // tp) if lm_head_params(cfg) else 0
    params = shard.num_params() - lm_head_params(shard) + head_rows * cfg.n_embd
    weights = params * DTYPE_BYTES.get(dtype, DTYPE_BYTES["bf16"])
    kv = KV_DTYPES[dtype] if dtype not in DTYPE_BYTES else _compute_dtype(dtype, device_type)
    kv_token = bytes_per_token(shard.n_layer, shard.n_kv_head, shard.head_dim, kv)
    return weights, kv_token


def packed_bytes(cfg: GPTConfig, tp: int, dtype: str, device_type: str | None) -> int:
    """The packed copies of the layer matrices and the output head a CPU engine keeps (one device,
    unsharded: tensor-parallel shards run the module path); 0 elsewhere."""
    if device_type is None or tp > 1 or dtype not in DTYPE_BYTES:
        return 0
    params = matrix_params(cfg) + cfg.vocab_size * cfg.n_embd  # a tied head is packed too
    return packed_weight_bytes(device_type, KV_DTYPES[dtype], params * DTYPE_BYTES[dtype])


def step_activation_bytes(cfg: GPTConfig, tp: int, dtype: str, step_tokens: int, context: int,
                          device_type: str | None = None) -> int:  # fmt: skip
    """The transient of one forward step of `step_tokens` tokens (the engine's max_num_batched_tokens):
    one layer's activations at a time (residual, normalised input, q/k/v and their rotated copies, the
    MLP's gate/up, activation and output) plus a prefill chunk's attention scores and probabilities,
    times what the device's allocator holds beyond them (device.cpu_linear.step_transient_factor)."""
    s = shard_config(cfg, tp)
    size = _compute_dtype(dtype, device_type).itemsize
    per_token = 3 * s.n_embd + 5 * s.intermediate_size + 2 * s.head_dim * (s.n_head + 2 * s.n_kv_head)
    chunk = min(step_tokens, context)
    counted = size * (step_tokens * per_token + 2 * s.n_head * chunk * context)
    return int(counted * step_transient_factor(device_type))


def estimate_serving(cfg: GPTConfig, tp: int = 1, dtype: str = "bf16", batch_size: int = 8, context: int = 2048,
                     device_bytes: int | None = None, utilization: float = UTILIZATION,
                     device_type: str | None = None, step_tokens: int = STEP_TOKENS,
                     name: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Per-device serving memory with -tp `tp`; with `device_bytes`, also the tokens of KV cache that
    fit beside the weights and the smallest -tp whose weights plus `batch_size` x `context` fit.
    `device_type` (cpu, cuda, ...) adds what the engine holds there beyond weights and KV cache."""
    weights, kv_token = _per_device(cfg, tp, dtype, device_type)
    packed = packed_bytes(cfg, tp, dtype, device_type)
    activations = step_activation_bytes(cfg, tp, dtype, step_tokens, context, device_type)
    kv_cache = kv_token * batch_size * context
    out: dict[str, Any] = {
        "model": model_name(cfg, name), "tensor_parallel_size": tp, "dtype": dtype, "batch_size": batch_size,
        "context": context, "device_type": device_type, "weights_bytes_per_device": int(weights),
        "packed_weights_bytes_per_device": packed, "kv_bytes_per_token_per_device": int(kv_token),
        "kv_cache_bytes_per_device": int(kv_cache), "step_tokens": step_tokens,
        "activations_bytes_per_device": activations,
        "total_bytes_per_device": int(weights + packed + kv_cache + activations),
    }  # fmt: skip
    if device_bytes is not None:
        budget = int(device_bytes * utilization)
        tokens = max(0, (budget - weights - packed - activations) // kv_token)
        out.update(device_bytes=int(device_bytes), utilization=utilization, kv_tokens_that_fit=int(tokens),
                   sequences_that_fit=int(tokens // context), fits=out["total_bytes_per_device"] <= budget,
                   smallest_tp_that_fits=smallest_tp(cfg, dtype, batch_size, context, budget, device_type, step_tokens))  # fmt: skip
    return out


def smallest_tp(cfg: GPTConfig, dtype: str, batch_size: int, context: int, budget: int,
                device_type: str | None = None, step_tokens: int = STEP_TOKENS, up_to: int = 64) -> int | None:  # fmt: skip
    """The smallest -tp whose per-device total for `batch_size` x `context` tokens fits in `budget` bytes."""
    for tp in working_sizes(cfg, up_to):
        est = estimate_serving(
            cfg, tp, dtype, batch_size, context, device_type=device_type, step_tokens=step_tokens
        )
        if est["total_bytes_per_device"] <= budget:
            return tp
    return None


def format_serving(s: dict[str, Any]) -> str:
    setup = _("{model}, {dtype}, tensor parallel {tp}, batch {batch} x {context} context").format(
        model=s["model"], dtype=s["dtype"], tp=s["tensor_parallel_size"], batch=s["batch_size"], context=s["context"])
    if s["device_type"]:
        setup += _(", on {device}").format(device=s["device_type"])
    lines = [
        ljust(_("serving"), 12) + ": " + setup,
        _row(_("component (per device)"), _("memory")),
        _row(_("weights"), _fmt(s["weights_bytes_per_device"])),
        _row(_("KV cache per token"), f"{s['kv_bytes_per_token_per_device'] / 1024:,.1f} KiB"),
        _row(_("KV cache (batch x context)"), _fmt(s["kv_cache_bytes_per_device"])),
        _row(_("activations ({tokens}-token step)").format(tokens=s["step_tokens"]),
             _fmt(s["activations_bytes_per_device"])),
        _row(_("total"), _fmt(s["total_bytes_per_device"])),
    ]
    if s["packed_weights_bytes_per_device"]:
        lines.insert(3, _row(_("packed weights ({device} kernels)").format(device=s["device_type"]),
                             _fmt(s["packed_weights_bytes_per_device"])))
    if "device_bytes" in s:
        lines += [
            "",
            ljust(_("device"), 12) + ": " + _("{memory}, {share} usable").format(
                memory=_fmt(s["device_bytes"]), share=f"{s['utilization']:.0%}"),
            _("KV tokens that fit beside the weights: {tokens} (= {sequences} sequences of {context} tokens)").format(
                tokens=f"{s['kv_tokens_that_fit']:,}", sequences=f"{s['sequences_that_fit']:,}", context=s["context"]),
        ]
        best = s["smallest_tp_that_fits"]
        if s["fits"]:
            lines.append(_("fits"))
        elif best:
            lines.append(_("does NOT fit: smallest -tp that fits is {tp}").format(tp=best))
        else:
            lines.append(_("does NOT fit: no tensor-parallel size up to 64 fits"))
    return "\n".join(lines)


class ModelTooBig(ValueError):
    """The weights (plus one full-length sequence of KV cache) do not fit on the devices given."""


def check_fits(cfg: GPTConfig, tp: int, dtype: str, context: int, device_bytes: int | None,
               config_path: str, device_type: str | None = None) -> None:  # fmt: skip
    """Raise ModelTooBig, with the estimator's numbers and the smallest -tp that fits, when one
    sequence of `context` tokens cannot be served beside the weights on each device."""
    if not device_bytes:
        return  # the device layer cannot say how much memory there is: let the load find out
    est = estimate_serving(cfg, tp, dtype, batch_size=1, context=context, device_bytes=device_bytes,
                           device_type=device_type)  # fmt: skip
    if est["fits"]:
        return
    best = est["smallest_tp_that_fits"]
    hint = (_("serve it with --tensor-parallel-size {tp}").format(tp=best) if best else
            _("no tensor-parallel size up to 64 fits: use --quantize int8/int4 or bigger devices"))  # fmt: skip
    extra = est["packed_weights_bytes_per_device"] + est["activations_bytes_per_device"]
    if est["weights_bytes_per_device"] <= device_bytes * est["utilization"]:
        hint += _(", or lower --max-model-len (the KV cache of one sequence is what does not fit)")
    needs = _("{weights} of weights + {kv} of KV cache for one {context}-token sequence").format(
        weights=_fmt(est["weights_bytes_per_device"]), kv=_fmt(est["kv_cache_bytes_per_device"]), context=context)
    if extra:
        needs += _(" + {extra} of packed weights and step activations").format(extra=_fmt(extra))
    numbers = (f"portachat estimate memory --hf-config {config_path} --serve -tp {best or tp} --kv-dtype {dtype}"
               + (f" --device {device_type}" if device_type else ""))  # a command: stays as typed
    raise ModelTooBig(_(
        "the model does not fit: at -tp {tp} in {dtype} each device needs {needs}, but has {has} ({usable} usable); "
        "{hint} (numbers: {command})").format(tp=tp, dtype=dtype, needs=needs, has=_fmt(device_bytes),
                                              usable=f"{est['utilization']:.0%}", hint=hint, command=numbers))
