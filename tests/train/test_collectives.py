"""No float64 reaches a collective (HCCL has none; issue #37): the RL, GRPO, DPO and held-out reductions run
on two real gloo processes with every torch.distributed collective wrapped to refuse a float64 tensor,
and their sums come out right."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter",
               "reduce_scatter_tensor", "reduce")


def refuse_float64(calls: list[str]) -> None:
    """Wrap every tensor collective: a float64 tensor anywhere in its arguments fails the test."""

    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            for v in value:
                yield from tensors(v)

    for name in COLLECTIVES:
        real = getattr(dist, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            for t in tensors([*args, *kwargs.values()]):
                assert t.dtype != torch.float64, f"float64 tensor reached dist.{_name}"
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(dist, name, wrapped)


class Sampler:
    """A policy that says the same answer to everything (the probe only counts)."""

    def __init__(self) -> None:
        from portachat.device import get_device

        self.dev = get_device("cpu")

    def sample(self, prompts, max_tokens, temperature, seeds):
        from portachat.train.rollout import Reply

        return [Reply([1], [1], "The answer is 7.") for _ in prompts]


def _reductions(rank: int, out: dict) -> None:
    from portachat.data.synthetic.tasks import TASKS
    from portachat.device import dist_env, get_device
    from portachat.device.shapes import pad_bucket
    from portachat.tokenizer import Tokenizer
    from portachat.train.chat_eval import held_out_sums
    from portachat.train.grpo import GroupScorer, heldout_reward_evaluator
    from portachat.train.preference_loss import PreferenceMetrics
    from portachat.train.rl import RolloutStats, probe_pass_rates

    dev, env = get_device("cpu", dtype="fp32"), dist_env()
    assert dev.accumulate_dtype == torch.float64  # the CPU sums in float64: exactly what must not travel
    calls: list[str] = []
    refuse_float64(calls)

    stats = RolloutStats(dev, env, ["comparison"])  # RL's per-step metrics
    stats.add(torch.tensor([[float(rank + 1), 0.0]]), [3, 5], ["comparison"])
    out["rl"] = stats.read()

    scorer = GroupScorer(SimpleNamespace(tokenizer=None), None, None, SimpleNamespace(names=["a"]))  # GRPO's means
    scorer.reward_sums += torch.tensor([2.0 * (rank + 1), 2.0], dtype=torch.float64)
    out["grpo"] = scorer.read_means(dev, env)

    class Scorer:  # GRPO's held-out evaluator over a scorer that gives every reply reward rank + 1
        reward_sums = torch.zeros(2, dtype=torch.float64)
        sampler = SimpleNamespace(sleep=lambda: 0, sync=lambda: None)

        def run(self, rows, group, max_tokens, temperature, seed):
            return None, None, torch.full((len(rows), group), float(rank + 1))

    evaluate = heldout_reward_evaluator(["p0", "p1", "p2", "p3"], Scorer(), dev, env, 8)
    out["heldout"] = evaluate(None, 0)

    tok = Tokenizer.load(os.environ["TOK_DIR"])  # RL's probe of the tasks' pass rates
    out["probe"] = probe_pass_rates(Sampler(), tok, env, 2, 8, 1.0, seed=0)
    out["tasks"] = list(TASKS)

    metrics = PreferenceMetrics(dev.torch_device, dev.accumulate_dtype, env)  # DPO's metrics
    metrics.sums = torch.tensor([1.0] * 6 + [2.0], dtype=torch.float64)
    out["dpo"] = metrics.read()

    convs = [{"messages": [i]} for i in range(4)]  # held-out loss sums (fine-tuning, distillation)
    total = held_out_sums(convs, lambda m, n: ([1, 2, 3], [0, 1, 1]), 0, 2, 4, dev, env, pad_bucket,
                          lambda b: torch.tensor(1.5, dtype=torch.float32))
    out["held_out"] = total.tolist()
    out["calls"] = sorted(set(calls))
    out["count"] = len(calls)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, tok_dir: str, outputs) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PORTACHAT_DEVICE="cpu", TOK_DIR=tok_dir)
    torch.set_num_threads(1)
    from portachat.device import destroy_distributed, get_device, init_distributed

    init_distributed(get_device("cpu"), timeout_s=120)
    try:
        out: dict = {}
        _reductions(rank, out)
        outputs[rank] = out
    finally:
        destroy_distributed()


def test_rl_grpo_dpo_and_held_out_reductions_send_no_float64(small_tokenizer, tmp_path):
    small_tokenizer.save(tmp_path / "tok")
    outputs = mp.Manager().dict()
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path / "tok"), outputs), nprocs=2, join=True)
    first, second = outputs[0], outputs[1]
    assert first["count"] >= 6 and "all_reduce" in first["calls"]  # the guard saw the collectives
    for key in ("rl", "grpo", "heldout", "probe", "dpo", "held_out"):
        assert first[key] == second[key], key  # every rank reads the same sums
    rl = first["rl"]  # rewards 1, 0 (rank 0) and 2, 0 (rank 1): 3 over 4 replies
    assert rl["reward"] == pytest.approx(0.75) and rl["response_length"] == pytest.approx(4.0)
    assert rl["reward/comparison"] == pytest.approx(0.75) and rl["pass_at_k"] == pytest.approx(1.0)
    assert first["grpo"] == {"reward/a": pytest.approx(6.0 / 4.0)}
    assert first["heldout"] == {"heldout_reward": pytest.approx(1.5)}  # 2 prompts each at reward 1 and 2
    assert sorted(first["probe"]) == sorted(first["tasks"]) and all(0.0 <= v <= 1.0 for v in first["probe"].values())
    assert first["dpo"]["rewards/chosen"] == pytest.approx(0.5)  # 1 + 1 over 2 + 2 pairs
    assert first["held_out"] == pytest.approx([2 * 1.5, 4 * 2.0])  # one batch per rank; 4 rows of 2 targets
