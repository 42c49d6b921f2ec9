"""SmolLM2-135M (GGUF, fp32) on an input-grounded task: prompt lookup and a draft model leave the
greedy reply token for token what plain decoding gives, rejections included."""

from __future__ import annotations

import pytest
from smollm2 import smollm2_gguf_path

from portachat.engine import SamplingParams
from portachat.engine.speculative import SpeculativeConfig

TEXT = ("Portachat trains and serves a small chat model on whatever accelerator the user has. One code base, "
        "one command line, the same results everywhere: NVIDIA, AMD, Ascend, Intel, Apple or a plain CPU.")  # fmt: skip


@pytest.mark.slow
def test_smollm2_speculative_greedy_equals_plain():
    from portachat.device import get_device
    from portachat.engine import EngineConfig, LLMEngine
    from portachat.model.load import load_for_inference

    loaded = load_for_inference(smollm2_gguf_path(), device="cpu", dtype="fp32")
    tok = loaded.tokenizer
    prompts = [tok.render_prompt([{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}]),
               tok.render_prompt([{"role": "user", "content": "Name three colours."}])]  # fmt: skip
    params = SamplingParams(max_tokens=32, temperature=0.0)

    def run(spec):
        config = EngineConfig(dtype="fp32", compile=False, max_model_len=512, num_blocks=128, speculative=spec)
        engine = LLMEngine(loaded.model, tok, config, device=get_device("cpu"))
        return engine.generate(prompts, params), engine.stats()

    plain, _ = run(None)
    for spec in (SpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_min=1),
                 SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft=loaded.model)):  # fmt: skip
        got, stats = run(spec)
        for want, have in zip(plain, got, strict=True):
            assert (have.token_ids, have.text, have.finish_reason) == (want.token_ids, want.text, want.finish_reason)
        assert stats["spec_decode_num_accepted_tokens"] > 0
        if spec.method == "ngram":
            assert stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]  # some rejected
        assert stats["kv_cache_usage"] == 0.0
