"""vLLM's prompt_logprobs on /v1/completions and its POST /tokenize: what a remote distillation teacher
reads. The served tiny model's own forward, run here, is the reference."""

from __future__ import annotations

import httpx
import pytest
import torch
from api_testing import chat_tokenizer, served_tiny, start_server, tiny_model

from portachat.serve.api.protocol import MAX_PROMPT_LOGPROBS


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


@pytest.fixture(scope="module")
def server(tok):
    running = start_server(served_tiny(tok))
    yield running
    running.stop()


def reference(tok, prompt: list[int]) -> torch.Tensor:
    """log-softmax of the same tiny model (same seed) over the prompt, fp32: row p predicts prompt[p + 1]."""
    model = tiny_model(tok.vocab_size)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt])).float()[0], -1)


def test_token_id_prompt_gets_the_top_k_at_every_position_in_vllms_layout(server, tok):
    prompt = [5, 9, 40, 77, 120, 3, 200, 17, 300, 18]
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    positions = r.json()["choices"][0]["prompt_logprobs"]
    assert len(positions) == len(prompt) and positions[0] is None
    expected = reference(tok, prompt)
    for p in range(1, len(prompt)):
        entries = {int(t): e for t, e in positions[p].items()}
        values, ids = expected[p - 1].topk(3)
        for rank, (t, v) in enumerate(zip(ids.tolist(), values.tolist(), strict=True), start=1):
            assert entries[t]["rank"] == rank and abs(entries[t]["logprob"] - v) < 1e-4
            assert entries[t]["decoded_token"] == tok.token_bytes(t).decode("utf-8", "replace") or \
                entries[t]["decoded_token"].startswith("bytes:")
        own = entries[prompt[p]]  # the prompt's own token, with its rank, even outside the top 3
        assert abs(own["logprob"] - expected[p - 1, prompt[p]].item()) < 1e-4
        assert own["rank"] == int((expected[p - 1] > expected[p - 1, prompt[p]]).sum()) + 1
        assert len(entries) in (3, 4)


def test_text_prompt_with_k_zero_gets_only_its_own_tokens(server, tok):
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "To be, or not to be", "max_tokens": 2, "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    positions = body["choices"][0]["prompt_logprobs"]
    assert len(positions) == body["usage"]["prompt_tokens"] and positions[0] is None
    assert all(len(p) == 1 for p in positions[1:])
    plain = httpx.post(f"{server.url}/v1/completions", timeout=60, json={"model": "tiny", "prompt": "Hi", "max_tokens": 1})
    assert "prompt_logprobs" not in plain.json()["choices"][0]


@pytest.mark.parametrize("extra", [{"prompt_logprobs": MAX_PROMPT_LOGPROBS + 1}, {"prompt_logprobs": -1},
                                   {"prompt_logprobs": 2, "stream": True}])
def test_a_bad_prompt_logprobs_gets_400_naming_it(server, extra):
    r = httpx.post(f"{server.url}/v1/completions", timeout=30,
                   json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt_logprobs" and "prompt_logprobs" in error["message"]


def test_tokenize_gives_the_served_models_ids(server, tok):
    text = "Now is the winter of our discontent"
    r = httpx.post(f"{server.url}/tokenize", timeout=30, json={"model": "tiny", "prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == list(tok.encode(text)) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 256
    assert httpx.post(f"{server.url}/tokenize", timeout=30, json={"model": "tiny"}).status_code == 400


def test_tokenize_and_prompt_logprobs_sit_behind_the_api_keys(tok):
    running = start_server(served_tiny(tok), api_keys=["secret"])
    try:
        assert httpx.post(f"{running.url}/tokenize", json={"prompt": "x"}, timeout=30).status_code == 401
        assert httpx.post(f"{running.url}/tokenize", content=b"prompt=x", timeout=30,
                          headers={"Authorization": "Bearer secret",
                                   "Content-Type": "application/x-www-form-urlencoded"}).status_code == 415
        ok = httpx.post(f"{running.url}/tokenize", json={"prompt": "x"}, headers={"Authorization": "Bearer secret"},
                        timeout=30)
        assert ok.status_code == 200 and ok.json()["count"] >= 1
    finally:
        running.stop()
