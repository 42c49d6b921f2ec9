"""Two engine replicas behind one real server: every stream succeeds, greedy replies equal one
engine's, both replicas take work, and /metrics counts each request once."""

from __future__ import annotations

import asyncio

import openai
import pytest

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine
from portachat.engine.served import ServedModel
from tests.serve.api_testing import chat_tokenizer, metric, served_tiny, start_server, tiny_model, wait_idle


def _engine(tok):
    config = EngineConfig(dtype="fp32", compile=False, max_model_len=256, block_size=16, num_blocks=72,
                          max_num_seqs=8, max_num_batched_tokens=256)
    return LLMEngine(tiny_model(tok.vocab_size, seed=4), tok, config, device=get_device("cpu"))


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


async def _many(url: str, prompts: list[str], stream: bool) -> list[str]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)

    async def one(prompt: str) -> str:
        if not stream:
            out = await client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
            return out.choices[0].text
        text = ""
        async for chunk in await client.completions.create(model="tiny", prompt=prompt, max_tokens=12,
                                                           temperature=0, stream=True):
            text += chunk.choices[0].text
        return text

    try:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    finally:
        await client.close()


def test_two_replicas_serve_32_streams_as_one_engine_would(tok):
    prompts = [f"the king {i} said" for i in range(32)]
    single = start_server(served_tiny(tok, model=tiny_model(tok.vocab_size, seed=4)))
    try:
        expected = asyncio.run(_many(single.url, prompts, stream=False))
    finally:
        single.stop()

    front = _engine(tok)
    served = ServedModel(engine=front, tokenizer=tok, max_model_len=256, replicas=[_engine(tok)])
    server = start_server(served)
    try:
        assert asyncio.run(_many(server.url, prompts, stream=True)) == expected
        assert asyncio.run(_many(server.url, prompts, stream=False)) == expected
        wait_idle(server.url)
        assert metric(server.url, "portachat:request_success_total") == 64  # each request once
        dp = server.server.portachat_app.state.server.registry.get("tiny").engine
        assert len(dp.replicas) == 2 and min(dp.requests_per_replica) >= 8  # both took a share
        assert sum(dp.requests_per_replica) == 64
    finally:
        server.stop()
