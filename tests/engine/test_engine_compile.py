"""torch.compile of the engine's forward (the module path accelerators use): same tokens as eager."""

from __future__ import annotations

import warnings

import pytest
from engine_testing import make_engine, plain_greedy, prompts_of, tiny_model

from portachat.engine import SamplingParams


@pytest.mark.slow
def test_compiled_forward_gives_the_eager_tokens(chat_tokenizer):
    # A model that is still training runs the modules (no packed CPU kernels), as on an accelerator.
    model = tiny_model(chat_tokenizer.vocab_size, seed=2, architecture="llama", qk_norm=False)
    engine = make_engine(chat_tokenizer, model=model, compile=True)
    assert engine.compiled and engine.runner.packed is None
    prompts = prompts_of([9, 3, 14], chat_tokenizer.vocab_size, seed=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    fallbacks = [w for w in caught if "compiled forward failed" in str(w.message)]
    assert not fallbacks, fallbacks[0].message  # it really ran compiled, not eager after a failure
    for prompt, c in zip(prompts, outs, strict=True):
        assert c.token_ids == plain_greedy(model, prompt, 6)


def test_packed_cpu_path_is_not_compiled(chat_tokenizer):
    """Compiling cannot see through the packed oneDNN/MKL kernels; the engine says so and runs eager."""
    model = tiny_model(chat_tokenizer.vocab_size, seed=2).requires_grad_(False)
    engine = make_engine(chat_tokenizer, model=model, compile=True)
    assert engine.runner.packed is not None
    assert not engine.compiled and "packed" in engine.compile_reason
