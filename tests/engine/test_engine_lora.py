"""Many LoRA adapters in one batch: each request's greedy tokens equal those of its adapter merged
into the weights, with the base model and two different adapters sharing every step (fp32)."""

from __future__ import annotations

import copy

import pytest
from engine_testing import make_engine, plain_greedy, prompts_of, tiny_model

from portachat.engine import SamplingParams
from portachat.engine.types import EngineError
from portachat.model.lora import load_lora, merge_into
from tests.lora_files import write_random_adapter


@pytest.fixture(scope="module")
def setup(tmp_path_factory, chat_tokenizer):
    root = tmp_path_factory.mktemp("adapters")
    model = tiny_model(chat_tokenizer.vocab_size, seed=3).requires_grad_(False)
    a = write_random_adapter(root / "a", model, rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=1)
    b = write_random_adapter(root / "b", model, rank=8, alpha=4, seed=2, rslora=True)
    merged = {name: merge_into(copy.deepcopy(model), load_lora(path)) for name, path in (("a", a), ("b", b))}
    merged[None] = model
    return model, {"a": a, "b": b}, merged


def _run_mixed(engine, jobs: list[tuple[list[int], str | None]], max_tokens: int) -> tuple[list[list[int]], int]:
    """Run every job at once; returns each one's tokens and how many steps mixed base + both adapters."""
    seen: list[set] = []
    prepare = engine.runner.prepare

    def spy(batch):
        seen.append({s.seq.params.adapter for s in batch})
        return prepare(batch)

    engine.runner.prepare = spy
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, adapter=a))
           for p, a in jobs]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    engine.runner.prepare = prepare
    return [tokens[i] for i in ids], sum(1 for s in seen if s >= {None, "a", "b"})


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "modules"])
def test_mixed_adapters_in_one_batch_equal_merged(setup, chat_tokenizer, packed):
    model, paths, merged = setup
    engine = make_engine(chat_tokenizer, copy.deepcopy(model), max_num_batched_tokens=64)
    if not packed:
        engine.runner.packed = None
    assert (engine.runner.packed is not None) == packed
    for name, path in paths.items():
        engine.add_adapter(name, path)
    assert engine.adapters == ["a", "b"]
    prompts = prompts_of([5, 9, 3], chat_tokenizer.vocab_size, seed=7)
    jobs = [(p, a) for p in prompts for a in (None, "a", "b")]  # the same prompts under each adapter
    expected = [plain_greedy(merged[a], p, 6) for p, a in jobs]
    for _ in range(2):  # the second round finds each adapter's own prefixes cached, never another's
        got, mixed = _run_mixed(engine, jobs, 6)
        assert got == expected
        assert mixed > 0
    assert engine.blocks.prefix_hits > 0
    # The adapters matter: the same prompt gives different tokens under each.
    assert len({tuple(expected[i]) for i in range(3)}) == 3


def test_adapters_come_and_go_at_run_time(setup, chat_tokenizer):
    model, paths, merged = setup
    engine = make_engine(chat_tokenizer, copy.deepcopy(model))
    prompt = prompts_of([6], chat_tokenizer.vocab_size, seed=1)[0]
    with pytest.raises(EngineError, match="unknown LoRA adapter 'a'"):
        engine.add_request(prompt, SamplingParams(max_tokens=4, adapter="a"))
    engine.add_adapter("a", paths["a"])
    rid = engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, adapter="a"))
    with pytest.raises(EngineError, match="in flight"):
        engine.remove_adapter("a")
    engine.step()
    engine.abort(rid)
    engine.remove_adapter("a")
    engine.add_adapter("a", paths["b"])  # a name can come back with other weights: no stale prefix is reused
    got, _ = _run_mixed(engine, [(prompt, "a")], 4)
    assert got == [plain_greedy(merged["b"], prompt, 4)]


def test_a_base_only_step_does_no_lora_work(setup, chat_tokenizer):
    model, paths, _ = setup
    engine = make_engine(chat_tokenizer, copy.deepcopy(model))
    engine.add_adapter("a", paths["a"])
    groups = []
    forward = engine.runner.forward
    engine.runner.forward = lambda inp: groups.append(inp.lora_groups) or forward(inp)
    prompt = prompts_of([6], chat_tokenizer.vocab_size, seed=2)[0]
    engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, adapter="a"))
    assert groups[:3] == [[], [], []]  # the base request: no groups, so no gather, product or scatter
    assert all(len(g) == 1 for g in groups[3:]) and len(groups) == 6


def test_an_adapter_for_another_model_is_refused(tmp_path, setup, chat_tokenizer):
    model, _, _ = setup
    other = tiny_model(chat_tokenizer.vocab_size, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64)
    path = write_random_adapter(tmp_path / "other", other, rank=2, alpha=2)
    engine = make_engine(chat_tokenizer, copy.deepcopy(model))
    with pytest.raises(Exception, match="another base model"):
        engine.add_adapter("other", path)
    assert engine.adapters == []


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_decoding_with_adapters_equals_merged(setup, chat_tokenizer, method):
    """Draft rows of an adapter's request are verified with that adapter (the draft model itself is the
    base: it proposes, the adapter's target decides), so greedy tokens stay the merged model's."""
    from portachat.engine.speculative import SpeculativeConfig

    model, paths, merged = setup
    if method == "ngram":
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, max_batch=8)
    else:
        spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft=copy.deepcopy(model), max_batch=8)
    engine = make_engine(chat_tokenizer, copy.deepcopy(model), max_num_batched_tokens=64, speculative=spec)
    for name, path in paths.items():
        engine.add_adapter(name, path)
    phrases = prompts_of([5, 3], chat_tokenizer.vocab_size, seed=21)
    jobs = [(p * 3, a) for p in phrases for a in (None, "a", "b")]  # repeats: prompt lookup finds drafts
    got, _ = _run_mixed(engine, jobs, 10)
    assert got == [plain_greedy(merged[a], p, 10) for p, a in jobs]
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 0 and stats["lora_mixed_steps"] > 0
