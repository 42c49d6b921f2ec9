"""`train dpo` on tiny Hugging Face models: LoRA (the reference is the adapter switched off) and full
(cached reference log-probs) runs log TRL's metrics and learn the preference; the loss and rewards equal
TRL's DPOTrainer on the same model and pairs (fp32); 2 torchrun processes with FSDP2 match one process."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from portachat.data.preference_data import pair_rows, pairs_to_batch, row_to_pair
from portachat.device import get_device
from portachat.train.base_model import load_base, pad_id
from portachat.train.dpo import DPOOptions, PreferenceObjective, reference_logps, run_dpo
from portachat.train.lora import LoraOptions, adapters_disabled, add_lora
from portachat.train.preference_loss import PreferenceMetrics, sequence_logps
from portachat.train.trainer import TrainConfig, TrainingError
from tests.e2e.helpers import cli_env, run_cli, step_losses
from tests.model.hf_families import make_hf_dir

METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")


def preference_rows(n: int = 24) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"hello, how are you {i}?"}],
             "chosen": [{"role": "assistant", "content": f"the quick brown fox {i % 3}"}],
             "rejected": [{"role": "assistant", "content": "lazy dog " * (1 + i % 2)}]} for i in range(n)]


def write_prefs(path, n: int = 24):
    path.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(n)), encoding="utf-8")
    return path


def records(ckpt) -> list[dict]:
    return [json.loads(line) for line in (ckpt.parent / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_dpo_learns_the_preference_and_logs_trls_metrics(tmp_path, mode):
    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=1)
    lora = LoraOptions(rank=4, alpha=8.0, targets=["q_proj", "v_proj"]) if mode == "lora" else None
    opts = DPOOptions(init=str(base), data=[str(write_prefs(tmp_path / "p.jsonl"))], num_iterations=4, max_seq_len=48,
                      lr=3e-3 if lora else 1e-3, lora=lora, eval_examples=0,
                      train=TrainConfig(run=mode, runs_root=str(tmp_path / "runs"), device_batch_size=4, eval_every=4,
                                        log_every=1, warmdown_ratio=0.0))
    result = run_dpo(opts, dev=get_device("cpu", dtype="fp32", compile=False), print_fn=lambda _m: None)
    log = records(result.final_checkpoint)
    steps = {r["step"]: r for r in log if "loss" in r and "lr_mult" in r}
    assert sorted(steps) == [1, 2, 3, 4]
    assert steps[1]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # the policy starts as its reference
    assert steps[1]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    assert all(name in steps[4] for name in METRICS)
    assert steps[4]["loss"] < steps[1]["loss"] - 0.05 and steps[4]["rewards/margins"] > 0.05
    held_out = {r["step"]: r for r in log if "eval/rewards/accuracies" in r}
    assert held_out[0]["eval/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert held_out[4]["eval/rewards/margins"] > held_out[0]["eval/rewards/margins"]
    meta = json.loads((result.final_checkpoint / "portachat.json").read_text())
    assert meta["preference"] == {"loss": "dpo", "beta": 0.1, "gamma": 0.5,
                                  "reference": "live" if lora else "cache"}
    kept = {p.name for p in result.final_checkpoint.iterdir()}
    assert ("adapter_model.safetensors" in kept) == (mode == "lora")


def test_the_lora_reference_is_the_same_weights_with_the_adapter_off(tmp_path):
    base_dir = tmp_path / "base"
    make_hf_dir(base_dir, "qwen2", seed=2)
    dev = get_device("cpu", dtype="fp32", compile=False)
    base = load_base(base_dir, dev)
    pairs = [row_to_pair(r) for r in preference_rows(4)]
    before = reference_logps(base.model, pairs, base, 48, 2, dev, lambda n, _m: n)
    add_lora(base.model, LoraOptions(rank=4, alpha=8.0, targets=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in base.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)  # a trained adapter changes the model...
    rows = [pair_rows(p, base.render, base.prompt, 49) for p in pairs]
    batch = pairs_to_batch(rows, pad_id(base.tokenizer), 48)
    with torch.no_grad():
        on, _n = sequence_logps(base.model, batch)
        with adapters_disabled(base.model):
            off, _n = sequence_logps(base.model, batch)
    assert (on - off).abs().max() > 1e-2
    torch.testing.assert_close(off, before.t().reshape(-1), atol=1e-4, rtol=0)  # ...switched off it is the base
    assert all(p.requires_grad for n, p in base.model.named_parameters() if "lora_" in n)


def test_bad_options_are_refused_before_loading(tmp_path):
    with pytest.raises(TrainingError, match="train prefs"):
        run_dpo(DPOOptions(init=str(tmp_path)), dev=get_device("cpu", dtype="fp32", compile=False))
    with pytest.raises(TrainingError, match="--loss"):
        run_dpo(DPOOptions(init=str(tmp_path), loss="kto", data=["x"]))


@pytest.mark.slow
def test_loss_and_rewards_equal_trls_dpo_trainer(tmp_path):
    """TRL's own DPOTrainer (its tokenization, collator and loss) against ours on the same pairs, with a
    reference that differs from the policy, in fp32: sigmoid DPO and IPO."""
    import datasets
    import transformers
    from trl import DPOConfig, DPOTrainer

    make_hf_dir(tmp_path / "policy", "llama", seed=1)
    make_hf_dir(tmp_path / "reference", "llama", seed=2)
    rows = preference_rows(4)
    dev = get_device("cpu", dtype="fp32", compile=False)
    base = load_base(tmp_path / "policy", dev)
    ref_model = load_base(tmp_path / "reference", dev).model
    pairs = [row_to_pair(r) for r in rows]
    ours_rows = [pair_rows(p, base.render, base.prompt, 129) for p in pairs]
    ref = reference_logps(ref_model, pairs, base, 128, 4, dev, lambda n, _m: n)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "policy"))
    for loss_type, kind in (("sigmoid", "dpo"), ("ipo", "ipo")):
        policy = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "policy"), dtype=torch.float32)
        reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "reference"), dtype=torch.float32)
        cfg = DPOConfig(output_dir=str(tmp_path / "out"), beta=0.1, loss_type=[loss_type], per_device_train_batch_size=4,
                        report_to=[], use_cpu=True, bf16=False, fp16=False, max_length=None)
        trainer = DPOTrainer(model=policy, ref_model=reference, args=cfg, processing_class=tok,
                             train_dataset=datasets.Dataset.from_list(rows))
        for i, ((cids, cmask), (rids, rmask)) in enumerate(ours_rows):  # the same tokens, the same completion
            ex = trainer.train_dataset[i]
            assert cids == ex["prompt_ids"] + ex["chosen_ids"] and rids == ex["prompt_ids"] + ex["rejected_ids"]
            assert sum(cmask) == len(ex["chosen_ids"]) and sum(rmask) == len(ex["rejected_ids"])
        trainer.model.train()
        want = trainer.compute_loss(trainer.model, trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
        logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}

        metrics = PreferenceMetrics(torch.device("cpu"), torch.float64)
        objective = PreferenceObjective(kind, 0.1, 0.5, base.model, metrics)
        batch = pairs_to_batch(ours_rows, pad_id(base.tokenizer), 128, lambda n, _m: n, range(4),
                               ref.t().reshape(-1)).to(dev.torch_device)
        got = objective(base.model, batch) / batch.num_pairs
        assert got.item() == pytest.approx(want.item(), abs=1e-4), loss_type
        ours = metrics.read()
        for name in METRICS:
            assert ours[name] == pytest.approx(logged[name], abs=1e-4, rel=1e-6), (loss_type, name)


def one_process_and_fsdp2(tmp_path, steps: int, *extra: str):
    """The same DPO run in one process (run "single") and under torchrun with FSDP2 (run "fsdp"); the home."""
    base = tmp_path / "base"
    make_hf_dir(base, "llama", seed=3)
    data = write_prefs(tmp_path / "p.jsonl", 16)
    home = tmp_path / "home"
    common = ["train", "dpo", "--init", str(base), "--data", str(data), "--device", "cpu", "--dtype", "fp32",
              "--compile", "0", "--max-seq-len", "48", "--device-batch-size", "2", "--num-iterations", str(steps),
              "--eval-every", "0", "--eval-examples", "0", "--lr", "1e-3", "--total-batch-size", str(2 * 48 * 2),
              "--no-activation-checkpointing", *extra]
    single = run_cli([*common, "--run-name", "single"], home, threads=1)
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-3000:]
    sharded = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              "-m", "portachat", *common, "--fsdp", "on", "--run-name", "fsdp"],
                             env=cli_env(home, threads=1), capture_output=True, text=True, timeout=600)
    assert sharded.returncode == 0, sharded.stdout[-3000:] + sharded.stderr[-3000:]
    return home


@pytest.mark.slow
def test_torchrun_two_processes_with_fsdp2_match_one_process(tmp_path):
    home = one_process_and_fsdp2(tmp_path, 3)
    assert "fsdp" in json.loads((home / "runs" / "fsdp" / "dpo" / "step_000003" / "portachat.json").read_text())["parallel"]
    a = step_losses(home / "runs" / "single" / "dpo" / "log.jsonl")
    b = step_losses(home / "runs" / "fsdp" / "dpo" / "log.jsonl")
    assert sorted(a) == sorted(b) == [1, 2, 3]
    assert a[1] == pytest.approx(math.log(2), abs=1e-5) and a[3] < a[1]
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-4), (step, a[step], b[step])


@pytest.mark.slow
def test_torchrun_lora_with_fsdp2_saves_the_whole_adapter(tmp_path):
    """Under FSDP2 every rank holds a shard of each adapter matrix: the saved adapter must be the whole one,
    equal to a one-process run's, and --merge must fold it into the whole base."""
    home = one_process_and_fsdp2(tmp_path, 2, "--lora-rank", "4", "--merge")
    one = load_file(str(home / "runs" / "single" / "dpo" / "step_000002" / "adapter_model.safetensors"))
    two = load_file(str(home / "runs" / "fsdp" / "dpo" / "step_000002" / "adapter_model.safetensors"))
    assert sorted(one) == sorted(two) and one
    for name in one:
        assert two[name].shape == one[name].shape, name
        torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)
    merged_one = load_file(str(home / "runs" / "single" / "dpo" / "merged" / "model.safetensors"))
    merged_two = load_file(str(home / "runs" / "fsdp" / "dpo" / "merged" / "model.safetensors"))
    for name in merged_one:
        torch.testing.assert_close(merged_two[name], merged_one[name], atol=1e-4, rtol=1e-3)
