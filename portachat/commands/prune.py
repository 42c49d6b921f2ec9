"""`portachat prune` and `portachat compress`: smaller models from bigger ones."""

from __future__ import annotations

import argparse

from portachat.commands.common import flag, later, nonneg_int, positive_int
from portachat.i18n import N_, _, gettext

MODEL_HELP = N_("the model to prune: our checkpoint, a Hugging Face directory (Llama / SmolLM2, Qwen2, Qwen3) or a "
                ".gguf file")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected a number, got {text}").format(text=repr(text))) from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(_("must be between 0 and 1 (exclusive), got {value}").format(value=value))
    return value


def _add_prune_flags(p: argparse.ArgumentParser, output_help: str) -> None:
    flag(p, "--model", required=True, help=gettext(MODEL_HELP))
    flag(p, "--output", required=True, help=output_help)
    flag(p, "--data", help=_("calibration data for importance: a text file (.txt) or chat conversations (.jsonl)"))
    flag(p, "--target-num-layers", type=positive_int, help=_("depth: keep this many blocks (the least important go)"))
    flag(p, "--target-ffn-hidden-size", type=positive_int, help=_("width: MLP neurons per block"))
    flag(p, "--target-num-attention-heads", type=positive_int,
         help=_("width: query heads per block (a multiple of the KV groups kept)"))
    flag(p, "--target-num-query-groups", type=positive_int, help=_("width: KV groups (key/value heads) per block"))
    flag(p, "--target-hidden-size", type=positive_int, help=_("width: hidden (embedding) channels"))
    flag(p, "--depth-metric", default="loss", choices=["loss", "cosine"],
         help=_("block importance: the loss with the block skipped (one pass per block, default) or 1 - cosine of "
                "its input and output (one pass)"))
    flag(p, "--calibration-samples", type=positive_int, default=32, help=_("calibration rows (default 32)"))
    flag(p, "--seq-len", type=positive_int, default=256, help=_("tokens per calibration row (default 256)"))
    flag(p, "--unstructured", type=_fraction,
         help=_("also zero this fraction of each block weight matrix by magnitude, e.g. 0.2 (dense kernels do not "
                "get faster from it)"))
    flag(p, "--sparsity-pattern", default="unstructured", choices=["unstructured", "2:4"],
         help=_("2:4 keeps the 2 largest of every 4 weights (50%%; sparse kernels on GPUs that have them)"))
    flag(p, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))


def register(sub) -> None:
    p = sub.add_parser("prune", help=_("prune a model by measured importance (depth, width) or by magnitude; "
                                       "writes a checkpoint of the same family"))
    _add_prune_flags(p, _("directory to create (must not exist)"))
    p.set_defaults(func=later("prune", "cmd_prune"))
    c = sub.add_parser("compress", help=_("prune, heal, evaluate before and after, write a report with a plot"))
    _add_prune_flags(c, _("directory to create for the pruned model, the healing run and the report"))
    flag(c, "--heal-data", help=_("conversations (.jsonl) to heal on (default: --data when it is a chat dataset)"))
    flag(c, "--heal", default="distill", choices=["distill", "sft"],
         help=_("how to heal the pruned model: distill from the unpruned model (forward KL on its next-token "
                "distributions, as Minitron does; default) or sft (next-token cross-entropy on the data)"))
    flag(c, "--heal-steps", type=nonneg_int, default=200, help=_("healing steps (default 200; 0 skips healing)"))
    flag(c, "--device-batch-size", type=positive_int, default=8, help=_("healing rows per step (default 8)"))
    flag(c, "--eval-samples", type=positive_int, default=16,
         help=_("held-out rows of --data for perplexity (default 16)"))
    flag(c, "--gsm8k", help=_("a GSM8K .jsonl to measure task accuracy on (default: not measured)"))
    flag(c, "--gsm8k-examples", type=positive_int, default=50, help=_("GSM8K questions (default 50)"))
    flag(c, "--decode-tokens", type=positive_int, default=64, help=_("tokens generated to time decoding (default 64)"))
    c.set_defaults(func=later("prune", "cmd_compress"))
