"""The batched sampler: inverse-CDF draws follow the distribution, masked tokens never come out,
the nucleus equals the one a full sort finds, and a row's draw depends only on its own seed."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from portachat.engine import sampler
from portachat.engine.detokenizer import Detokenizer
from portachat.engine.sampler import draw, filter_top_k_top_p, sample
from portachat.engine.sequence import Sequence
from portachat.engine.types import SamplingParams


def seq_with(params: SamplingParams, seed: int = 0) -> Sequence:
    return Sequence("r", [1, 2, 3], params, Detokenizer(lambda t: b"x", []),
                    torch.Generator().manual_seed(seed) if params.temperature > 0 else None, arrival=0)


def reference_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The textbook nucleus: sort everything, keep while the mass before a token is < top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
    return logits.index_put((order[drop],), torch.tensor(float("-inf")))


def test_draws_follow_the_distribution_and_skip_masked_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 1.0]))
    logits[3] = float("-inf")
    n = 6000
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    tokens = draw(logits.expand(n, 4).clone(), gens)
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert freq[3] == 0
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.025)


def test_a_rows_draw_depends_only_on_its_seed():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=g)
    alone = draw(logits[2:3].clone(), [torch.Generator().manual_seed(42)])
    together = draw(logits.clone(), [torch.Generator().manual_seed(s) for s in (1, 2, 42, 3, 4)])
    assert int(alone[0]) == int(together[2])


def test_nucleus_equals_the_full_sort():
    g = torch.Generator().manual_seed(1)
    for scale in (0.1, 1.0, 5.0):  # 0.1: nearly flat, the nucleus holds thousands of tokens
        logits = torch.randn(5000, generator=g) * scale
        for top_p in (0.05, 0.5, 0.9, 0.99):
            got = filter_top_k_top_p(logits, 0, top_p)
            assert torch.equal(torch.isfinite(got), torch.isfinite(reference_top_p(logits, top_p)))
            assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(got)])


def test_top_k_then_top_p():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    only_k = filter_top_k_top_p(logits, 3, 1.0)
    assert torch.isfinite(only_k).tolist() == [True, True, True, False, False]
    # Within the top 3 the first token holds ~0.67 of the mass, so top_p 0.5 keeps it alone.
    both = filter_top_k_top_p(logits, 3, 0.5)
    assert torch.isfinite(both).tolist() == [True, False, False, False, False]


def test_top_logprobs_are_the_raw_distributions_likeliest_per_row():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    seqs = [seq_with(SamplingParams(temperature=0.0, logprobs=True, top_logprobs=4)),
            seq_with(SamplingParams(temperature=1.0, logprobs=True, top_logprobs=2, top_k=3), seed=1),
            seq_with(SamplingParams(temperature=0.0))]
    tokens, logprobs, tops = sample(logits, seqs)
    reference = torch.log_softmax(logits, dim=-1)
    assert [len(t) for t in tops] == [4, 2, 0]
    for row, top in enumerate(tops[:2]):
        values, ids = torch.topk(reference[row], len(top))
        assert [t for t, _ in top] == ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), values)
        assert logprobs[row] == float(reference[row, tokens[row]])
    assert tops[0][0][0] == tokens[0]  # greedy: the chosen token leads


def test_logit_bias_moves_greedy_and_sampled_rows_but_not_the_reported_logprobs():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(3))
    weakest = int(logits[0].argmin())
    seqs = [seq_with(SamplingParams(temperature=0.0, logprobs=True, logit_bias={weakest: 100.0})),
            seq_with(SamplingParams(temperature=1.5, logit_bias={int(logits[1].argmax()): -100.0}), seed=4)]
    for _ in range(20):
        tokens, logprobs, _ = sample(logits, seqs)
        assert tokens[0] == weakest and tokens[1] != int(logits[1].argmax())
    assert logprobs[0] == float(torch.log_softmax(logits[0], dim=-1)[weakest])


class _CountScalarReads(TorchDispatchMode):
    """Counts reads of one value to the host (.item(), float(), bool()): on an accelerator each waits for it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_the_whole_batch_filter_draws_the_same_tokens_without_waiting_per_row(monkeypatch):
    """The accelerators' path (top-k / top-p over the whole batch on the device) gives the tokens the
    row-by-row path gives, and reads nothing back but each row's uniform number from its CPU generator."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1)) * 3
    params = [SamplingParams(temperature=0.8, top_k=k, top_p=p, seed=i)
              for i, (k, p) in enumerate([(0, 0.9), (5, 1.0), (40, 0.5), (0, 1.0), (300, 0.7), (3, 0.2)])]  # fmt: skip
    per_row, _, _ = sample(logits, [seq_with(p, i) for i, p in enumerate(params)])
    monkeypatch.setattr(sampler, "filters_whole_batch", lambda device_type: True)
    with _CountScalarReads() as counter:
        batched, _, _ = sample(logits, [seq_with(p, i) for i, p in enumerate(params)])
    assert batched == per_row
    assert counter.reads == len(params)  # the draws' uniforms only: no read per filtered row, none for overflow
