"""Sleep/wake: the engine gives its KV cache's memory back and takes it again, and generates the same
replies after waking as before sleeping."""

from __future__ import annotations

import pytest
from engine_testing import prompts_of, tiny_model

from portachat.engine import EngineError, SamplingParams
from portachat.engine.kv_sleep import KVSleep, kv_cache_bytes
from portachat.engine.oneshot import engine_for


def test_sleep_frees_the_kv_cache_and_wake_restores_it():
    model = tiny_model(96)
    engine = engine_for(model, max_num_seqs=4, max_model_len=64, prefix_caching=True)
    prompts = prompts_of([20, 33, 7], 96)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    before = [c.token_ids for c in engine.generate(prompts, params)]
    full = kv_cache_bytes(engine)
    cfg = model.config
    assert full == 2 * cfg.n_layer * cfg.n_kv_head * engine.runner.num_slots * cfg.head_dim * 4  # fp32 K and V
    kv = KVSleep(engine)
    assert kv.sleep() == full and kv.asleep
    assert kv_cache_bytes(engine) == 0
    assert not engine.blocks.block_of_hash  # the cached prefixes named memory that is gone
    kv.wake()
    assert kv_cache_bytes(engine) == full and not kv.asleep
    assert [c.token_ids for c in engine.generate(prompts, params)] == before
    kv.wake()  # awake already: nothing to do
    assert kv_cache_bytes(engine) == full


def test_no_sleep_with_requests_in_flight():
    engine = engine_for(tiny_model(96), max_num_seqs=2, max_model_len=64)
    engine.add_request(prompts_of([9], 96)[0], SamplingParams(max_tokens=4, temperature=0.0))
    with pytest.raises(EngineError, match="in flight"):
        KVSleep(engine).sleep()
