"""The one gradient-accumulation rule: how many micro-batches make an optimizer step.

Exact or refused: a step sees exactly --total-batch-size tokens, or training stops before it starts
with the multiple to use. (Rounding up would silently train on a different batch than asked for, and
the learning rate was chosen for the batch asked for.) The batch-size finder picks a device batch that
divides the total, so `--device-batch-size auto` always satisfies it.
"""

from __future__ import annotations

from portachat.i18n import _


class TrainingError(RuntimeError):
    """Training cannot go on; the message says what happened and what to do."""


def grad_accum_steps(total_batch_tokens: int | None, device_batch_size: int, seq_len: int, world_size: int = 1,
                     tokens_per_batch: int | None = None) -> int:
    """Micro-steps per optimizer step so that all devices together see exactly `total_batch_tokens`
    (None or 0: one micro-step, the total is what one step of every device holds). A micro-batch holds
    `device_batch_size` rows of `seq_len`, or, with `tokens_per_batch`, rows up to that many tokens."""
    if tokens_per_batch is not None and tokens_per_batch < seq_len:
        raise TrainingError(
            _("--tokens-per-batch {budget} is below --max-seq-len {seq}: a micro-batch must hold at least one "
              "whole row. Raise --tokens-per-batch or lower --max-seq-len.").format(budget=tokens_per_batch, seq=seq_len))
    per_device = tokens_per_batch if tokens_per_batch is not None else device_batch_size * seq_len
    per_step = per_device * world_size
    if per_step <= 0:
        raise TrainingError(_("device batch size, sequence length and world size must be positive"))
    total = total_batch_tokens or per_step
    if total % per_step:
        if tokens_per_batch is not None:
            raise TrainingError(
                _("--total-batch-size {total} is not a multiple of --tokens-per-batch x devices = {budget} x "
                  "{world} = {per_step}. Use a multiple of {per_step}, e.g. {example}.").format(
                    total=total, budget=tokens_per_batch, world=world_size, per_step=per_step,
                    example=per_step * max(1, round(total / per_step))))
        raise TrainingError(
            _("--total-batch-size {total} is not a multiple of device batch x sequence x devices "
              "= {batch} x {seq} x {world} = {per_step}. Use a multiple of {per_step}, e.g. {example}.").format(
                total=total, batch=device_batch_size, seq=seq_len, world=world_size,
                per_step=per_step, example=per_step * max(1, round(total / per_step)))
        )
    return total // per_step


def largest_dividing_batch(batch: int, total_batch_tokens: int | None, seq_len: int, world_size: int = 1) -> int:
    """The largest device batch <= `batch` whose steps divide `total_batch_tokens` exactly (1 always does
    when the total is a multiple of seq_len x world_size)."""
    if total_batch_tokens:
        while batch > 1 and total_batch_tokens % (batch * seq_len * world_size):
            batch -= 1
    return batch
