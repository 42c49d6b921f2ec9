"""What a training stage is asked to do (TrainConfig) and what it gives back (TrainResult)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from portachat.train.accumulation import grad_accum_steps
from portachat.train.optim_config import OptimConfig


@dataclass(frozen=True)
class TrainConfig:
    """Frozen: a stage derives its own with dataclasses.replace, never changing the one it was given."""

    run: str = "default"
    stage: str = "base"
    runs_root: str | None = None  # default <PORTACHAT_HOME>/runs
    device_batch_size: int | str = 4  # "auto": resolve_device_batch_size() finds it once the model exists
    tokens_per_batch: int | None = None  # chat stages: rows per micro-batch drawn by this many padded positions
    total_batch_size: int | None = None  # tokens per optimizer step; None = one micro-batch per rank
    max_seq_len: int = 256
    num_iterations: int = 100
    warmup_ratio: float = 0.0
    warmdown_ratio: float = 0.2
    final_lr_frac: float = 0.0
    muon_momentum_warmup: int = 300  # steps; 0 = full momentum from the start (a stage that starts from trained weights)
    grad_clip: float = 1.0  # 0 disables clipping
    eval_every: int = 100
    eval_tokens: int = 65536
    sample_every: int = 0  # 0 = with every evaluation
    sample_tokens: int = 48
    save_every: int = 0  # 0 = only at the end
    keep_last: int = 2
    log_every: int = 10
    seed: int = 42
    max_bad_steps: int = 5
    fsdp: str = "auto"  # shard with FSDP2: "on", "off", or "auto" = when a replica would not fit in memory
    activation_checkpointing: bool = False  # recompute each block's activations in backward (less memory)
    telemetry_every_s: float = 5.0  # background device sampling (memory, utilisation, temperature, power)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def micro_batch_tokens(self) -> int:
        """Positions one micro-batch holds at most: the token budget, or device batch x sequence."""
        return self.tokens_per_batch or self.device_batch_size * self.max_seq_len

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step (train/accumulation.py's rule)."""
        return grad_accum_steps(self.total_batch_size, self.device_batch_size, self.max_seq_len, world_size,
                                self.tokens_per_batch)


@dataclass
class TrainResult:
    final_checkpoint: Path | None
    steps: int
    val_bpb: float | None
    samples: list[str]
    metrics: dict[str, float] = field(default_factory=dict)


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as JSON-ready values (a checkpoint's meta records it)."""
    d = asdict(cfg)
    d["optim"]["adam_betas"] = list(cfg.optim.adam_betas)
    return d
