"""`portachat distill`: train a student to match a teacher's next-token distributions."""

from __future__ import annotations

import argparse

from portachat.commands.common import EPILOG, flag, later, positive_int
from portachat.commands.train import add_train_flags
from portachat.i18n import _
from portachat.model.config import ALL_LINEAR
from portachat.train.defaults import FULL_LR, LORA_LR


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(_("must be between 0 and 1, got {value}").format(value=text))
    return value


def register(sub) -> None:
    p = sub.add_parser(
        "distill", help=_("train a smaller student to match a teacher model (knowledge distillation)"), epilog=EPILOG,
        description=_("Knowledge distillation: the student learns the teacher's next-token distributions on the "
                      "assistant tokens of conversations. Loss per token: τ² · D_β(teacher, student) + α · "
                      "cross-entropy, where D_β is forward KL (β=0), reverse KL (β=1) or GKD's generalized JSD. "
                      "Teacher and student must share a vocabulary. Checkpoints go to "
                      "<home>/runs/<run>/distill/step_<N>/ (Hugging Face directories: serve and export work on them)."))
    g = p.add_argument_group(_("teacher and student"))
    flag(g, "--teacher", required=True,
         help=_("the teacher: a Hugging Face directory, a .gguf file, a checkpoint, or http://HOST:PORT of a portachat "
                "serve or vLLM server (it returns prompt_logprobs; needs --top-k and --temperature 1)"))
    flag(g, "--teacher-model", default=None, help=_("a remote teacher's served model name (default: the server's first)"))
    flag(g, "--student", default=None, help=_("the student: a model sharing the teacher's vocabulary"))
    flag(g, "--student-depth", type=positive_int, default=None,
         help=_("or build the student from the teacher: keep N of its layers, evenly spaced from the first to the last"))
    g = p.add_argument_group(_("data"))
    flag(g, "--data", action="append", default=None,
         help=_("jsonl/parquet file or directory of conversations ('messages'); repeat to mix (default: built-in "
                "synthetic task conversations)"))
    flag(g, "--max-conversations", type=positive_int, default=None, help=_("read at most N conversations"))
    flag(g, "--tokens-per-batch", type=positive_int, default=None,
         help=_("draw each micro-batch by a token budget instead of --device-batch-size rows"))
    flag(g, "--num-epochs", type=float, default=1.0, help=_("passes over the data when --num-iterations is not given"))
    g = p.add_argument_group(_("distillation loss"))
    flag(g, "--loss", choices=["kl", "forward-kl", "reverse-kl", "jsd"], default="kl",
         help=_("divergence: forward KL (the classic), reverse KL (mode-seeking) or GKD's JSD (default %(default)s)"))
    flag(g, "--beta", type=_share, default=None,
         help=_("GKD's β: 0 = forward KL, 1 = reverse KL, between = generalized JSD (default: from --loss; jsd 0.5)"))
    flag(g, "--temperature", type=float, default=1.0, help=_("softmax temperature τ of both distributions (default 1)"))
    flag(g, "--alpha", type=float, default=0.0, help=_("weight of the cross-entropy on the data's tokens (default 0)"))
    flag(g, "--top-k", type=int, default=0,
         help=_("compare on the teacher's K most likely tokens plus the rest as one outcome, to bound memory; 0 = "
                "the whole vocabulary (default 0)"))
    flag(g, "--on-policy", type=_share, default=0.0,
         help=_("λ: share of micro-batches whose replies the student samples itself, scored by the teacher (default 0)"))
    flag(g, "--max-new-tokens", type=positive_int, default=64, help=_("on-policy reply length (default 64)"))
    flag(g, "--sample-temperature", type=float, default=1.0, help=_("the student's sampling temperature on-policy (default 1)"))
    g = p.add_argument_group(_("optimizer and LoRA"))
    flag(g, "--lr", type=float, default=None, help=_("AdamW learning rate (default {full} full, {lora} LoRA)").format(
        full=f"{FULL_LR:g}", lora=f"{LORA_LR:g}"))
    flag(g, "--lora-rank", type=positive_int, default=None, help=_("train a LoRA adapter (peft) of this rank instead of all weights"))
    flag(g, "--lora-alpha", type=float, default=None, help=_("LoRA scale numerator (default: 2 x rank)"))
    flag(g, "--lora-targets", default=",".join(ALL_LINEAR), help=_("comma-separated modules (default %(default)s)"))
    flag(g, "--lora-dropout", type=float, default=0.0, help=_("dropout on the LoRA input (default 0)"))
    flag(g, "--merge", action="store_true", help=_("with --lora-rank: also write <stage>/merged/, the adapter folded in"))
    add_train_flags(p)
    p.set_defaults(func=later("distill", "cmd_distill"))
