"""Structured output in the engine: a tiny random model of ours, our own BPE tokenizer, and masks
that make every reply parse and validate, while free requests in the same batch run unchanged."""

from __future__ import annotations

import json
import re

import pytest
import torch
from engine_testing import make_engine, plain_greedy, prompts_of

from portachat.engine import EngineError, SamplingParams
from portachat.engine.structured import StructuredError, StructuredSpec, is_constrained
from portachat.engine.structured.compile import Constraints
from portachat.engine.structured.masks import TokenMasks, allocate_bitmask, unpack
from portachat.tokenizer.chat_tokenizer import PortachatChatTokenizer
from tests.serve.structured_testing import conforms

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def ours(small_tokenizer) -> PortachatChatTokenizer:
    return PortachatChatTokenizer(small_tokenizer)


def test_masks_unpack_to_the_allowed_tokens_and_touch_only_their_rows():
    vocab = 70  # not a multiple of 32: the last word is partly padding
    bitmask = torch.zeros(1, 3, dtype=torch.int32)
    allowed = [0, 31, 33, 69]
    for t in allowed:
        bitmask[0, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)
    assert unpack(bitmask, vocab)[0].nonzero().flatten().tolist() == allowed
    logits = torch.randn(3, vocab)
    masked = TokenMasks([1], bitmask).apply(logits)
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    finite = torch.isfinite(masked[1]).nonzero().flatten().tolist()
    assert finite == allowed and torch.equal(masked[1, allowed], logits[1, allowed])


def test_masks_on_every_row_leave_the_raw_logits_alone():
    vocab = 70
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    bitmask[0, 0] = 1 << 5  # row 0: token 5 only
    bitmask[1, 2] = 1 << 1  # row 1: token 65 only
    logits = torch.randn(2, vocab)
    raw = logits.clone()
    masked = TokenMasks([0, 1], bitmask).apply(logits)
    assert torch.equal(logits, raw)  # the sampler still reads the raw logits for logprobs
    assert [torch.isfinite(row).nonzero().flatten().tolist() for row in masked] == [[5], [65]]
    assert masked[0, 5] == logits[0, 5] and masked[1, 65] == logits[1, 65]


def test_our_tokenizer_bytes_build_the_library_tokenizer(ours):
    padded = ours.vocab_size + 13  # models pad their vocabulary past the tokenizer's
    constraints = Constraints(ours, padded)
    matcher = constraints.matcher(StructuredSpec("json", PERSON))
    bitmask = allocate_bitmask(1, padded)
    constraints.fill([matcher], bitmask)
    allowed = unpack(bitmask, padded)[0]
    assert not allowed[ours.vocab_size :].any()  # padding ids are never allowed
    assert not any(allowed[t] for t in ours.stop_ids)  # nothing written yet: the reply cannot end
    assert all(ours.token_bytes(int(t)).startswith(b"{") for t in allowed.nonzero().flatten())
    for t in ours.encode('{"name": "Ann", "age": 7, "role": "user"}'):
        assert matcher.consume_token(t), matcher.get_error()
    assert matcher.is_accepting()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sampled_json_parses_and_validates(ours, seed):
    engine = make_engine(ours, num_blocks=128, max_num_batched_tokens=64)
    prompt = prompts_of([6], ours.vocab_size, seed=seed)[0]
    spec = StructuredSpec("json", PERSON)
    out = engine.generate([prompt], SamplingParams(max_tokens=150, temperature=1.0, seed=seed, structured=spec))[0]
    assert out.finish_reason == "stop", out
    assert conforms(json.loads(out.text), PERSON), out.text


def test_greedy_regex_and_choice_share_a_batch_with_a_free_request(ours):
    engine = make_engine(ours, num_blocks=128, max_num_batched_tokens=64)
    prompts = prompts_of([5, 9, 7], ours.vocab_size, seed=8)
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    regex = SamplingParams(max_tokens=30, temperature=0, structured=StructuredSpec("regex", r"[A-Z][a-z]{2,5}-\d{3}"))
    choice = SamplingParams(max_tokens=30, temperature=0, structured=StructuredSpec("choice", ["thou", "thee art"]))
    outs = engine.generate(prompts, [free, regex, choice])
    assert outs[0].token_ids == plain_greedy(engine.model, prompts[0], 12)  # the free row is untouched
    assert re.fullmatch(r"[A-Z][a-z]{2,5}-\d{3}", outs[1].text) and outs[1].finish_reason == "stop"
    assert outs[2].text in ("thou", "thee art") and outs[2].finish_reason == "stop"


def test_a_lark_grammar_and_gbnf(ours):
    engine = make_engine(ours, num_blocks=128, max_num_batched_tokens=64)
    prompt = prompts_of([4], ours.vocab_size, seed=2)[0]
    lark = 'start: "(" num ("+" num)* ")"\nnum: /[1-9][0-9]?/'
    gbnf = 'root ::= "yes" | "no"'
    outs = engine.generate([prompt, prompt], [
        SamplingParams(max_tokens=40, temperature=1.0, seed=5, structured=StructuredSpec("grammar", lark)),
        SamplingParams(max_tokens=40, temperature=1.0, seed=5, structured=StructuredSpec("grammar", gbnf)),
    ])
    assert re.fullmatch(r"\((?:[1-9][0-9]?)(?:\+[1-9][0-9]?)*\)", outs[0].text) or outs[0].finish_reason == "length"
    assert outs[1].text in ("yes", "no")


def test_constrained_rows_are_marked_and_bad_constraints_name_their_part(ours):
    engine = make_engine(ours)
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=5, structured=StructuredSpec("regex", "a+")))
    assert is_constrained(engine._seqs[rid])
    free = engine.add_request([1, 2, 3], SamplingParams(max_tokens=5))
    assert not is_constrained(engine._seqs[free])
    with pytest.raises(StructuredError, match="not") as info:
        engine.add_request([1], SamplingParams(max_tokens=5, structured=StructuredSpec("json", {"not": {"type": "string"}},
                                                                          param="response_format")))
    assert info.value.param == "response_format" and isinstance(info.value, EngineError)
    with pytest.raises(StructuredError, match="regex"):
        engine.add_request([1], SamplingParams(max_tokens=5, structured=StructuredSpec("regex", "[a-")))
    with pytest.raises(StructuredError, match="choice"):
        StructuredSpec("choice", [])


def test_preempted_constrained_requests_resume_their_grammar(ours):
    """Blocks run out, sequences are preempted and recomputed: each matcher keeps its place, so the
    replies equal what each request gives alone and all follow the regex."""
    pattern = r"[a-z]{3,8}( [a-z]{3,8}){2}"
    spec = StructuredSpec("regex", pattern)
    engine = make_engine(ours, num_blocks=12, block_size=4, max_model_len=48)
    prompts = prompts_of([10, 9, 11], ours.vocab_size, seed=9)
    p = SamplingParams(max_tokens=30, temperature=0.0, structured=spec)
    together = engine.generate(prompts, p)
    assert engine.stats()["num_preemptions"] > 0
    for prompt, got in zip(prompts, together, strict=True):
        assert re.fullmatch(pattern, got.text), got.text
        assert got.token_ids == make_engine(ours).generate([prompt], p)[0].token_ids


def test_constraints_compile_once_off_the_engine_loop(ours):
    import threading

    engine = make_engine(ours)
    spec = StructuredSpec("json", PERSON)
    worker = threading.Thread(target=engine.compile_constraint, args=(spec,))  # as the server's request threads do
    worker.start()
    worker.join()
    cached = dict(engine._constraints._templates)
    assert len(cached) == 1
    rid = engine.add_request([1, 2], SamplingParams(max_tokens=4, structured=StructuredSpec("json", dict(PERSON))))
    assert engine._constraints._templates == cached  # admission copied the compiled grammar
    assert engine._seqs[rid].matcher is not next(iter(cached.values()))  # a copy per sequence
    with pytest.raises(StructuredError):
        engine.compile_constraint(StructuredSpec("regex", "(unclosed"))


def test_speculating_engines_leave_constrained_rows_to_their_grammar(ours):
    from portachat.engine.speculative import SpeculativeConfig

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1)
    engine = make_engine(ours, num_blocks=256, max_num_batched_tokens=128, speculative=spec)
    # Prompts that repeat a phrase: prompt lookup proposes drafts for the free rows.
    prompts = [p * 4 for p in prompts_of([5, 7, 3], ours.vocab_size, seed=21)]
    free = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    pattern = r"[a-z]{3}-[0-9]{2}"
    regex = SamplingParams(max_tokens=30, temperature=0, structured=StructuredSpec("regex", pattern))
    outs = engine.generate([*prompts, prompts[0]], [free, free, free, regex])
    for prompt, out in zip(prompts, outs, strict=False):
        assert out.token_ids == plain_greedy(engine.model, prompt, 20)
    assert re.fullmatch(pattern, outs[3].text) and outs[3].finish_reason == "stop"
    assert engine.stats()["spec_decode_num_drafts"] > 0  # the free rows did speculate


def test_constrained_sequences_are_never_offered_drafts(ours):
    from portachat.engine.speculative.policy import speculation_allowed

    engine = make_engine(ours)
    prompt = prompts_of([5], ours.vocab_size, seed=2)[0]
    free = engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0))
    constrained = engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0,
                                                            structured=StructuredSpec("regex", "[a-z]+")))
    assert speculation_allowed(engine._seqs[free])
    assert not speculation_allowed(engine._seqs[constrained])
