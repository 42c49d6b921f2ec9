"""The Trainer on two real gloo processes: DDP and FSDP2 give one process's losses for the same global
batch, and a checkpoint saved by two sharded processes resumes on one with the same next-step loss."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from portachat.device import dist_env, get_device
from portachat.model import GPT, GPTConfig
from portachat.tokenizer import Tokenizer
from portachat.train.trainer import Stage, TrainConfig, train

B, T, STEPS = 2, 16, 4


class RandomStream:
    """Seeded random tokens, one sequence of batches per stream index (so streams are resumable)."""

    def __init__(self, vocab: int, stream: int) -> None:
        self.vocab, self.stream, self.pos = vocab, stream, 0

    def next_batch(self):
        g = torch.Generator().manual_seed(1000 * self.stream + self.pos)
        rows = torch.randint(0, self.vocab, (B, T + 1), generator=g)
        self.pos += 1
        return rows[:, :-1], rows[:, 1:]

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def _run(tok_dir: Path, stage_path: Path, fsdp: str, num_iterations: int, save_every: int = 0,
         resume_from: Path | None = None) -> list[str]:
    """Two streams per step (2 ranks x 1, or 1 rank x 2 accumulated): the same global batch either way."""
    tokenizer = Tokenizer.load(tok_dir)
    cfg = GPTConfig(vocab_size=384, n_layer=2, n_embd=64, n_head=2, n_kv_head=2, head_dim=32, intermediate_size=128,
                    max_seq_len=T)
    torch.manual_seed(0)
    model = GPT(cfg)
    model.init_weights(seed=0)
    stage = Stage(make_stream=lambda s, n: RandomStream(tokenizer.vocab_size, s))
    tc = TrainConfig(device_batch_size=B, max_seq_len=T, total_batch_size=2 * B * T, num_iterations=num_iterations,
                     eval_every=0, log_every=1, save_every=save_every, keep_last=0, muon_momentum_warmup=2, fsdp=fsdp)
    lines: list[str] = []
    train(model, tokenizer, stage, tc, get_device("cpu", dtype="fp32"), dist_env(), stage_path,
          resume_from=resume_from, print_fn=lines.append)
    return lines


def _losses(stage_path: Path) -> dict[int, float]:
    out = {}
    for line in (stage_path / "log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, tok_dir: str, stage_path: str, fsdp: str, outputs) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PORTACHAT_DEVICE="cpu")
    torch.set_num_threads(1)
    from portachat.device import destroy_distributed, get_device, init_distributed

    init_distributed(get_device("cpu"), timeout_s=120)
    try:
        outputs[rank] = _run(Path(tok_dir), Path(stage_path), fsdp, STEPS, save_every=STEPS - 1)
    finally:
        destroy_distributed()


def _two_processes(tok_dir: Path, stage_path: Path, fsdp: str) -> list[str]:
    outputs = mp.Manager().dict()
    mp.spawn(_worker, args=(2, _free_port(), str(tok_dir), str(stage_path), fsdp, outputs), nprocs=2, join=True)
    return outputs[0]


@pytest.mark.slow
def test_ddp_and_fsdp2_match_one_process_and_fsdp2_resumes_on_one(small_tokenizer, tmp_path):
    tok_dir = tmp_path / "tok"
    small_tokenizer.save(tok_dir)
    torch.set_num_threads(2)

    _run(tok_dir, tmp_path / "single", "auto", STEPS)
    ddp_lines = _two_processes(tok_dir, tmp_path / "ddp", "off")
    fsdp_lines = _two_processes(tok_dir, tmp_path / "fsdp", "on")

    single, ddp, fsdp = (_losses(tmp_path / name) for name in ("single", "ddp", "fsdp"))
    assert sorted(single) == sorted(ddp) == sorted(fsdp) == list(range(1, STEPS + 1))
    assert any("weights identical on all 2 ranks" in x for x in ddp_lines)
    assert single[STEPS] < single[1]  # it learns something
    for step in single:
        assert ddp[step] == pytest.approx(single[step], abs=1e-5), (step, single, ddp)
        assert fsdp[step] == pytest.approx(ddp[step], abs=1e-5), (step, ddp, fsdp)
    for name in ("ddp", "fsdp"):
        meta = json.loads((tmp_path / name / f"step_{STEPS:06d}" / "portachat.json").read_text())
        assert meta["world_size"] == 2 and meta["parallel"] == {"ddp": "ddp", "fsdp": "fsdp2"}[name]
        assert sorted(p.name for p in (tmp_path / name / f"step_{STEPS:06d}" / "trainer_state").glob("rank*")) == [
            "rank0.safetensors", "rank1.safetensors"]

    # The sharded checkpoint holds whole tensors: same weights as DDP's, loadable by a plain model.
    from safetensors.torch import load_file

    wd = load_file(str(tmp_path / "ddp" / f"step_{STEPS:06d}" / "model.safetensors"))
    wf = load_file(str(tmp_path / "fsdp" / f"step_{STEPS:06d}" / "model.safetensors"))
    assert wd.keys() == wf.keys()
    for name in wd:
        assert wd[name].shape == wf[name].shape and torch.allclose(wd[name], wf[name], atol=1e-5), name

    # Saved by 2 FSDP2 processes at step 3, resumed by 1 process: the same step-4 loss.
    resumed = tmp_path / "resumed"
    _run(tok_dir, resumed, "auto", STEPS, resume_from=tmp_path / "fsdp" / f"step_{STEPS - 1:06d}")
    again = _losses(resumed)
    assert sorted(again) == [STEPS]
    assert again[STEPS] == pytest.approx(fsdp[STEPS], abs=1e-5), (again, fsdp)
    assert fsdp_lines  # rank 0 reported


def test_fsdp_flag_and_the_estimator_decide_the_layout():
    from portachat.train.parallel import decide_parallel, replicated_peak_bytes

    assert decide_parallel("on", 1, 0, None) == decide_parallel("auto", 1, 0, None) == "single"
    assert decide_parallel("on", 2, 0, None) == "fsdp2" and decide_parallel("off", 2, 10**15, 1) == "ddp"
    assert decide_parallel("auto", 2, 10**9, None) == "ddp"  # memory unknown: replicate
    with pytest.raises(ValueError, match="--fsdp"):
        decide_parallel("zero3", 2, 0, None)
    gib = 2**30
    d26 = replicated_peak_bytes(GPTConfig.from_depth(26, vocab_size=65536, max_seq_len=2048), 8, 2048,
                                torch.bfloat16, 8)
    tiny = replicated_peak_bytes(GPTConfig.from_depth(2, vocab_size=384, max_seq_len=64), 2, 64, torch.float32, 2)
    assert d26 > 16 * gib > tiny  # a d26 replica (~1B parameters with Muon + AdamW) does not fit a 16 GiB card
    assert decide_parallel("auto", 8, d26, 16 * gib) == "fsdp2"
    assert decide_parallel("auto", 8, d26, 80 * gib) == "ddp"
    assert decide_parallel("auto", 2, tiny, 16 * gib) == "ddp"
