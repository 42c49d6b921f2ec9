"""The optimizers' settings (`OptimConfig`): torch-free, so the command line shows its defaults
without loading torch; the optimizers themselves are in optim.py."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class OptimConfig:
    matrix_lr: float = 0.02  # Muon
    embedding_lr: float = 0.2  # AdamW
    unembedding_lr: float = 0.004  # AdamW
    scalar_lr: float = 0.02  # AdamW, norm gains
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.8, 0.95)

    def scaled(self, factor: float) -> OptimConfig:
        """Every learning rate times `factor` (a stage that starts from trained weights trains gentler)."""
        return replace(self, matrix_lr=self.matrix_lr * factor, embedding_lr=self.embedding_lr * factor,
                       unembedding_lr=self.unembedding_lr * factor, scalar_lr=self.scalar_lr * factor)
