"""Which parts of a model matter, measured on calibration data (Minitron's activation-based importance).

Width (Muralidharan et al. 2024, "Compact Language Models via Pruning and Knowledge Distillation",
§2.2): one forward pass over a few calibration batches, forward hooks only, no gradients:

- an MLP neuron: its activation silu(gate) * up, what down_proj reads;
- an attention head: the norm of its attention output, what o_proj reads from that head;
- a hidden (embedding) channel: the RMSNorm outputs on that channel (every norm of every block
  and the final one: the channels the projections read).

Each is aggregated as the paper's best choice: L2 norm over the sequence, mean over the batch.

Depth (Sreenivas et al. 2024, "LLM Pruning and Distillation in Practice: The Minitron Approach",
§depth pruning): the language-model loss on the calibration batches with one block skipped,
minus the loss of the whole model — one extra pass per block; a block whose removal costs the
least matters least (the blocks before it are computed once per batch and reused). The same first pass also measures Block Importance (ShortGPT, Men et al.
2024): 1 - the mean cosine similarity of a block's input and output, for free; it is the
`--depth-metric cosine` choice when the extra passes cost too much.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from portachat.model.gpt import GPT
from portachat.model.loss import chunked_cross_entropy

DEPTH_METRICS = ("loss", "cosine")


@dataclass
class Importance:
    """Scores of one model on one calibration set (higher = matters more), on the CPU in fp32."""

    neurons: list[torch.Tensor]  # per layer [intermediate_size]
    heads: list[torch.Tensor]  # per layer [n_head]
    channels: torch.Tensor  # [n_embd]
    block_cosine: torch.Tensor  # [n_layer]: 1 - mean cos(block input, block output)
    block_loss: torch.Tensor | None  # [n_layer]: loss with the block skipped minus the full model's
    base_loss: float  # the full model's mean loss per token on the calibration batches
    tokens: int  # calibration tokens seen

    def blocks(self, metric: str = "loss") -> torch.Tensor:
        """Per-block importance by `metric` ("loss" falls back to "cosine" when it was not measured)."""
        if metric == "loss" and self.block_loss is not None:
            return self.block_loss
        return self.block_cosine


def _l2_over_sequence(x: torch.Tensor) -> torch.Tensor:
    """[B, T, F] -> [F]: L2 norm over T, summed over B (divided by the row count at the end)."""
    return x.float().pow(2).sum(dim=1).sqrt().sum(dim=0)


class _Recorder:
    """Forward hooks that accumulate the width statistics and block cosines of one pass."""

    def __init__(self, model: GPT) -> None:
        cfg = model.config
        self.neurons = [torch.zeros(cfg.intermediate_size) for _ in range(cfg.n_layer)]
        self.heads = [torch.zeros(cfg.n_head) for _ in range(cfg.n_layer)]
        self.channels = torch.zeros(cfg.n_embd)
        self.cosine = torch.zeros(cfg.n_layer)
        self.rows = 0
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        norms: list[nn.Module] = [model.model.norm]
        for i, block in enumerate(model.model.layers):
            self.handles.append(block.mlp.down_proj.register_forward_pre_hook(self._neuron_hook(i)))
            self.handles.append(block.self_attn.o_proj.register_forward_pre_hook(self._head_hook(i, cfg.n_head)))
            self.handles.append(block.register_forward_hook(self._cosine_hook(i)))
            norms += [block.input_layernorm, block.post_attention_layernorm]
        for norm in norms:
            self.handles.append(norm.register_forward_hook(self._channel_hook))

    def _neuron_hook(self, i: int):
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            self.neurons[i] += _l2_over_sequence(args[0]).cpu()

        return hook

    def _head_hook(self, i: int, n_head: int):
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            y = args[0]
            per_head = y.float().view(*y.shape[:2], n_head, -1).pow(2).sum(dim=(1, 3)).sqrt()  # [B, H]
            self.heads[i] += per_head.sum(dim=0).cpu()

        return hook

    def _cosine_hook(self, i: int):
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            cos = F.cosine_similarity(args[0].float(), out.float(), dim=-1)  # [B, T]
            self.cosine[i] += cos.mean(dim=1).sum().cpu()

        return hook

    def _channel_hook(self, _module: nn.Module, _args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        self.channels += _l2_over_sequence(out).cpu()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _loss_sum(model: GPT, x: torch.Tensor, targets: torch.Tensor) -> float:
    return float(chunked_cross_entropy(model.model.norm(x), model.lm_head, targets, reduction="sum"))


def _losses(model: GPT, batches: Sequence[torch.Tensor], skip_each_block: bool) -> tuple[float, torch.Tensor | None, int]:
    """Mean loss per token of the whole model and, with `skip_each_block`, of the model without each
    block in turn. The blocks before the skipped one compute what they computed for the whole
    model, so each batch's block inputs are kept from its full pass and every skip pass starts
    at its block: L(L-1)/2 block calls per batch instead of L^2."""
    layers = model.model.layers
    base, skipped, tokens = 0.0, torch.zeros(len(layers)), 0
    for idx in batches:
        idx = idx.to(model.lm_head.weight.device)
        inputs, targets = idx[:, :-1], idx[:, 1:]
        cos, sin = model.rotary(inputs.size(1))
        cos, sin = cos[None, None], sin[None, None]
        x = model.model.embed_tokens(inputs)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        block_inputs = []
        for block in layers:
            block_inputs.append(x)
            x = block(x, cos, sin)
        base += _loss_sum(model, x, targets)
        tokens += targets.numel()
        if not skip_each_block:
            continue
        for i in range(len(layers)):
            x = block_inputs[i]
            for block in layers[i + 1:]:
                x = block(x, cos, sin)
            skipped[i] += _loss_sum(model, x, targets)
    tokens = max(tokens, 1)
    return base / tokens, (skipped / tokens - base / tokens) if skip_each_block else None, tokens


@torch.no_grad()
def measure_importance(model: GPT, batches: Sequence[torch.Tensor], depth_metric: str = "loss") -> Importance:
    """Importance of every block, head, neuron and hidden channel of `model` on `batches` (token ids
    [B, T], each row a calibration sample). `depth_metric` "loss" adds one pass per block (the
    skip-one-block loss); "cosine" keeps it to the single pass."""
    if depth_metric not in DEPTH_METRICS:
        raise ValueError(f"depth_metric must be one of {DEPTH_METRICS}, got {depth_metric!r}")
    if not batches:
        raise ValueError("measure_importance needs at least one calibration batch")
    was_training = model.training
    model.eval()
    recorder = _Recorder(model)
    try:  # the hooks see every pass: only the full model's pass may count
        base_loss, _unused, tokens = _losses(model, batches, skip_each_block=False)
    finally:
        recorder.remove()
    rows = sum(int(b.size(0)) for b in batches)
    block_loss = _losses(model, batches, skip_each_block=True)[1] if depth_metric == "loss" else None
    model.train(was_training)
    return Importance(
        neurons=[n / rows for n in recorder.neurons],
        heads=[h / rows for h in recorder.heads],
        channels=recorder.channels / rows,
        block_cosine=1.0 - recorder.cosine / rows,
        block_loss=block_loss,
        base_loss=base_loss,
        tokens=tokens,
    )
