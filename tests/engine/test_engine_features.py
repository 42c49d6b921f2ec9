"""Sampling parameters, stops, limits, aborts, preemption, the calculator and failures, through the engine."""

from __future__ import annotations

import pytest
import torch
from engine_testing import make_engine, plain_greedy, prompts_of

from portachat.engine import EngineError, SamplingParams
from portachat.engine.detokenizer import Detokenizer


def test_seed_reproducible_and_independent_of_batch(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompt, *others = prompts_of([7, 12, 3, 20], chat_tokenizer.vocab_size, seed=4)
    p = SamplingParams(max_tokens=10, temperature=1.0, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
    alone = engine.generate([prompt], p)[0].token_ids
    crowd_params = [SamplingParams(max_tokens=7, temperature=0.8, seed=i, ignore_eos=True) for i in range(3)]
    crowded = engine.generate([*others, prompt], [*crowd_params, p])[-1].token_ids
    assert alone == crowded
    other_seed = SamplingParams(max_tokens=10, temperature=1.0, top_k=50, top_p=0.9, seed=99, ignore_eos=True)
    assert engine.generate([prompt], other_seed)[0].token_ids != alone


def test_top_k_one_and_tiny_top_p_are_greedy(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompt = prompts_of([9], chat_tokenizer.vocab_size, seed=5)[0]
    greedy = plain_greedy(engine.model, prompt, 8)
    for p in (
        SamplingParams(max_tokens=8, temperature=1.5, top_k=1, seed=0, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-6, seed=0, ignore_eos=True),
    ):
        assert engine.generate([prompt], p)[0].token_ids == greedy


@torch.inference_mode()
def penalised_greedy(model, prompt, n, repetition=1.0, presence=0.0, frequency=0.0) -> list[int]:
    """Reference: plain forwards, with HF's repetition and OpenAI's presence/frequency rules written out."""
    ids, out = list(prompt), []
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1].clone()
        for t in set(ids):
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        for t in set(out):
            logits[t] -= presence + frequency * out.count(t)
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
    return out


def test_penalties_match_their_definitions(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompt = prompts_of([6], chat_tokenizer.vocab_size, seed=6)[0]
    cases = [dict(repetition=1.8), dict(presence=1.5), dict(frequency=0.7), dict(presence=0.5, frequency=1.0)]
    for case in cases:
        p = SamplingParams(
            max_tokens=12,
            temperature=0.0,
            ignore_eos=True,
            repetition_penalty=case.get("repetition", 1.0),
            presence_penalty=case.get("presence", 0.0),
            frequency_penalty=case.get("frequency", 0.0),
        )
        assert engine.generate([prompt], p)[0].token_ids == penalised_greedy(engine.model, prompt, 12, **case)
    plain = plain_greedy(engine.model, prompt, 12)
    assert penalised_greedy(engine.model, prompt, 12, repetition=1.8) != plain  # the case is not vacuous


def test_stop_string_across_tokens_is_cut_and_never_streamed(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompt = chat_tokenizer.encode("ROMEO: what light through yonder")
    free = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    pieces = [chat_tokenizer.token_bytes(t).decode("utf-8", "replace") for t in free.token_ids]
    # A stop string that starts inside one token and ends inside a later one.
    starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    i = next(i for i in range(2, len(pieces)) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 1)
    stop = free.text[starts[i] + 1 : starts[i + 1] + 1]
    expected = free.text[: free.text.find(stop)]
    rid = engine.add_request(
        prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    )
    deltas, last = [], None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rid
            deltas.append(out.text)
            last = out
    assert "".join(deltas) == expected and stop not in "".join(deltas)
    assert last.finished and last.finish_reason == "stop"


def test_stop_token_ids_end_the_request(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    prompt = prompts_of([5], chat_tokenizer.vocab_size, seed=7)[0]
    greedy = plain_greedy(engine.model, prompt, 10)
    stop_at = greedy[4]
    c = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[stop_at]))[0]
    assert c.token_ids == greedy[: greedy.index(stop_at) + 1] and c.finish_reason == "stop"


def test_abort_frees_blocks_at_once_and_others_continue(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    a, b = prompts_of([14, 10], chat_tokenizer.vocab_size, seed=8)
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ra, rb = engine.add_request(a, p), engine.add_request(b, p)
    got: list[int] = []
    for _ in range(4):
        got += [t for out in engine.step() if out.request_id == rb for t in out.token_ids]
    before = engine.stats()["kv_cache_usage"]
    engine.abort(ra)
    assert engine.stats()["kv_cache_usage"] < before and engine.stats()["num_running"] == 1
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rb
            got += out.token_ids
    assert got == plain_greedy(engine.model, b, 12)
    assert engine.stats()["kv_cache_usage"] == 0.0


def test_preemption_when_blocks_run_out_keeps_outputs(chat_tokenizer):
    engine = make_engine(chat_tokenizer, num_blocks=10, block_size=4, max_model_len=32)
    prompts = prompts_of([10, 9, 11], chat_tokenizer.vocab_size, seed=9)
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = engine.generate(prompts, p)
    assert engine.stats()["num_preemptions"] > 0
    for prompt, c in zip(prompts, got, strict=True):
        assert c.token_ids == plain_greedy(engine.model, prompt, 12)


def test_limits_give_clear_errors(chat_tokenizer):
    engine = make_engine(chat_tokenizer, max_model_len=64, max_waiting=2)
    with pytest.raises(EngineError) as err:
        engine.add_request(list(range(60)), SamplingParams(max_tokens=10))
    assert err.value.kind == "too_long" and "60" in str(err.value) and "64" in str(err.value)
    with pytest.raises(EngineError) as err:
        engine.add_request([1, 2], SamplingParams(temperature=-1))
    assert err.value.kind == "invalid" and "temperature" in str(err.value)
    with pytest.raises(EngineError) as err:
        engine.add_request([], SamplingParams())
    assert err.value.kind == "invalid"
    engine.add_request([1], SamplingParams(max_tokens=2))
    engine.add_request([2], SamplingParams(max_tokens=2))
    with pytest.raises(EngineError) as err:
        engine.add_request([3], SamplingParams(max_tokens=2))
    assert err.value.kind == "queue_full"


def test_kv_cache_smaller_than_one_sequence_is_refused(chat_tokenizer):
    with pytest.raises(EngineError, match="max-model-len"):
        make_engine(chat_tokenizer, num_blocks=2, block_size=4, max_model_len=64)


def test_failed_step_fails_only_its_requests(chat_tokenizer, monkeypatch):
    engine = make_engine(chat_tokenizer)
    a = prompts_of([8], chat_tokenizer.vocab_size, seed=10)[0]
    ra = engine.add_request(a, SamplingParams(max_tokens=4, temperature=0.0))
    real_forward = engine.runner.forward

    def out_of_memory(inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(engine.runner, "forward", out_of_memory)
    outs = engine.step()
    assert [o.request_id for o in outs] == [ra]
    assert outs[0].finished and outs[0].finish_reason == "error" and "memory" in outs[0].error.lower()
    assert engine.stats()["kv_cache_usage"] == 0.0 and not engine.has_unfinished()
    monkeypatch.setattr(engine.runner, "forward", real_forward)
    c = engine.generate([a], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert c.token_ids == plain_greedy(engine.model, a, 4)


def test_calculator_output_is_forced_and_generation_continues(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    tools = chat_tokenizer.tool_tokens
    prompt = prompts_of([6], chat_tokenizer.vocab_size, seed=11)[0]
    engine.add_request(prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    engine.step()  # prefill; the first sampled token is replaced by the scripted tool call below
    seq = engine.scheduler.running[0]
    del seq.token_ids[len(prompt) :]
    seq.num_computed = len(prompt)
    seq.detokenizer = Detokenizer(chat_tokenizer.token_bytes, [])
    script = [tools.python_start, *chat_tokenizer.encode("12*(3+4)"), tools.python_end]
    for t in script:
        engine._append(seq, t, None)
    forced = [tools.output_start, *chat_tokenizer.encode("84"), tools.output_end]
    assert seq.output_ids == script + forced
    while engine.has_unfinished():
        engine.step()
    continuation = seq.output_ids[len(script) + len(forced) :]
    assert continuation == plain_greedy(engine.model, prompt + script + forced, len(continuation))
    assert seq.detokenizer.text.startswith("12*(3+4)84")


def test_tool_off_forces_nothing(chat_tokenizer):
    engine = make_engine(chat_tokenizer)
    tools = chat_tokenizer.tool_tokens
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=30, temperature=0.0, use_tools=False))
    engine.step()
    seq = engine.scheduler.running[0]
    script = [tools.python_start, *chat_tokenizer.encode("1+1"), tools.python_end]
    for t in script:
        engine._append(seq, t, None)
    assert seq.output_ids[-len(script) :] == script


def test_incremental_detokenization_of_chinese_text(chat_tokenizer):
    text = "床前明月光，疑是地上霜。举头望明月 — low ASCII too 😀"
    ids = chat_tokenizer.encode(text)
    assert len(ids) > len(text)  # byte-level: characters are split across tokens
    d = Detokenizer(chat_tokenizer.token_bytes, [])
    streamed = ""
    for t in ids:
        d.add(t)
        delta = d.delta()
        assert "\ufffd" not in delta
        streamed += delta
    streamed += d.delta(final=True)
    assert streamed == chat_tokenizer.decode(ids) == text


def test_generate_reports_a_refused_prompt_and_runs_the_rest(chat_tokenizer):
    engine = make_engine(chat_tokenizer, max_model_len=32)
    ok = prompts_of([5], chat_tokenizer.vocab_size, seed=16)[0]
    got = engine.generate(
        [list(range(40)), ok], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    )
    assert got[0].finish_reason == "error" and "context window" in got[0].error and got[0].token_ids == []
    assert got[1].token_ids == plain_greedy(engine.model, ok, 4)


def test_a_reply_cut_inside_a_character_ends_without_a_replacement_char(chat_tokenizer):
    ids = chat_tokenizer.encode("明月光")
    cut = next(n for n in range(1, len(ids)) if chat_tokenizer.decode(ids[:n]).endswith("\ufffd"))
    d = Detokenizer(chat_tokenizer.token_bytes, [])
    for t in ids[:cut]:
        d.add(t)
    text = d.delta() + d.delta(final=True)
    assert "\ufffd" not in text and "明月光".startswith(text)


def test_identical_prompts_added_together_compute_the_prompt_once(chat_tokenizer):
    """The samples of an n > 1 request arrive together: the later ones wait for the first one's
    prefill and take its full blocks from the prefix cache, with the same tokens as computing them."""
    engine = make_engine(chat_tokenizer, max_num_batched_tokens=64)
    prompt = prompts_of([30], chat_tokenizer.vocab_size, seed=21)[0]
    full_blocks = (len(prompt) - 1) // 4
    p = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(prompt, p) for _ in range(3)]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    assert engine.stats()["prefix_cache_hits"] == 2 * full_blocks
    assert list(tokens.values()) == [plain_greedy(engine.model, prompt, 5)] * 3
