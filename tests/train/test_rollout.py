"""GRPO's rollouts in the training process: after an optimizer step the engine's log-probabilities are
the trained model's (fp32) without a reload, on the weights themselves, on the CPU's frozen fp32 copy
(the engine's fused forward) and on an inference copy, refreshed in place; a prompt's G replies share its KV blocks; the KV cache is given back while the
trainer runs the backward."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.data.prompt_data import load_prompts
from portachat.device import get_device
from portachat.engine.kv_sleep import kv_cache_bytes
from portachat.engine.oneshot import TokenIdsOnly
from portachat.engine.packed_forward import PackedModel
from portachat.engine.scoring import teacher_forced_logprobs
from portachat.model import GPT, GPTConfig
from portachat.ops.cpu_linear import fused_forward_available
from portachat.train import rollout as rollout_module
from portachat.train.base_model import load_base
from portachat.train.collectives import SINGLE_PROCESS
from portachat.train.grpo import GroupScorer, GroupStream
from portachat.train.grpo_loss import GRPOLoss
from portachat.train.rewards import Rewards
from portachat.train.rl import RLOptions, RolloutStats
from portachat.train.rollout import Rollout
from tests.model.hf_families import make_hf_dir

CPU = get_device("cpu", dtype="fp32", compile=False)


def trainable_gpt() -> GPT:
    model = GPT(GPTConfig(vocab_size=96, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                          intermediate_size=128, max_seq_len=128))
    model.init_weights(seed=4)
    return model.train()


def model_logprobs(model: GPT, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]])).float()
    return torch.log_softmax(logits, -1)[0].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


@pytest.mark.parametrize("weights", ["cpu-fused-copy", "same-weights", "inference-copy"])
def test_engine_follows_the_optimizer_without_a_reload(weights, monkeypatch):
    if weights == "same-weights":  # a device that decides no copy
        monkeypatch.setattr(rollout_module, "rollout_engine_dtype", lambda dev: None)
    if weights == "inference-copy":  # what an accelerator does (a bf16 copy), here in fp32 so the logits
        # compare exactly, and without the CPU's fused forward (accelerators have none)
        monkeypatch.setattr(PackedModel, "build", classmethod(lambda cls, model: None))
    model = trainable_gpt()
    rollout = Rollout(model, TokenIdsOnly(96), CPU, max_num_seqs=4, max_model_len=64)
    prompt = list(range(3, 23))
    rollout.sample_groups([prompt], 2, 6, 1.0, seed=0)
    engine = rollout.engine()
    assert (engine.model is model) == (weights == "same-weights")
    if weights == "cpu-fused-copy" and fused_forward_available("cpu", torch.float32):
        assert engine.runner.packed is not None  # the frozen copy takes the fused forward
    addresses = [p.data_ptr() for p in engine.model.parameters()]
    text = prompt + [5, 9, 11, 40]
    before = teacher_forced_logprobs(engine, [text])[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([text[:-1]]), torch.tensor([text[1:]])).backward()
    opt.step()
    rollout.sync()  # what every batch of rollouts starts with
    after = teacher_forced_logprobs(engine, [text])[0]
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 1e-3  # the step moved them
    torch.testing.assert_close(torch.tensor(after), torch.tensor(model_logprobs(model, text)), atol=1e-5, rtol=0)
    assert [p.data_ptr() for p in engine.model.parameters()] == addresses  # in place: no new engine, no reload
    assert model.training and all(p.requires_grad for p in model.parameters())


def test_a_groups_replies_share_the_prompts_kv_blocks():
    model = trainable_gpt()
    rollout = Rollout(model, TokenIdsOnly(96), CPU, max_num_seqs=8, max_model_len=96)
    prompts = [list(range(1, 41)), list(range(41, 81))]  # 2 full blocks of 16 each, and a tail
    groups = rollout.sample_groups(prompts, 4, 8, 1.0, seed=1)
    assert [len(g) for g in groups] == [4, 4] and all(len(r) == 8 for g in groups for r in g)
    assert len({tuple(r) for r in groups[0]}) > 1  # each reply its own seed
    blocks = rollout.engine().blocks
    assert blocks.prefix_hits == 2 * 3 * 2  # 2 prompts x 3 followers x 2 full blocks each


def test_kv_cache_is_given_back_while_the_backward_runs(tmp_path):
    base_dir = tmp_path / "base"
    make_hf_dir(base_dir, "llama", seed=1)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"hello {i}"}], "answer": "4"}) + "\n"
                            for i in range(4)))
    base = load_base(str(base_dir), CPU)
    rows = load_prompts([str(data)])
    rollout = Rollout(base.model, base.tokenizer, CPU, max_num_seqs=4, max_model_len=64)
    scorer = GroupScorer(base, base.tokenizer, rollout, Rewards(["length:4", "gsm8k"]))
    opts = RLOptions(num_samples=2, max_new_tokens=8)
    stream = GroupStream(rows, scorer, RolloutStats(CPU, SINGLE_PROCESS), opts, 2, base.tokenizer.bos_id, 0, 1, seed=0, max_len=64)
    batch = stream.next_batch()
    engine = rollout.engine()
    assert batch.inputs.shape[0] == 4 and (batch.targets >= 0).any()
    full = rollout.freed_bytes
    assert full > 0 and kv_cache_bytes(engine) == 0
    seen = []
    loss = GRPOLoss()(base.model, batch)
    loss.register_hook(lambda grad: seen.append(kv_cache_bytes(engine)))
    loss.backward()
    assert seen == [0]  # measured during the backward
    stream.next_batch()  # the next rollouts wake it, and it sleeps again before training
    assert rollout.freed_bytes == full and kv_cache_bytes(engine) == 0


def test_rl_samples_and_grpo_groups_are_the_same_engine_and_seeds():
    """RL's `sample` and GRPO's `sample_groups` draw from one engine: the same prompt with the same seeds
    gives the same replies either way; a prompt that fills the context gets an empty reply."""
    model = trainable_gpt()
    rollout = Rollout(model, TokenIdsOnly(96), CPU, max_num_seqs=4, max_model_len=48)
    prompt = list(range(3, 23))
    groups = rollout.sample_groups([prompt], 3, 6, 1.0, seed=7)
    replies = rollout.sample([prompt, prompt, prompt, list(range(1, 49))], 6, 1.0, seeds=[7, 8, 9, 0])
    assert [r.token_ids for r in replies[:3]] == groups[0] and len({tuple(g) for g in groups[0]}) > 1
    assert all(r.mask == [1] * len(r.token_ids) for r in replies)  # no calculator tokens: nothing forced
    assert replies[3].token_ids == [] and model.training
