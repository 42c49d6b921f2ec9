"""`--device-batch-size auto` for the stages that train a loaded model: sft/mid fine-tuning, DPO, distillation.

The probe is the real thing, run on the model itself as it will train: its LoRA adapters or all its
weights, AdamW as finetune_optimizer builds it, activation checkpointing as configured, and the stage's
own loss (the chunked cross-entropy; a preference loss with its reference forward; the teacher's forward
and the distillation loss), on rows as wide as the data's longest after bucketing, every position
supervised (the chunked loss's worst case; packed rows hold two conversations, for the packed attention
mask). batch_size.py's search (doubling, then bisection, under a safety margin of the device's memory)
picks the size; each probe is one forward and backward, AdamW's state allocated first as it is from the
second step on.

The probe leaves the model as it found it: gradients are zeroed before AdamW steps at lr 0 (so its state
is allocated as in training but nothing moves), they are freed after, and the RNG is restored (LoRA
dropout draws from it), so a run with `auto` trains exactly as one given the number it picked.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from portachat.data.batch import Batch
from portachat.device import Device, DistEnv
from portachat.device.policy import auto_batch_max_positions
from portachat.i18n import _
from portachat.train.accumulation import TrainingError
from portachat.train.activation_checkpointing import apply_activation_checkpointing
from portachat.train.batch_size import batch_for_budget, measure_peak, resolve_auto
from portachat.train.config import TrainConfig
from portachat.train.finetune_optim import finetune_optimizer
from portachat.train.hooks import LossHook, token_loss

MakeBatch = Callable[[int, int], Batch]  # (batch size, row width) -> a probe batch on the host


def resident_bytes(*modules: nn.Module) -> int:
    """Bytes of the modules' parameters and buffers, each storage once: what stays in memory through training."""
    sizes: dict[int, int] = {}
    for module in modules:
        for t in itertools.chain(module.parameters(), module.buffers()):
            storage = t.untyped_storage()
            sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


def probe_rows(batch_size: int, width: int, vocab_size: int, packed: bool = False) -> Batch:
    """`batch_size` rows of `width` positions, every one supervised; packed rows hold two conversations."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (batch_size, width + 1), generator=gen)
    positions = None
    if packed:
        half = width // 2
        positions = torch.cat([torch.arange(half), torch.arange(width - half)]).repeat(batch_size, 1)
    return Batch(ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), positions=positions)


def finetune_peak(model: nn.Module, make_batch: Callable[[], Batch], loss: LossHook, dev: Device,
                  activation_checkpointing: bool, resident: Sequence[nn.Module] = ()) -> int:
    """Peak bytes of one training step of `model` (in place) on `make_batch()`: weights, gradients, AdamW's
    state, the loss hook's activations, and `resident` modules (a teacher) that stay in memory."""
    params = [p for p in model.parameters() if p.requires_grad]

    def run() -> None:
        opt = finetune_optimizer(model, 0.0, 0.0, dev.fused_optimizer)
        for p in params:  # AdamW's state exists from the first real step on: allocate it before the forward
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        batch = make_batch().to(dev.torch_device)
        with dev.autocast():
            value = loss(model, batch)
        value.backward()
        del value
        for p in params:  # an update of zeros at lr 0: the state's memory and the step's temporaries, no change
            if p.grad is not None:
                p.grad.zero_()
        opt.step()
        opt.zero_grad(set_to_none=True)

    rng, was_training = dev.get_rng_state(), model.training
    if activation_checkpointing:  # the Trainer applies it too; applying it twice wraps nothing twice
        apply_activation_checkpointing(model)
    model.train()
    try:
        # No tensor of a step outlives it in a reference cycle (what cycles remain are peft's type annotations),
        # so the probe skips a full collection: ~0.4 s each in a process that imported transformers.
        return measure_peak(run, dev, resident_bytes(model, *resident), collect_garbage=False)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        dev.set_rng_state(rng)


def resolve_finetune_batch_size(cfg: TrainConfig, model: nn.Module, dev: Device, env: DistEnv,
                                say: Callable[[str], None], width: Callable[[], int], most: int,
                                make_batch: MakeBatch | None = None, loss: LossHook = token_loss,
                                resident: Sequence[nn.Module] = (), describe: str | None = None,
                                chosen: str | None = None, memory_limit: int | None = None,
                                rows_per_example: int = 1) -> TrainConfig:
    """`--device-batch-size auto` for a loaded model: the largest batch whose probe (finetune_peak) fits the
    device's memory (`memory_limit` if given), at most `most` (the examples there are) and the device
    layer's cap on a micro-batch's positions, dividing --total-batch-size; the same on every rank.
    `width()`: the data's widest padded row; `make_batch`: the stage's probe batch (default: rows of
    token_loss's kind) of `rows_per_example` rows an example; `describe`/`chosen`: the lines saying what
    is probed ({n}, {seq_len}) and what was picked ({batch}, {accum}) where the stage counts other than
    rows. With --tokens-per-batch nothing is probed: the budget bounds each micro-batch."""
    vocab = model.config.vocab_size
    rows = make_batch or (lambda b, w: probe_rows(b, w, vocab))

    def choose() -> int:
        n = width()
        line = describe or _("--device-batch-size auto probes rows of {n} tokens: the data's longest, padded "
                             "(--max-seq-len {seq_len})")
        say("[portachat] " + line.format(n=n, seq_len=cfg.max_seq_len))
        cap = min(max(1, most), 1024)
        positions = auto_batch_max_positions(dev.type)
        if positions is not None and positions // (n * rows_per_example) < cap:
            cap = max(1, positions // (n * rows_per_example))
            say("[portachat] " + _("--device-batch-size auto: at most {cap} on a {device} ({positions} positions a "
                                   "micro-batch: its throughput stops growing there, and each probe is a real step); "
                                   "give a number to go further").format(cap=cap, device=dev.type,
                                                                         positions=f"{positions:,}"))
        found, batch, _accum = batch_for_budget(
            lambda b: finetune_peak(model, lambda: rows(b, n), loss, dev, cfg.activation_checkpointing, resident),
            cfg.max_seq_len, dev, cfg.total_batch_size, env.world_size, memory_limit,
            lambda m: say("[portachat] " + m), max_batch_size=cap)
        if batch == 0:
            raise TrainingError(_(
                "--device-batch-size auto: not even 1 fits in {gib} GiB with rows of {n} tokens (the model, its "
                "gradients, AdamW's state and one step's activations). Lower --max-seq-len, train a LoRA adapter "
                "(--lora-rank R), or turn on --activation-checkpointing.").format(
                    gib=f"{found.limit_bytes / 2**30:.2f}", n=n))
        return batch

    return resolve_auto(cfg, dev, env, say, choose, chosen)
