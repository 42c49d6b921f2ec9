"""`--device-batch-size auto` for stages that train a loaded model (fine-tuning full and LoRA, DPO, distillation):
under a simulated memory budget each picks the largest batch whose real step fits, trains with it, and leaves
the model as the probe found it; longer data gives a batch no larger."""

from __future__ import annotations

import json
import re

import pytest
import torch

from portachat.data.chat_loader import longest_chat_row
from portachat.device import DistEnv, get_device
from portachat.device.memory import MemoryStats
from portachat.device.shapes import row_bucket
from portachat.train.base_model import load_base
from portachat.train.distill import DistillHook, DistillOptions, run_distill
from portachat.train.distill_loss import DistillLoss
from portachat.train.dpo import DPOOptions, run_dpo
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.finetune_batch import (
    finetune_peak,
    probe_rows,
    resident_bytes,
    resolve_finetune_batch_size,
)
from portachat.train.hooks import token_loss
from portachat.train.lora import LoraOptions, add_lora
from portachat.train.teacher import InProcessTeacher
from portachat.train.trainer import TrainConfig
from tests.model.hf_families import make_hf_dir
from tests.train.test_dpo import write_prefs
from tests.train.test_lora import TARGETS, write_conversations

BUDGET = 3 * 2**20  # what the simulated device reports as its memory: a few rows of the tiny model fit, not all
ONE = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1)
PROBE = re.compile(r"batch\s+(\d+): peak [\d.,]+ MiB (fits|exceeds)")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("autobatch") / "base"
    make_hf_dir(path, "llama", seed=1)
    return path


@pytest.fixture
def small_device(monkeypatch):
    dev = get_device("cpu", dtype="fp32", compile=False)
    monkeypatch.setattr(dev, "memory", lambda: MemoryStats(None, None, None, None, BUDGET))
    return dev


def picked(lines: list[str], result, most: int) -> int:
    """The batch the run trained with, checked against its probes: the largest that fit, and one more did
    not (or it is `most`, every example the data has)."""
    probes = {int(m[1]): m[2] == "fits" for m in map(PROBE.search, lines) if m}
    batch = json.loads((result.final_checkpoint / "portachat.json").read_text())["train_config"]["device_batch_size"]
    assert probes[batch] and max(b for b, fits in probes.items() if fits) == batch, probes
    assert batch == most or not probes[batch + 1], probes
    return batch


def test_sft_auto_picks_the_largest_batch_the_budget_holds_full_and_lora(tmp_path, base_dir, small_device):
    data = write_conversations(tmp_path / "chat.jsonl", n=8)
    batches = {}
    for mode, lora in (("full", None), ("lora", LoraOptions(rank=4, alpha=8, targets=TARGETS))):
        lines: list[str] = []
        opts = FinetuneOptions(init=str(base_dir), data=[str(data)], num_iterations=1, max_seq_len=32, eval_examples=0,
                               val_conversations=1, lora=lora,
                               train=TrainConfig(run=mode, runs_root=str(tmp_path / "runs"), device_batch_size="auto",
                                                 eval_every=0, log_every=1))
        batches[mode] = picked(lines, run_finetune(opts, dev=small_device, print_fn=lines.append), most=8)
        assert any("rows per device" in line for line in lines)
    # the adapter's gradients and AdamW state are a sliver of the full model's: more rows fit beside them
    assert 1 <= batches["full"] < batches["lora"] <= 8, batches


def test_dpo_auto_counts_pairs_of_rows(tmp_path, base_dir, small_device):
    lines: list[str] = []
    opts = DPOOptions(init=str(base_dir), data=[str(write_prefs(tmp_path / "p.jsonl"))], num_iterations=1, max_seq_len=48,
                      eval_examples=0, lora=LoraOptions(rank=4, alpha=8, targets=TARGETS),
                      train=TrainConfig(run="dpo", runs_root=str(tmp_path / "runs"), device_batch_size="auto",
                                        eval_every=0, log_every=1))
    batch = picked(lines, run_dpo(opts, dev=small_device, print_fn=lines.append), most=22)
    assert 1 <= batch < 22  # 22 training pairs: the budget decided, not the data
    assert any(f"auto: {batch} pairs" in line for line in lines)


def test_distill_auto_probes_with_the_teachers_forward(tmp_path, base_dir, small_device):
    lines: list[str] = []
    opts = DistillOptions(teacher=str(base_dir), student_depth=1, data=[str(write_conversations(tmp_path / "c.jsonl"))],
                          num_iterations=1, max_seq_len=48, loss=DistillLoss(top_k=8), val_conversations=1,
                          train=TrainConfig(run="kd", runs_root=str(tmp_path / "runs"), device_batch_size="auto",
                                            eval_every=0, log_every=1))
    batch = picked(lines, run_distill(opts, dev=small_device, print_fn=lines.append), most=16)
    assert 1 <= batch < 16 and any("the teacher's forward included" in line for line in lines)


def conversations(words: int, n: int = 16) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"question {i}"},
                          {"role": "assistant", "content": " ".join(["fox"] * words)}]} for i in range(n)]


def test_longer_data_gives_a_smaller_or_equal_batch(base_dir):
    dev = get_device("cpu", dtype="fp32", compile=False)
    base = load_base(base_dir, dev)
    cfg = TrainConfig(device_batch_size="auto", max_seq_len=64)
    bucket = row_bucket(dev.type, dev.compile)
    chosen = {}
    for name, words in (("short", 2), ("long", 40)):
        lengths: dict[int, int] = {}
        width = longest_chat_row(conversations(words), base.render, 64, bucket, False, lengths)
        assert len(lengths) == 16  # rendered once, for the loaders too
        said: list[str] = []
        out = resolve_finetune_batch_size(cfg, base.model, dev, ONE, said.append, lambda w=width: w, most=16,
                                          memory_limit=4 * 2**20)
        assert any(f"rows of {width} tokens" in line for line in said)
        chosen[name] = (width, out.device_batch_size)
    assert chosen["short"][0] < chosen["long"][0] == 64
    assert chosen["short"][1] >= chosen["long"][1] >= 1, chosen
    assert chosen["short"][1] > chosen["long"][1], chosen  # at these sizes the activations decide


def test_token_budget_bounds_the_batch_without_a_probe(base_dir):
    dev = get_device("cpu", dtype="fp32", compile=False)
    base = load_base(base_dir, dev)
    said: list[str] = []

    def never() -> int:
        raise AssertionError("probed the rows although --tokens-per-batch bounds them")

    cfg = TrainConfig(device_batch_size="auto", max_seq_len=48, tokens_per_batch=192)
    out = resolve_finetune_batch_size(cfg, base.model, dev, ONE, said.append, never, most=16, memory_limit=BUDGET)
    assert out.device_batch_size == 1 and any("--tokens-per-batch 192" in line for line in said)


def test_the_probe_leaves_the_model_as_it_found_it(base_dir):
    dev = get_device("cpu", dtype="fp32", compile=False)
    base = load_base(base_dir, dev)
    model = base.model
    add_lora(model, LoraOptions(rank=4, alpha=8, targets=TARGETS, dropout=0.1))  # dropout draws random numbers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    for p in model.parameters():  # full fine-tuning: every weight is under AdamW in the probe
        p.requires_grad_(True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    rng = torch.get_rng_state()
    peak = finetune_peak(model, lambda: probe_rows(2, 32, model.config.vocab_size), token_loss, dev, True)
    assert peak > sum(p.numel() * 4 for p in model.parameters()) * 4  # weights, gradients, AdamW's two moments
    assert torch.equal(torch.get_rng_state(), rng) and not model.training
    assert all(p.grad is None for p in model.parameters())
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_the_distillation_probe_counts_the_teacher(base_dir):
    dev = get_device("cpu", dtype="fp32", compile=False)
    teacher = InProcessTeacher(load_base(base_dir, dev).model, "teacher")
    student = load_base(base_dir, dev).model
    rows = lambda: probe_rows(4, 32, student.config.vocab_size)  # noqa: E731
    alone = finetune_peak(student, rows, token_loss, dev, False)
    taught = finetune_peak(student, rows, DistillHook(student, teacher, DistillLoss()), dev, False, [teacher.model])
    assert taught >= alone + resident_bytes(teacher.model)  # its weights stay beside the student's, and it runs


def test_a_cpu_caps_the_positions_of_an_auto_micro_batch(base_dir, monkeypatch):
    from portachat.device import policy

    monkeypatch.setattr(policy, "AUTO_BATCH_CPU_POSITIONS", 128)  # 4 rows of 32 (the real cap: 4,096 positions)
    dev = get_device("cpu", dtype="fp32", compile=False)
    model = load_base(base_dir, dev).model
    said: list[str] = []
    cfg = TrainConfig(device_batch_size="auto", max_seq_len=32)
    out = resolve_finetune_batch_size(cfg, model, dev, ONE, said.append, lambda: 32, most=16, memory_limit=2**30)
    assert out.device_batch_size == 4 and any("at most 4 on a cpu" in line for line in said)
    probed = [int(m[1]) for m in map(PROBE.search, said) if m]
    assert max(probed) == 4  # memory would hold all 16: the cap, not a failed probe, stopped the search
