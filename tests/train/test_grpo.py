"""`portachat train rl --init MODEL --data prompts.jsonl --reward ...`: GRPO on an existing model. The
reward rises on a tiny task (replies made of the lower half of the vocabulary, scored by a user
function in TRL's signature); 2 torchrun workers with FSDP2 run it too; --help in both languages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from portachat.cli import build_parser
from portachat.device import get_device
from portachat.model.load import load_for_inference
from portachat.train.grpo import run_grpo, wants_grpo
from portachat.train.rl import RLOptions
from portachat.train.trainer import TrainConfig, TrainingError
from tests.e2e.helpers import cli_env, run_cli
from tests.model.hf_families import make_hf_dir

REWARD = '''
def low_ids(prompts, completions, completion_ids, **kwargs):
    """The share of the reply's tokens from the lower half of the 320-token vocabulary."""
    assert len(kwargs["topic"]) == len(completions)  # dataset columns arrive as TRL passes them
    return [sum(t < 160 for t in ids) / max(len(ids), 1) for ids in completion_ids]
'''


def tiny_task(root):
    make_hf_dir(root / "base", "llama", seed=1)
    with (root / "prompts.jsonl").open("w", encoding="utf-8") as f:
        for i in range(24):  # conversational and plain prompts, with a column for the reward
            row = {"prompt": [{"role": "user", "content": f"hello {i}"}]} if i % 2 else {"prompt": f"the quick {i}"}
            f.write(json.dumps({**row, "topic": f"t{i % 3}"}) + "\n")
    (root / "rewards.py").write_text(REWARD, encoding="utf-8")
    return root / "base", root / "prompts.jsonl", f"{root / 'rewards.py'}:low_ids"


def test_flags_reach_the_options_and_bad_setups_fail_clearly(tmp_path):
    args = build_parser().parse_args(["train", "rl", "--init", "m", "--data", "p.jsonl", "--reward", "gsm8k",
                                      "--reward", "length:64", "--reward-weights", "1,0.5", "--beta", "0.04",
                                      "--epsilon-high", "0.28", "--lr", "2e-6"])
    assert args.reward == ["gsm8k", "length:64"] and args.reward_weights == [1.0, 0.5]
    assert (args.beta, args.epsilon, args.epsilon_high, args.lr) == (0.04, 0.2, 0.28, 2e-6)
    base = tmp_path / "base"
    make_hf_dir(base, "qwen3")
    with pytest.raises(TrainingError, match="existing model, not a portachat checkpoint.*--reward"):
        wants_grpo(str(base), [])
    assert wants_grpo(str(base), ["gsm8k"]) and not wants_grpo(None, [])
    with pytest.raises(TrainingError, match="at least one --reward"):
        run_grpo(RLOptions(init="m", data=["p.jsonl"]), dev=get_device("cpu", dtype="fp32", compile=False))
    with pytest.raises(TrainingError, match="multiple of --num-samples"):
        run_grpo(RLOptions(init="m", data=["p.jsonl"], rewards=["gsm8k"], num_samples=4,
                           train=TrainConfig(device_batch_size=6)), dev=get_device("cpu", dtype="fp32", compile=False))


def test_help_in_english_and_chinese(monkeypatch, capsys):
    for lang, expect in (("en", "GRPO for any model"), ("zh", "任意模型的 GRPO")):
        monkeypatch.setenv("PORTACHAT_LANG", lang)
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["train", "rl", "--help"])
        assert exit_info.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert expect in text and "--reward-weights" in text and "path.py:function" in text


def test_grpo_on_our_own_checkpoint_runs_and_resumes(small_tokenizer, tmp_path):
    """--init one of our checkpoints: our tokenizer and chat format (calculator on), a built-in reward."""
    from portachat.checkpoint import save_checkpoint
    from tests.train.test_rl import tiny_model

    ckpt = save_checkpoint(tmp_path / "sft", 3, tiny_model(small_tokenizer), small_tokenizer, {"stage": "sft"})
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1?"}],
                                        "answer": str(i + 1)}) + "\n" for i in range(8)))
    dev = get_device("cpu", dtype="fp32", compile=False)

    def opts(steps: int, resume: str | None = None) -> RLOptions:
        return RLOptions(init=str(ckpt), data=[str(data)], rewards=["synthetic", "length:4"], num_samples=2,
                         max_new_tokens=6, num_iterations=steps, eval_examples=0, lr=1e-3, resume=resume,
                         train=TrainConfig(run="ours", runs_root=str(tmp_path / "runs"), device_batch_size=4,
                                           eval_every=0, log_every=1))

    first = run_grpo(opts(1), dev=dev, print_fn=lambda _m: None)
    meta = json.loads((first.final_checkpoint / "portachat.json").read_text())
    assert meta["stage"] == "rl" and meta["grpo"]["rewards"] == ["synthetic", "length:4"]
    resumed = run_grpo(opts(2, resume="auto"), dev=dev, print_fn=lambda _m: None)
    assert resumed.steps == 2
    records = [json.loads(line) for line in (first.final_checkpoint.parent / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0.0 <= r["reward/synthetic"] <= 1.0 and -1.0 <= r["reward/length:4"] <= 0.0 for r in steps)


@pytest.mark.slow
def test_reward_rises_on_a_tiny_task(tmp_path):
    base, data, reward = tiny_task(tmp_path)
    home = tmp_path / "home"
    out = run_cli(["train", "rl", "--init", str(base), "--data", str(data), "--reward", reward, "--device", "cpu",
                   "--dtype", "fp32", "--compile", "0", "--num-samples", "4", "--device-batch-size", "8",
                   "--max-new-tokens", "8", "--num-iterations", "12", "--lr", "5e-2", "--eval-every", "12",
                   "--eval-examples", "4", "--log-every", "1", "--run-name", "grpo"], home)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    records = [json.loads(line) for line in (home / "runs" / "grpo" / "rl" / "log.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in records if "reward" in r]
    assert len(rewards) == 12 and all(r["kv_freed_bytes"] > 0 for r in records if "reward" in r)
    assert sum(rewards[-3:]) / 3 > sum(rewards[:2]) / 2 + 0.25, rewards
    heldout = [r["eval/heldout_reward"] for r in records if "eval/heldout_reward" in r]
    assert len(heldout) == 2 and heldout[1] > heldout[0] + 0.2, heldout  # before -> after, greedy
    final = home / "runs" / "grpo" / "rl" / "step_000012"
    trained = load_for_inference(final, device="cpu", dtype=torch.float32).model  # an HF directory again
    assert trained.config.vocab_size == 320


@pytest.mark.slow
def test_torchrun_two_gloo_workers_with_fsdp2(tmp_path):
    base, data, reward = tiny_task(tmp_path)
    home = tmp_path / "home"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "portachat", "train", "rl", "--init", str(base), "--data", str(data), "--reward",
                          reward, "--device", "cpu", "--dtype", "fp32", "--compile", "0", "--fsdp", "on",
                          "--num-samples", "2", "--device-batch-size", "4", "--max-new-tokens", "6",
                          "--num-iterations", "3", "--lr", "5e-2", "--eval-every", "3", "--eval-examples", "3",
                          "--log-every", "1", "--run-name", "fsdp"],
                         env=cli_env(home, threads=1), capture_output=True, text=True, timeout=600, cwd=os.getcwd())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    stage = home / "runs" / "fsdp" / "rl"
    meta = json.loads((stage / "step_000003" / "portachat.json").read_text())
    assert meta["parallel"] == "fsdp2" and meta["world_size"] == 2 and meta["step"] == 3
    records = [json.loads(line) for line in (stage / "log.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in records if "reward" in r) == [1, 2, 3]
    assert all("reward/low_ids" in r for r in records if "reward" in r)  # summed over both ranks
    before = load_for_inference(base, device="cpu", dtype=torch.float32).model.state_dict()
    after = load_for_inference(stage / "step_000003", device="cpu", dtype=torch.float32).model.state_dict()
    assert any(not torch.allclose(after[k], before[k]) for k in after)
