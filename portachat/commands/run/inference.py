"""What the inference commands (chat, generate, serve) make of their shared flags: the engine's
load options and the sampling parameters. The flags themselves are in commands/inference.py."""

from __future__ import annotations

import argparse

from portachat.engine.loading import LoadOptions, SpeculativeOptions
from portachat.engine.sampling_params import SamplingFallback, from_request
from portachat.engine.types import SamplingParams
from portachat.i18n import _
from portachat.model.load import GenerationDefaults


def load_options(args: argparse.Namespace) -> LoadOptions:
    return LoadOptions(
        model=args.model,  # load_for_inference resolves stage dirs and run/stage names
        device=args.device,
        dtype=args.dtype,
        compile=None if args.compile is None else args.compile == "1",
        enforce_eager=args.enforce_eager,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_gb=args.kv_cache_gb,
        gpu_memory_utilization=getattr(args, "gpu_memory_utilization", 0.9),
        data_parallel_size=getattr(args, "data_parallel_size", 1),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
        max_waiting=args.max_waiting,
        enable_prefix_caching=not args.no_prefix_caching,
        lora=getattr(args, "lora", None),
        quantize=getattr(args, "quantize", None),
        chat_template=getattr(args, "chat_template", None),  # the file's text (read by the flag's type)
        pooling=getattr(args, "pooling", None),
        speculative=speculative_options(args),
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
    )


def speculative_options(args: argparse.Namespace) -> SpeculativeOptions | None:
    """SpeculativeOptions from the flags, or None when --speculative-model is not given."""
    flags = {"num_speculative_tokens": "num_speculative_tokens", "prompt_lookup_max": "ngram_prompt_lookup_max",
             "prompt_lookup_min": "ngram_prompt_lookup_min", "max_batch": "speculative_max_batch",
             "draft_vocab_size": "speculative_draft_vocab"}  # option -> its flag's dest; fmt: skip
    given = {k: getattr(args, dest) for k, dest in flags.items() if getattr(args, dest) is not None}
    if args.speculative_model is None:
        if given:
            names = ", ".join("--" + flags[k].replace("_", "-") for k in given)  # the flags as typed
            raise ValueError(_("{flags} need --speculative-model (ngram or a draft model path)").format(flags=names))
        return None
    return SpeculativeOptions(model=args.speculative_model, **given)


def sampling_params(args: argparse.Namespace, defaults: GenerationDefaults, fallback: SamplingFallback) -> SamplingParams:
    """SamplingParams from the flags; unset ones take the model's generation_config, then `fallback`."""
    flags = {name: getattr(args, name) for name in ("max_tokens", "temperature", "top_p", "top_k", "seed")}
    return from_request(flags, defaults, fallback)
