"""What `train rl` is asked to do (`RLOptions`), torch-free so the command line shows its defaults
without loading torch; the stage itself is rl.py (and grpo.py for any model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from portachat.train.config import TrainConfig

if TYPE_CHECKING:
    from portachat.train.lora import LoraOptions


@dataclass
class RLOptions:
    init: str | None = None  # None = this run's sft/latest
    data: list[str] = field(default_factory=list)  # rows with answers (GSM8K, ...); empty = synthetic tasks
    max_prompts: int | None = None  # None: all rows of --data, or 2000 synthetic prompts
    num_samples: int = 8  # G: replies per prompt
    max_new_tokens: int = 64
    temperature: float = 1.0
    normalize_std: bool = False  # divide advantages by the group's reward std (GRPO) or not (Dr. GRPO)
    sample_rounds: int = 4  # rounds of fresh prompts drawn to fill a batch with informative groups (1 = off)
    # Synthetic tasks only: the mix of tasks RL practises. None = probe each task's pass rate first
    # (probe_examples sampled replies per task) and weight it by p(1-p), floored at probe_floor.
    task_weights: dict[str, float] | None = None
    probe_examples: int = 32  # 0 with no task_weights = the curriculum's default mix
    probe_floor: float = 0.02
    lr_scale: float = 0.05  # times the base learning rates (nanochat's RL init_lr_frac)
    warmdown_ratio: float = 1.0  # the lr decays linearly to 0 over the stage (train.warmdown_ratio is not used)
    num_epochs: float = 1.0
    num_iterations: int | None = None
    eval_examples: int = 64
    # GRPO for any model (train.grpo): rewards and the clipped objective; see train.rewards, train.grpo_loss
    rewards: list[str] = field(default_factory=list)  # built-in names or path.py:function
    reward_weights: list[float] | None = None  # one per reward; None = all 1
    beta: float = 0.0  # weight of the k3 KL to the starting model (0: no reference model is kept)
    epsilon: float = 0.2  # the ratio's clip range below 1 (and above, unless epsilon_high)
    epsilon_high: float | None = None  # DAPO's clip-higher
    lr: float | None = None  # AdamW's learning rate for an existing model (None = grpo.GRPO_LR)
    lora: LoraOptions | None = None  # GRPO: train a LoRA adapter instead of every weight
    merge: bool = False  # GRPO with LoRA: also write <stage>/merged/ with the adapter folded in
    resume: str | None = None
    overwrite: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)
