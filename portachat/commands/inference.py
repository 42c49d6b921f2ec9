"""Flags shared by the commands that load a model for inference (chat, generate, serve, eval)."""

from __future__ import annotations

import argparse

from portachat.commands.common import flag, int_at_least, positive_int
from portachat.engine.sampling_params import SamplingError, SamplingFallback, check_field, from_request
from portachat.engine.types import SamplingParams
from portachat.i18n import _
from portachat.model.load import GenerationDefaults


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected a number, got {text}").format(text=repr(text))) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(_("must be above {minimum}, got {value}").format(minimum=0, value=value))
    return value


def nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected a number, got {text}").format(text=repr(text))) from None
    if value < 0:
        raise argparse.ArgumentTypeError(_("must be at least {minimum}, got {value}").format(minimum=0, value=value))
    return value


def add_model_flags(p: argparse.ArgumentParser, max_num_seqs: int = 32) -> None:
    g = p.add_argument_group(_("model"))
    flag(g, "--model", required=True,
         help=_("our checkpoint (a step directory, a stage directory, or run/stage under $PORTACHAT_HOME/runs), "
              "a Hugging Face model directory, or a .gguf file"))
    flag(g, "--lora", default=None,
         help=_("a LoRA adapter directory (PEFT format, e.g. from `portachat train sft --lora-rank R`) trained on "
              "--model: folded into the weights at load time"))
    flag(g, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(g, "--dtype", default=None, help=_("bf16|fp16|fp32 weights (default: the device's best for inference)"))
    flag(g, "--compile", default=None, choices=["0", "1"], help=_("torch.compile the decode step (default: per device policy)"))
    flag(g, "--enforce-eager", action="store_true",
         help=_("never replay decode steps from device graphs (default: CUDA graphs where the device policy allows)"))
    flag(g, "--quantize", default=None, choices=["int8", "int4"],
         help=_("weight-only quantization: int8 per channel or int4 in groups of 32 (default: off); the device layer "
              "picks the kernels and refuses where none exists"))
    g = p.add_argument_group(_("engine"))
    add_tensor_parallel_flag(g)
    add_engine_flags(g, max_num_seqs, _("requests queued beyond the running batch (default 256)"))
    add_speculative_flags(p)


def add_engine_flags(g, max_num_seqs: int, max_waiting_help: str) -> None:
    """The engine's size flags (chat, generate, serve)."""
    flag(g, "--max-model-len", type=positive_int, default=None, help=_("prompt + reply tokens per request (default: the model's)"))
    flag(g, "--max-num-seqs", type=positive_int, default=max_num_seqs,
         help=_("requests decoded together (default %(default)s)"))
    flag(g, "--max-num-batched-tokens", type=positive_int, default=None, help=_("tokens per engine step (prefill chunk budget)"))
    flag(g, "--kv-cache-gb", type=positive_float, default=None, help=_("KV-cache size in GiB (default: from free device memory)"))
    flag(g, "--kv-cache-dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16", "int8", "fp8"],
         help=_("KV-cache storage: auto (fp32 on a CPU, else the weights' dtype); int8 holds ~2x the tokens of bf16 "
              "(~4x fp32) in the same --kv-cache-gb; fp8 where the device has it natively"))
    flag(g, "--max-waiting", type=int_at_least(0), default=256, help=max_waiting_help)
    flag(g, "--no-prefix-caching", action="store_true", help=_("do not reuse KV blocks of identical prompt prefixes"))


def add_speculative_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's speculative decoding flags (chat, generate, serve)."""
    g = p.add_argument_group(_("speculative decoding (off by default)"))
    flag(g, "--speculative-model", default=None,
         help=_("'ngram' (also '[ngram]'): draft by prompt lookup, no extra model; or a draft model (any --model "
              "source) sharing the target's vocabulary. Greedy output is unchanged; sampled output keeps the "
              "target's distribution"))
    flag(g, "--num-speculative-tokens", type=positive_int, default=None, help=_("tokens drafted per step (default 4)"))
    flag(g, "--ngram-prompt-lookup-max", type=positive_int, default=None,
         help=_("longest suffix looked up earlier in the text (default 4)"))
    flag(g, "--ngram-prompt-lookup-min", type=positive_int, default=None,
         help=_("shortest suffix worth a full guess of K tokens (default 2; a shorter one guesses one token)"))
    flag(g, "--speculative-max-batch", type=positive_int, default=None,
         help=_("steps with more sequences than this decode without speculation, where it does not pay (default 4)"))
    flag(g, "--speculative-draft-vocab", type=positive_int, default=None,
         help=_("a draft model's output head keeps only the N most frequent tokens (and the stop tokens): a "
              "cheaper draft step, for drafts whose head is most of their weights; output is unchanged "
              "(default: the whole vocabulary)"))


def add_tensor_parallel_flag(g) -> None:
    g.add_argument("--tensor-parallel-size", "--tensor_parallel_size", "-tp", type=positive_int, default=1,
         help=_("split the model over N devices (heads and KV cache by head, one all-reduce per projection pair); "
              "the command starts its N-1 worker processes itself (default 1)"))


def sampling_flag(name: str, parse: type):
    """An argparse type for a sampling flag: the number, then the one sampling check
    (engine/sampling_params.py) that the API and `generate` rows go through too."""

    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            expected = _("expected an integer, got {text}") if parse is int else _("expected a number, got {text}")
            raise argparse.ArgumentTypeError(expected.format(text=repr(text))) from None
        try:
            check_field(name, value)
        except SamplingError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return check


def add_sampling_flags(p: argparse.ArgumentParser, fallback: SamplingFallback) -> None:
    """The sampling flags; an unset one takes the model's generation_config, then `fallback` (the
    command's own defaults, named in its module and shown here)."""
    g = p.add_argument_group(_("sampling"))
    flag(g, "--temperature", type=sampling_flag("temperature", float), default=None,
         help=_("0 = greedy (default: the model's generation_config, else {t})").format(t=fallback.temperature))
    flag(g, "--top-p", type=sampling_flag("top_p", float), default=None,
         help=_("nucleus sampling mass (default: the model's, else 1.0)"))
    flag(g, "--top-k", type=sampling_flag("top_k", int), default=None, help=_("sample among the k likeliest tokens; 0 = off"))
    flag(g, "--max-tokens", type=sampling_flag("max_tokens", int), default=fallback.max_tokens,
         help=_("longest reply in tokens (default %(default)s)"))
    flag(g, "--seed", type=sampling_flag("seed", int), default=None, help=_("random seed: the same seed gives the same replies"))


def load_options(args: argparse.Namespace):
    from portachat.engine.loading import LoadOptions  # deferred: loads torch

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


def speculative_options(args: argparse.Namespace):
    """SpeculativeOptions from the flags, or None when --speculative-model is not given."""
    from portachat.engine.loading import SpeculativeOptions  # deferred: loads torch

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
