"""Speculative decoding through the engine: greedy output is exactly plain decoding's, stop rules cut
where plain decoding cuts, KV blocks are rolled back, and the counters add up."""

from __future__ import annotations

import pytest
import torch
from engine_testing import make_engine, plain_greedy, prompts_of, tiny_model

from portachat.engine import SamplingParams
from portachat.engine.speculative import SpeculativeConfig
from portachat.engine.speculative.rejection import processed_probs


def repetitive_prompts(vocab: int) -> list[list[int]]:
    """Prompts that repeat a phrase, so prompt lookup finds something to propose."""
    phrases = prompts_of([5, 7, 3], vocab, seed=21)
    return [p * 4 for p in phrases] + prompts_of([9], vocab, seed=22)


def ngram(**kw) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", **{"num_speculative_tokens": 3, "prompt_lookup_min": 1, **kw})


def test_ngram_greedy_equals_plain_decoding(chat_tokenizer):
    engine = make_engine(chat_tokenizer, speculative=ngram())
    prompts = repetitive_prompts(chat_tokenizer.vocab_size)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    got = engine.generate(prompts, params)
    for prompt, c in zip(prompts, got, strict=True):
        assert c.token_ids == plain_greedy(engine.model, prompt, 20)
        assert c.finish_reason == "length" and c.completion_tokens == 20
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    assert sum(stats["spec_decode_num_accepted_tokens_per_pos"]) == stats["spec_decode_num_accepted_tokens"]
    assert stats["kv_cache_usage"] == 0.0  # every block back, rejected tails included
    # Fewer steps than tokens: accepted drafts came out several per step.
    assert engine.num_steps < sum(c.completion_tokens for c in got)


@pytest.mark.parametrize("same", [True, False])
def test_draft_model_greedy_equals_plain_decoding(chat_tokenizer, same):
    vocab = chat_tokenizer.vocab_size
    draft = tiny_model(vocab, seed=0 if same else 5, n_layer=1 if not same else 2)
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft=draft)
    engine = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0), speculative=spec)
    prompts = prompts_of([4, 13, 6], vocab, seed=23)
    params = SamplingParams(max_tokens=18, temperature=0.0, ignore_eos=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert c.token_ids == plain_greedy(engine.model, prompt, 18)
    stats = engine.stats()
    if same:  # the draft is the target: every draft is accepted
        assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"] > 0
    assert engine.speculator.draft.states == {}  # released with their requests
    assert engine.speculator.draft.blocks.usage() == 0.0


def test_a_draft_with_a_reduced_vocabulary_keeps_greedy_output(chat_tokenizer):
    """The draft's head cut to the first ids plus the stop ids: greedy output is still the target's,
    and every drafted token is one the head kept."""
    vocab = chat_tokenizer.vocab_size
    keep = (vocab - 1,)
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft=tiny_model(vocab, seed=0),
                             draft_vocab_size=vocab // 2, keep_token_ids=keep)
    engine = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0), speculative=spec)
    draft = engine.speculator.draft
    assert draft.model.lm_head.out_features == vocab // 2 + 1
    assert draft.token_ids.tolist() == [*range(vocab // 2), vocab - 1]
    proposed: list[int] = []
    propose = draft.propose

    def recording(seqs, ks):
        out = propose(seqs, ks)
        proposed.extend(t for tokens, _q in out for t in tokens)
        return out

    draft.propose = recording
    prompts = prompts_of([4, 13, 6], vocab, seed=23)
    params = SamplingParams(max_tokens=18, temperature=0.0, ignore_eos=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert c.token_ids == plain_greedy(engine.model, prompt, 18)
    assert proposed and set(proposed) <= set(draft.token_ids.tolist())
    stats = engine.stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]


def same_model_drafter(vocab: int, k: int = 4, **kw) -> SpeculativeConfig:
    """The target itself as the draft: every greedy draft is accepted, so drafts run past any stop."""
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft=tiny_model(vocab, seed=0), **kw)


def test_stops_cut_where_plain_decoding_cuts(chat_tokenizer):
    vocab = chat_tokenizer.vocab_size
    plain = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0))
    spec = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0), speculative=same_model_drafter(vocab))
    prompt = prompts_of([7], vocab, seed=24)[0]
    free = plain.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    stop_token = free.token_ids[9]
    first = free.token_ids.index(stop_token)
    cases = [
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_token]),
        SamplingParams(max_tokens=11, temperature=0.0, ignore_eos=True),  # length, mid-draft
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[free.text[len(free.text) // 2:][:3]]),
    ]
    for params in cases:
        want = plain.generate([prompt], params)[0]
        got = spec.generate([prompt], params)[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    assert len(plain.generate([prompt], cases[0])[0].token_ids) == first + 1
    stats = spec.stats()
    assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"] > 0
    assert stats["kv_cache_usage"] == 0.0


def test_no_speculation_for_large_steps_logprobs_or_penalties(chat_tokenizer):
    vocab = chat_tokenizer.vocab_size
    engine = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0),
                         speculative=same_model_drafter(vocab, max_batch=2))  # fmt: skip
    prompts = prompts_of([5, 6, 7], vocab, seed=25)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.generate(prompts, greedy)  # three decode together: above max_batch, plain steps
    assert engine.stats()["spec_decode_num_drafts"] == 0
    for params in (
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True),
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, repetition_penalty=1.3),
    ):
        c = engine.generate(prompts[:1], params)[0]
        assert c.completion_tokens == 8 and engine.stats()["spec_decode_num_drafts"] == 0
        if params.logprobs:
            assert len(c.logprobs) == 8
    got = engine.generate(prompts[:2], greedy)
    assert engine.stats()["spec_decode_num_drafts"] > 0
    for prompt, c in zip(prompts, got, strict=False):
        assert c.token_ids == plain_greedy(engine.model, prompt, 8)


def test_greedy_parity_under_kv_pressure_and_preemption(chat_tokenizer):
    """Few KV blocks: drafts shrink to the free slots and sequences get preempted, output unchanged."""
    vocab = chat_tokenizer.vocab_size
    engine = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0), num_blocks=14, max_model_len=32,
                         speculative=same_model_drafter(vocab, k=5))  # fmt: skip
    prompts = prompts_of([10, 12, 9], vocab, seed=26)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert c.token_ids == plain_greedy(engine.model, prompt, 14)
    assert engine.stats()["num_preemptions"] > 0
    assert engine.stats()["kv_cache_usage"] == 0.0


@torch.inference_mode()
def _exact_joint(model, prompt: list[int], params: SamplingParams, depth: int) -> dict[tuple, float]:
    """P(first `depth` tokens) under the target with the sampler's temperature and top-k."""
    out: dict[tuple, float] = {(): 1.0}
    for _ in range(depth):
        grown = {}
        for prefix, mass in out.items():
            logits = model(torch.tensor([prompt + list(prefix)]))[0, -1:]
            probs = processed_probs(logits, params)[0]
            for t in probs.nonzero().flatten().tolist():
                grown[prefix + (t,)] = mass * float(probs[t])
        out = grown
    return out


@pytest.mark.parametrize("draft_vocab", [None, "reduced"])
def test_sampled_output_is_distributed_as_the_target(chat_tokenizer, draft_vocab):
    """Many seeds through a poor draft model: the joint law of the first tokens matches the target's,
    also when the draft's head keeps two tokens of the vocabulary (its q is zero on the rest)."""
    vocab = chat_tokenizer.vocab_size
    target = tiny_model(vocab, seed=0)
    draft = tiny_model(vocab, seed=0)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():  # near the target but not equal: some drafts accepted, some rejected
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    prompt = prompts_of([6], vocab, seed=27)[0]
    n = 600
    params = [SamplingParams(max_tokens=3, temperature=1.5, top_k=2, seed=i, ignore_eos=True) for i in range(n)]
    exact = _exact_joint(target, prompt, params[0], 3)
    # Drafts start at the second token (the first comes from the prefill). The reduced head keeps token 0
    # and every other of the target's possible second tokens: some drafts are accepted, some rejected,
    # and the target's other likely tokens lie outside what the draft can propose.
    keep = tuple(sorted({k[1] for k in exact})[::2])
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=2, max_batch=64, draft=draft,
                             draft_vocab_size=None if draft_vocab is None else 1, keep_token_ids=keep)
    engine = make_engine(chat_tokenizer, model=target, speculative=spec, num_blocks=512, max_num_seqs=64,
                         max_num_batched_tokens=512)  # fmt: skip
    got = engine.generate([prompt] * n, params)
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    counts: dict[tuple, int] = {}
    for c in got:
        key = tuple(c.token_ids)
        assert key in exact  # never outside the target's top-k support
        counts[key] = counts.get(key, 0) + 1
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    assert chi2 < 30.0  # 7 degrees of freedom: the 99.99% quantile is ~29.9


def test_drafts_of_one_step_share_the_free_blocks(chat_tokenizer):
    """Two sequences speculate in the same step with one free block between them: no double booking."""
    vocab = chat_tokenizer.vocab_size
    engine = make_engine(chat_tokenizer, model=tiny_model(vocab, seed=0), num_blocks=7, max_model_len=16,
                         speculative=same_model_drafter(vocab, k=4))  # fmt: skip
    prompts = prompts_of([8, 8], vocab, seed=28)  # 2 blocks each, a third each to decode, one left
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert c.finish_reason == "length" and c.token_ids == plain_greedy(engine.model, prompt, 8)
    assert engine.stats()["spec_decode_num_drafts"] > 0


def test_a_tool_call_inside_accepted_drafts_forces_its_output_and_drops_the_rest(chat_tokenizer, monkeypatch):
    """Drafts that close a calculator call: the result is forced in right after it, the drafts after
    the call are dropped with their K/V, and decoding continues from the forced tokens."""
    vocab = chat_tokenizer.vocab_size
    engine = make_engine(chat_tokenizer, speculative=ngram(num_speculative_tokens=12))
    tools = chat_tokenizer.tool_tokens
    call = [tools.python_start, *chat_tokenizer.encode("12*(3+4)"), tools.python_end]
    prompt = prompts_of([6], vocab, seed=11)[0]
    engine.add_request(prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    engine.step()  # prefill: the first token
    seq = engine.scheduler.running[0]
    first = seq.output_ids[0]
    spec = engine.speculator
    real_propose, real_verify = spec.propose, spec.verify

    def scripted_propose(batch, budget):  # one step whose draft is the call and two more tokens
        monkeypatch.setattr(spec, "propose", real_propose)
        s = batch[0]
        s.draft = [*call, 5]
        engine.blocks.allocate(s.seq, len(s.seq.token_ids) + len(s.draft))

    def accept_all(s, logits):  # as if the target agreed with every draft, then chose 6
        monkeypatch.setattr(spec, "verify", real_verify)
        return [*s.draft, 6]

    monkeypatch.setattr(spec, "propose", scripted_propose)
    monkeypatch.setattr(spec, "verify", accept_all)
    engine.step()
    forced = [tools.output_start, *chat_tokenizer.encode("84"), tools.output_end]
    assert seq.output_ids == [first, *call, *forced]  # 5 and 6 dropped: they followed the call, not its result
    assert seq.num_computed == len(prompt) + 1 + len(call)  # K/V kept up to the call's end
    while engine.has_unfinished():
        engine.step()
    done = len(prompt) + 1 + len(call) + len(forced)
    continuation = seq.token_ids[done:]
    assert continuation == plain_greedy(engine.model, seq.token_ids[:done], len(continuation))
