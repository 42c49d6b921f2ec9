"""What the Trainer measures at an evaluation: validation bits per byte, the stage's evaluators, samples."""

from __future__ import annotations

from collections.abc import Callable

from portachat.device import Device
from portachat.eval.bpb import evaluate_bpb
from portachat.i18n import _
from portachat.i18n.width import display_width
from portachat.model import GPT
from portachat.tokenizer import Tokenizer
from portachat.train.hooks import Stage
from portachat.train.samples import greedy_samples


def run_evaluators(model: GPT, stage: Stage, tokenizer: Tokenizer, dev: Device, rank: int, world: int, step: int,
                   say: Callable[[str], None]) -> dict[str, float]:
    """Bits per byte on the stage's validation batches (if it has any), then its evaluators in eval mode;
    every rank runs them (they may use collectives), each result is said as it comes."""
    results: dict[str, float] = {}
    if stage.val_batches is not None:
        bpb = evaluate_bpb(model, stage.val_batches(rank, world), tokenizer.token_bytes(), dev.torch_device,
                           dev.autocast)
        results["val_bpb"] = bpb
        say("[portachat] " + _("step {step}:").format(step=step) + " " + _("validation bits/byte {bpb}").format(bpb=f"{bpb:.4f}"))
    was_training = model.training
    model.eval()
    try:
        for evaluator in stage.evaluators:
            found = evaluator(model, step)
            results.update(found)
            if found:
                say("[portachat] " + _("step {step}:").format(step=step) + " "
                    + ", ".join(f"{k} {v:.4f}" for k, v in found.items()))
    finally:
        model.train(was_training)
    return results


def show_samples(model: GPT, tokenizer: Tokenizer, prompts: list[str], max_tokens: int, dev: Device,
                 say: Callable[[str], None]) -> list[str]:
    """Greedy continuations of the stage's sample prompts, said one under another."""
    samples = greedy_samples(model, tokenizer, prompts, max_tokens, dev)
    label = _("sample")
    indent = " " * (display_width(label) + 3)  # continuation lines align under the first line's "|"
    for text in samples:
        say("  " + label + " | " + text.replace("\n", "\n" + indent + "| "))
    return samples
