"""n > 1 and top_logprobs with the real SmolLM2-135M-Instruct (GGUF, fp32) behind the real server and
the openai client: n=4 computes the prompt's blocks once, top_logprobs=5 equal a plain forward."""

from __future__ import annotations

import openai
import pytest
import torch
from api_testing import start_server

from portachat.device import get_device
from portachat.engine import EngineConfig, LLMEngine
from portachat.engine.served import ServedModel
from tests.smollm2 import smollm2_gguf_path

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "Name three colours of the rainbow and say why the sky is blue."}]


@pytest.fixture(scope="module")
def smol():
    from portachat.model.load import load_for_inference

    return load_for_inference(smollm2_gguf_path(), device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def served(smol):
    config = EngineConfig(dtype="fp32", compile=False, max_model_len=512, block_size=16, num_blocks=160,
                          max_num_seqs=8, max_num_batched_tokens=256)
    engine = LLMEngine(smol.model, smol.tokenizer, config, device=get_device("cpu"))
    return ServedModel(engine=engine, tokenizer=smol.tokenizer, max_model_len=engine.max_model_len)


@pytest.fixture(scope="module")
def client(served):
    running = start_server(served, served_model_name="smol")
    yield openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0, timeout=300)
    running.stop()


def test_n4_uses_the_prompt_blocks_once(client, served, smol):
    prompt_len = len(smol.tokenizer.render_prompt(QUESTION))
    before = served.engine.stats()["prefix_cache_hits"]
    reply = client.chat.completions.create(model="smol", messages=QUESTION, n=4, max_tokens=12, temperature=0.8,
                                           seed=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage.prompt_tokens == prompt_len
    assert served.engine.stats()["prefix_cache_hits"] - before == 3 * ((prompt_len - 1) // 16)


def test_top_logprobs_5_match_a_plain_forward(client, smol):
    reply = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=5)
    ids = smol.tokenizer.render_prompt(QUESTION)
    content = reply.choices[0].logprobs.content
    assert len(content) >= 4
    with torch.no_grad():
        for entry in content:
            logprobs = torch.log_softmax(smol.model(torch.tensor([ids]))[0, -1].float(), dim=-1)
            values, top = torch.topk(logprobs, 5)
            assert [a.bytes for a in entry.top_logprobs] == [list(smol.tokenizer.token_bytes(int(t))) for t in top]
            for alt, value in zip(entry.top_logprobs, values.tolist(), strict=True):
                assert abs(alt.logprob - value) < 1e-4
            ids.append(int(top[0]))  # greedy: the chosen token is the first alternative
            assert entry.bytes == entry.top_logprobs[0].bytes
