"""The asyncio bridge over the real engine: outputs in order, refusals before the stream, a step that
raises fails only what it held, shutdown ends every stream."""

from __future__ import annotations

import asyncio

import pytest
from api_testing import chat_tokenizer, served_tiny

from portachat.engine import EngineError, SamplingParams
from portachat.engine.async_engine import AsyncEngine, EngineShutdown


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


def test_concurrent_requests_get_their_own_outputs_equal_to_offline(tok):
    served = served_tiny(tok)
    prompts = [tok.encode(text) for text in ("To be", "or not to be", "that is the question")]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    offline = [c.token_ids for c in served.engine.generate(prompts, params)]
    engine = AsyncEngine(served.engine)

    async def one(prompt):
        ids, last = [], None
        async for out in engine.generate(prompt, params):
            ids += out.token_ids
            last = out
        return ids, last

    async def run():
        return await asyncio.gather(*(one(p) for p in prompts))

    try:
        results = asyncio.run(run())
        assert [ids for ids, _ in results] == offline
        assert all(last.finished and last.finish_reason == "length" for _, last in results)
        with pytest.raises(EngineError) as refused:
            asyncio.run(one(tok.encode("x") * 300))  # past max_model_len 256: refused before any output
        assert refused.value.kind == "too_long"
        assert engine.num_in_flight() == 0
    finally:
        engine.shutdown()


class _FailingOnce:
    """The real engine, except that one step raises (a failure the engine did not catch itself)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.fail_next = False

    def step(self):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_step_that_raises_fails_its_requests_and_the_engine_goes_on(tok):
    served = served_tiny(tok)
    flaky = _FailingOnce(served.engine)
    engine = AsyncEngine(flaky)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)

    async def run():
        outputs = []
        async for out in engine.generate(tok.encode("Hello"), params):
            outputs.append(out)
            if len(outputs) == 2:
                flaky.fail_next = True
        after = [out async for out in engine.generate(tok.encode("Hello"), SamplingParams(max_tokens=3))]
        return outputs, after

    try:
        outputs, after = asyncio.run(run())
        assert outputs[-1].finished and outputs[-1].finish_reason == "error"
        assert "illegal memory access" in outputs[-1].error
        assert after[-1].finished and after[-1].finish_reason in ("length", "stop")
        assert not served.engine.has_unfinished() and served.engine.stats()["kv_cache_usage"] == 0.0
    finally:
        engine.shutdown()


def test_shutdown_ends_streams_and_refuses_new_requests(tok):
    served = served_tiny(tok)
    engine = AsyncEngine(served.engine)
    params = SamplingParams(max_tokens=200, temperature=1.0, ignore_eos=True)

    async def run():
        stream = await engine.add(tok.encode("Hello"), params)
        first = await stream.__aiter__().__anext__()
        await asyncio.to_thread(engine.shutdown)
        rest = [out async for out in stream]
        return first, rest

    first, rest = asyncio.run(run())
    assert not first.finished
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert not engine.is_alive and not served.engine.has_unfinished()

    async def late():
        await engine.add(tok.encode("Hi"), params)

    with pytest.raises(EngineShutdown):
        asyncio.run(late())
