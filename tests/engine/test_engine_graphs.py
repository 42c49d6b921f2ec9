"""Decode steps padded for graph replay: buckets, the scratch block, and the same tokens as eager.

Capture itself needs an accelerator; here the padded static-buffer step runs eagerly, which is
everything a replay computes (benchmarks/decode.py checks the captured graphs on a GPU).
"""

from __future__ import annotations

import torch
from engine_testing import make_engine, plain_greedy, prompts_of, tiny_model

from portachat.engine import SamplingParams
from portachat.engine.decode_graphs import LENGTH_STEP, batch_buckets, padded_blocks


def test_batch_buckets_are_powers_of_two_up_to_the_running_limit():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(10_000)[-1] == 256  # beyond that a step runs eager


def test_context_is_padded_to_whole_length_steps_within_the_model_length():
    per_step = LENGTH_STEP // 16
    assert padded_blocks(1, 16, max_blocks=128) == per_step
    assert padded_blocks(LENGTH_STEP, 16, max_blocks=128) == per_step
    assert padded_blocks(LENGTH_STEP + 1, 16, max_blocks=128) == 2 * per_step
    assert padded_blocks(2000, 16, max_blocks=125) == 125  # never past the longest sequence
    # Past 8 steps the step doubles: few graphs for long contexts, padding under an eighth.
    assert padded_blocks(8 * LENGTH_STEP + 1, 16, max_blocks=10_000) == 10 * per_step
    assert padded_blocks(16 * LENGTH_STEP + 1, 16, max_blocks=10_000) == 20 * per_step
    assert padded_blocks(3, 1024, max_blocks=8) == 1  # blocks longer than a step: one block


def graph_engine(tokenizer, **config):
    # A model that is still training runs the modules (no packed CPU kernels), as on an accelerator.
    model = tiny_model(tokenizer.vocab_size, seed=2, architecture="llama", qk_norm=False)
    engine = make_engine(tokenizer, model=model, **config)
    return engine, model


def test_padded_decode_steps_give_the_plain_greedy_tokens(chat_tokenizer):
    engine, model = graph_engine(chat_tokenizer, max_num_seqs=8, max_num_batched_tokens=64)
    engine.runner.enable_decode_graphs(8, capturer=None)
    padded_batches = []
    run = engine.runner.graphs.run
    engine.runner.graphs.run = lambda step: padded_batches.append(step.batch) or run(step)
    prompts = prompts_of([9, 3, 14, 1, 30], chat_tokenizer.vocab_size, seed=4)
    lengths = [12, 3, 9, 12, 5]  # sequences finish at different steps: the batch shrinks and re-pads
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    outs = engine.generate(prompts, params)
    for prompt, n, c in zip(prompts, lengths, outs, strict=True):
        assert c.token_ids == plain_greedy(model, prompt, n)
    assert set(padded_batches) >= {8, 4, 2}  # 5 and 3 rows padded up; the prefill steps stay eager


def test_padding_writes_only_the_scratch_block(chat_tokenizer):
    prompts = prompts_of([7, 11, 2], chat_tokenizer.vocab_size, seed=5)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    caches = []
    for padded in (False, True):
        engine, _ = graph_engine(chat_tokenizer, max_num_seqs=4, enable_prefix_caching=False)
        if padded:
            engine.runner.enable_decode_graphs(4, capturer=None)
        engine.generate(prompts, params)
        caches.append(engine.runner.k_cache)
    runner = engine.runner
    assert runner.scratch_block == engine.blocks.num_blocks  # one block past what the manager owns
    real = runner.scratch_block * runner.block_size
    eager, padded = caches
    # Same schedule, same slots; values within rounding (padded batches multiply in other shapes).
    torch.testing.assert_close(padded[:, :, :real], eager[:, :, :real], atol=1e-4, rtol=1e-4)
    assert eager[:, :, real:].abs().sum() == 0 and padded[:, :, real:].abs().sum() > 0


def test_mixed_steps_and_batches_past_the_largest_bucket_run_eager(chat_tokenizer):
    # 16 tokens a step: prefill chunks share steps with decodes.
    engine, model = graph_engine(chat_tokenizer, max_num_seqs=4)
    engine.runner.enable_decode_graphs(2, capturer=None)  # buckets 1, 2: four decodes do not fit
    padded_steps = []
    prepare = engine.runner.graphs.prepare
    engine.runner.graphs.prepare = lambda batch: padded_steps.append(batch) or prepare(batch)
    prompts = prompts_of([5, 6, 7, 8], chat_tokenizer.vocab_size, seed=6)
    outs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    for prompt, c in zip(prompts, outs, strict=True):
        assert c.token_ids == plain_greedy(model, prompt, 4)
    assert all(len(b) <= 2 and all(s.num_tokens == 1 for s in b) for b in padded_steps)
    assert 0 < len(padded_steps) < engine.num_steps
    assert engine.stats()["decode_graphs"] is False  # eager padding is not graph replay
