"""Speculative decoding behind the server: same replies as plain decoding, vLLM's counters on /metrics."""

from __future__ import annotations

import openai
import pytest
from api_testing import chat_tokenizer, metric, served_tiny, start_server, tiny_model, wait_idle

from portachat.engine.speculative import SpeculativeConfig

HELLO = [{"role": "user", "content": "Hello there, good sir"}]


@pytest.fixture(scope="module")
def tok(small_tokenizer):
    return chat_tokenizer(small_tokenizer)


def test_replies_match_plain_decoding_and_metrics_count_drafts(tok):
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft=tiny_model(tok.vocab_size))
    servers = [start_server(served_tiny(tok)), start_server(served_tiny(tok, speculative=spec))]
    try:
        replies = []
        for server in servers:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
            args = dict(model="tiny", messages=HELLO, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
            full = client.chat.completions.create(**args).choices[0].message.content
            streamed = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(**args, stream=True) if c.choices)  # fmt: skip
            assert streamed == full
            replies.append(full)
            wait_idle(server.url)
        assert replies[0] == replies[1] and replies[0]
        plain, fast = (s.url for s in servers)
        assert metric(plain, "portachat:spec_decode_num_drafts_total") == 0
        drafts = metric(fast, "portachat:spec_decode_num_drafts_total")
        draft_tokens = metric(fast, "portachat:spec_decode_num_draft_tokens_total")
        accepted = metric(fast, "portachat:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and draft_tokens >= drafts
        assert accepted == draft_tokens  # the draft is the target itself
        assert metric(fast, "portachat:spec_decode_num_accepted_tokens_per_pos_total") == accepted
    finally:
        for server in servers:
            server.stop()
