"""Gradients of one fixed set of masked conversations, computed through the Trainer however the rows
are split: micro-batches per rank x ranks. Used in process and by a torchrun worker (run as a script)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from portachat.data.batch import Batch
from portachat.device import dist_env, get_device, init_distributed
from portachat.model import GPT, GPTConfig
from portachat.train.trainer import Stage, TrainConfig, Trainer

ROWS, SEQ, VOCAB = 4, 16, 128
SUPERVISED = (2, 15, 5, 9)  # supervised tokens per row: very unequal, so per-micro-batch means would be wrong


def conversations() -> Batch:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1), generator=g)
    targets = tokens[:, 1:].clone()
    for r, keep in enumerate(SUPERVISED):
        targets[r, : SEQ - keep] = -1  # like a prompt: only the tail is trained on
    return Batch(tokens[:, :-1].contiguous(), targets)


def tiny_model() -> GPT:
    cfg = GPTConfig(vocab_size=VOCAB, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                    intermediate_size=64, max_seq_len=SEQ)
    model = GPT(cfg)
    model.init_weights(seed=1)
    return model


class _Unused:
    def next_batch(self):  # the test feeds micro-batches itself
        raise AssertionError("not read")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def masked_gradients(rows_per_micro: int, tokenizer, stage_path: Path) -> dict[str, torch.Tensor]:
    """This rank's gradient after one forward_backward over its share of the rows."""
    dev = get_device("cpu", dtype="fp32", compile=False)
    env = init_distributed(dev)
    micro_per_rank = ROWS // (rows_per_micro * env.world_size)
    cfg = TrainConfig(device_batch_size=rows_per_micro, max_seq_len=SEQ,
                      total_batch_size=ROWS * SEQ, num_iterations=1)
    model = tiny_model()
    trainer = Trainer(model, tokenizer, Stage(make_stream=lambda s, n: _Unused()), cfg, dev, env, stage_path,
                      print_fn=lambda _m: None)
    trainer.setup()
    batch = conversations()
    first = env.rank * micro_per_rank * rows_per_micro
    micro = [
        Batch(batch.inputs[i : i + rows_per_micro], batch.targets[i : i + rows_per_micro])
        for i in range(first, first + micro_per_rank * rows_per_micro, rows_per_micro)
    ]
    stats = trainer.forward_backward(micro)
    assert stats.tokens == sum(SUPERVISED), stats
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


if __name__ == "__main__":  # torchrun worker: python masked_grad.py TOKENIZER_DIR OUT_FILE
    from safetensors.torch import save_file

    from portachat.tokenizer import Tokenizer

    tok = Tokenizer.load(sys.argv[1])
    grads = masked_gradients(1, tok, Path(sys.argv[2]).parent / "stage")
    if dist_env().rank == 0:
        save_file(grads, sys.argv[2])
    torch.distributed.destroy_process_group()
