"""Training defaults the command line shows in `--help`, in a torch-free home (the stages that use
them import them from here), so `portachat train ... --help` answers without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

# The stage a stage starts from when --init is not given: this run's previous stage, at its latest checkpoint.
PREVIOUS_STAGE = {"mid": "base", "sft": "mid", "rl": "sft"}

# AdamW learning rates for fine-tuning an existing model: all weights, or a LoRA adapter.
FULL_LR = 2e-5
LORA_LR = 2e-4


@dataclass(frozen=True)
class StageDefaults:
    lr_scale: float  # times the optimizer's base learning rates (nanochat's init_lr_frac)
    warmdown_ratio: float
    pack: bool
    synthetic_conversations: int


STAGE_DEFAULTS = {
    # No lr warmup and no Muon momentum ramp: these stages start from trained weights.
    "mid": StageDefaults(lr_scale=1.0, warmdown_ratio=0.2, pack=True, synthetic_conversations=20_000),
    "sft": StageDefaults(lr_scale=0.1, warmdown_ratio=1.0, pack=False, synthetic_conversations=5_000),
}
