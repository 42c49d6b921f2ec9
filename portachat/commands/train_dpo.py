"""`portachat train dpo` (preference alignment) and `portachat train prefs` (pairs from the model's own answers).

Registered under `train` (commands/train.py makes the group; this module adds two stages to it).
"""

from __future__ import annotations

import argparse

from portachat.commands.common import EPILOG, flag, int_at_least, later, nonneg_int, positive_int
from portachat.commands.train import add_finetune_flags, add_train_flags
from portachat.i18n import _

LOSSES = ("dpo", "ipo", "simpo", "orpo")


def add_dpo_parser(tsub) -> None:
    t = tsub.add_parser("dpo", help=_("preference alignment on chosen/rejected pairs (DPO, IPO, SimPO, ORPO)"),
                        epilog=EPILOG,
                        description=_("Align a model on preference pairs: rows of prompt / chosen / rejected (strings "
                                      "or message lists, TRL's layouts), rendered with the model's chat template; "
                                      "the loss covers the replies' tokens only. Full or LoRA, on one device or many "
                                      "(torchrun, DDP or FSDP2). The reference is the starting model: with LoRA the "
                                      "same weights with the adapter off, otherwise its log-probs computed once "
                                      "before training. Logs TRL's rewards/chosen, rewards/rejected, "
                                      "rewards/accuracies, rewards/margins, logps/chosen, logps/rejected. "
                                      "Checkpoints go to <home>/runs/<run>/dpo/step_<N>/."))
    g = t.add_argument_group(_("data and model"))
    flag(g, "--init", required=True,
         help=_("the model to align: a Hugging Face directory, a .gguf file or a checkpoint (RUN/STAGE or a path)"))
    flag(g, "--data", action="append", default=None,
         help=_("jsonl/parquet file or directory of preference pairs ('prompt', 'chosen', 'rejected'); repeat to "
                "mix. No pairs yet? `portachat train prefs` makes them from the model's own answers"))
    flag(g, "--loss", choices=LOSSES, default="dpo",
         help=_("dpo (sigmoid), ipo, simpo (no reference) or orpo (no reference, adds the chosen reply's NLL) "
                "(default %(default)s)"))
    flag(g, "--beta", type=float, default=None,
         help=_("strength: DPO/IPO's beta, SimPO's beta, ORPO's lambda (default 0.1; SimPO 2.0)"))
    flag(g, "--simpo-gamma", type=float, default=0.5, help=_("SimPO's target reward margin gamma (default %(default)s)"))
    flag(g, "--reference", choices=["auto", "live", "cache"], default="auto",
         help=_("the reference's log-probs: live = the model with its LoRA adapter off at every step, cache = "
                "computed once before training; auto = live with LoRA, cache otherwise"))
    flag(g, "--max-pairs", type=positive_int, default=None, help=_("read at most N pairs"))
    flag(g, "--val-pairs", type=nonneg_int, default=64,
         help=_("pairs held out for eval/rewards/* (at most a tenth of the set; default %(default)s)"))
    flag(g, "--num-epochs", type=float, default=1.0, help=_("passes over the pairs when --num-iterations is not given"))
    flag(g, "--eval-examples", type=nonneg_int, default=16,
         help=_("held-out prompts with an 'answer' answered at each evaluation (default %(default)s)"))
    flag(g, "--eval-max-tokens", type=positive_int, default=64, help=_("reply length limit when evaluating answers"))
    add_finetune_flags(t)
    add_train_flags(t)
    for action in t._actions:  # preference training moves a model less than SFT: its own defaults, said in help
        if action.dest == "lr":
            action.help = _("AdamW learning rate (default 5e-06 full, 5e-05 LoRA)")
        if action.dest == "device_batch_size":
            action.help = _("pairs per device per micro-step (each pair is two rows; default 4)")
    t.set_defaults(func=later("train_dpo", "cmd_train_dpo"))


def add_prefs_parser(tsub) -> None:
    t = tsub.add_parser("prefs", help=_("make preference pairs from the model's own right and wrong answers"),
                        epilog=EPILOG,
                        description=_("Sample the model several times on prompts with verifiable answers (the "
                                      "built-in synthetic tasks, or GSM8K-style --data), check each reply, and write "
                                      "a right reply (chosen) against a wrong one (rejected) for every prompt that "
                                      "has both, as jsonl for `portachat train dpo --data`."))
    flag(t, "--model", required=True, help=_("the model to sample: a checkpoint, a Hugging Face directory or a .gguf"))
    flag(t, "--output", required=True, help=_("the jsonl file to write (atomically)"))
    flag(t, "--data", action="append", default=None,
         help=_("jsonl/parquet rows with verifiable answers (GSM8K 'question'/'answer', multiple choice); default: "
                "the synthetic tasks' train split"))
    flag(t, "--tasks", default=None, help=_("comma-separated synthetic tasks to ask (default: the curriculum's mix)"))
    flag(t, "--num-prompts", type=positive_int, default=256, help=_("prompts to ask (default %(default)s)"))
    flag(t, "--num-samples", type=int_at_least(2), default=4, help=_("replies sampled per prompt (default %(default)s)"))
    flag(t, "--pairs-per-prompt", type=positive_int, default=1, help=_("pairs kept per prompt at most (default %(default)s)"))
    flag(t, "--temperature", type=float, default=1.0, help=_("sampling temperature (default %(default)s)"))
    flag(t, "--max-new-tokens", type=positive_int, default=64, help=_("reply length limit (default %(default)s)"))
    flag(t, "--seed", type=int, default=0, help=_("sampling seed (default %(default)s)"))
    flag(t, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(t, "--dtype", default=None, help=_("inference dtype (default: the device's choice)"))
    t.set_defaults(func=later("train_dpo", "cmd_train_prefs"))


def register(sub) -> None:
    """Add `dpo` and `prefs` to the `train` group commands/train.py made."""
    train = sub.choices["train"]
    tsub = next(a for a in train._actions if isinstance(a, argparse._SubParsersAction))
    add_dpo_parser(tsub)
    add_prefs_parser(tsub)
