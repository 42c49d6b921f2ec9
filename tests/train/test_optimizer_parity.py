"""The batch-size finder and the profiler measure the optimizer the Trainer trains with: the same
classes, the same fused/foreach choice and the same Newton-Schulz dtype (the device's one rule), here
on a CPU computing in bf16, where the Trainer once picked bf16 and the tools fp32."""

from __future__ import annotations

import torch

from portachat.device import DistEnv, get_device, reset_device_cache
from portachat.model import GPT, GPTConfig
from portachat.train import optim
from portachat.train.batch_size import measure_training_peak
from portachat.train.profile import profile_training
from portachat.train.trainer import Stage, TrainConfig, Trainer

CFG = GPTConfig(vocab_size=128, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64,
                max_seq_len=16)


def describe(optimizers: list[torch.optim.Optimizer]) -> list[tuple]:
    return [(type(o), getattr(o, "ns_dtype", None), o.defaults.get("fused"), o.defaults.get("foreach"))
            for o in optimizers]


class Tokens:
    def next_batch(self):
        rows = torch.randint(0, CFG.vocab_size, (1, 17))
        return rows[:, :-1], rows[:, 1:]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_finder_and_profiler_build_the_trainers_optimizer(tmp_path, monkeypatch):
    monkeypatch.delenv("PORTACHAT_DTYPE", raising=False)
    reset_device_cache()
    torch.set_num_threads(1)
    dev = get_device("cpu", dtype="bf16", compile=False)
    built: list[list[tuple]] = []
    real = optim.build_optimizers

    def spy(*args, **kwargs):
        made = real(*args, **kwargs)
        built.append(describe(made))
        return made

    monkeypatch.setattr(optim, "build_optimizers", spy)
    model = GPT(CFG)
    model.init_weights(seed=0)
    cfg = TrainConfig(device_batch_size=1, max_seq_len=16, total_batch_size=16, num_iterations=1, eval_every=0)
    trainer = Trainer(model, None, Stage(make_stream=lambda s, n: Tokens()), cfg, dev,
                      DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1), tmp_path / "stage",
                      print_fn=lambda _m: None)
    trainer.setup()
    trainers = describe(trainer.optimizers)
    measure_training_peak(CFG, 1, 16, dev, steps=1)
    profile_training(CFG, dev, tmp_path / "profile", batch_size=1, seq_len=16, steps=1, warmup=0)
    assert built[0] == trainers, "the Trainer built its optimizers elsewhere"
    assert len(built) == 3 and built[1] == trainers and built[2] == trainers, (trainers, built)
    assert dict((t, d) for t, d, _f, _e in trainers)[optim.Muon] == dev.newton_schulz_dtype
