"""Many LoRA adapters in one batch: each row of a flat batch gets its own adapter's update.

The base weights are shared and never copied: a step computes W x for every row, then adds
B_a (A_a x) to the rows of each adapter a present in the step (grouped low-rank products: one
gather of those rows, two thin matrix products, one scatter-add per adapter and layer). A step
with no adapter rows does no extra work at all.

Updates are kept per transformer layer and per *fused* product, the way the engine's forwards
compute them: q/k/v share one input, so their A's are stacked into one [r_q + r_k + r_v, C] matrix
and their B's laid block-diagonally into one [out_q + out_k + out_v, r_q + r_k + r_v] matrix (the
same for gate/up); a module the adapter does not target contributes no rank and zero output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from portachat.i18n import _
from portachat.model.lora import LoraWeights, check_fits

# fused product -> (its modules, in output order); the names PEFT's target_modules use
FUSED = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}

Groups = list[tuple[int, torch.Tensor]]  # (adapter slot, rows of the flat batch that use it)


@dataclass
class LowRank:
    A: torch.Tensor  # [R, in]
    B: torch.Tensor  # [out, R], PEFT's scaling folded in


def _fuse(lora: LoraWeights, prefix: str, modules: tuple[str, ...], model: nn.Module) -> LowRank | None:
    """One fused product's update: A's stacked, B's block-diagonal; None when no module is targeted."""
    layers = [model.get_submodule(prefix + m) for m in modules]
    parts = [lora.modules.get(prefix + m) for m in modules]
    if all(p is None for p in parts):
        return None
    ranks = [0 if p is None else p.A.size(0) for p in parts]
    A = torch.cat([p.A for p in parts if p is not None])
    B = torch.zeros(sum(la.out_features for la in layers), sum(ranks))
    row = col = 0
    for layer, p, r in zip(layers, parts, ranks, strict=True):
        if p is not None:
            B[row : row + layer.out_features, col : col + r] = p.B
        row, col = row + layer.out_features, col + r
    return LowRank(A, B)


class AdapterSet:
    """Adapters loaded beside one model, by name, each in a slot the engine's step inputs refer to."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.slots: dict[str, int] = {}
        # per slot: per layer: fused product -> update (absent when the adapter leaves it alone)
        self.weights: dict[int, list[dict[str, LowRank]]] = {}
        self.paths: dict[str, str] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.slots

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def names(self) -> list[str]:
        return sorted(self.slots)

    def _layers(self, lora: LoraWeights) -> list[dict[str, LowRank]]:
        """Per layer: fused product -> its update on the engine's device and dtype."""
        check_fits(lora, self.model)
        outside = sorted(n for n in lora.modules if not n.startswith("model.layers."))
        if outside:
            raise ValueError(_("{path}: batched LoRA covers the transformer layers only, not {modules}").format(
                path=lora.path, modules=outside[:3]))
        layers = []
        for i in range(len(self.model.model.layers)):
            fused = {}
            for key, modules in FUSED.items():
                update = _fuse(lora, f"model.layers.{i}.", modules, self.model)
                if update is not None:
                    fused[key] = LowRank(update.A.to(self.device, self.dtype), update.B.to(self.device, self.dtype))
            layers.append(fused)
        return layers

    @torch.no_grad()
    def refresh(self, name: str, lora: LoraWeights) -> None:
        """New values for a loaded adapter of the same shape (a LoRA being trained), copied into its
        tensors in place: the slot and every address stay as they were."""
        current = self.weights[self.slots[name]]
        fresh = self._layers(lora)
        if [sorted(f) for f in fresh] != [sorted(c) for c in current]:
            raise ValueError(_("adapter {name}: the new weights target other modules than the loaded ones").format(
                name=repr(name)))
        for now, new in zip(current, fresh, strict=True):
            for key, update in new.items():
                now[key].A.copy_(update.A)
                now[key].B.copy_(update.B)

    def add(self, name: str, lora: LoraWeights) -> int:
        """Load `lora` under `name` (replacing an adapter of that name); returns its slot."""
        layers = self._layers(lora)
        self.remove(name)
        slot = next(s for s in range(len(self.slots) + 1) if s not in self.weights)
        self.slots[name], self.weights[slot], self.paths[name] = slot, layers, str(lora.path)
        return slot

    def remove(self, name: str) -> None:
        slot = self.slots.pop(name, None)
        if slot is not None:
            del self.weights[slot]
            del self.paths[name]

    def slot(self, name: str) -> int:
        return self.slots[name]

    def add_to(self, out: torch.Tensor | tuple[torch.Tensor, ...], inp: torch.Tensor, layer: int, product: str,
               groups: Groups) -> None:  # fmt: skip
        """out[rows] += B_a (A_a inp[rows]) for each (slot a, rows) group, in place; `inp` already
        normalised as the product's own input. `out` is the fused product's output, or its modules'
        outputs side by side (q, k, v), each getting its columns of the update. Rows of the base
        model (in no group) are untouched."""
        parts = out if isinstance(out, tuple) else (out,)
        widths = [part.size(-1) for part in parts]
        for slot, rows in groups:
            update = self.weights[slot][layer].get(product)
            if update is None:
                continue
            x = inp.index_select(0, rows).to(self.dtype)
            delta = (x @ update.A.T) @ update.B.T
            for part, columns in zip(parts, delta.split(widths, dim=-1), strict=True):
                part.index_add_(0, rows, columns.to(part.dtype))
