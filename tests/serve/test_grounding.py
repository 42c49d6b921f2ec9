"""Grounded chat over the request model parsed once: `documents` is a field of ChatCompletionRequest,
and grounding (serve/api/grounding.py) searches what it holds, without reading the body again."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from api_testing import chat_tokenizer

from portachat.serve.api import grounding
from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import ChatCompletionRequest, Grounding, parse_body
from portachat.serve.docs import Hit

HITS = [Hit("file-a", "a.txt", 0, 0, 20, "Etna is in Sicily.", 0.9),
        Hit("file-b", "b.txt", 3, 40, 70, "Yeast makes dough rise.", 0.5)]


class BodyReadOnce:
    """A request whose body was read by the route already: reading it again fails the test."""

    app = SimpleNamespace()

    async def body(self) -> bytes:
        raise AssertionError("the body was read again")


def _body(**extra) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "Where is Etna?"}], **extra}).encode()


def test_documents_are_parsed_with_the_request_and_grounded_without_reading_the_body(small_tokenizer, monkeypatch):
    req = parse_body(_body(documents={"vector_store_ids": ["vs_1", "vs_2"], "max_num_results": 2}),
                     ChatCompletionRequest)
    assert req.documents == Grounding(vector_store_ids=["vs_1", "vs_2"], max_num_results=2)
    searched = []

    async def search_hits(request, store_ids, query, k):
        searched.append((store_ids, query, k))
        return HITS

    monkeypatch.setattr(grounding, "search_hits", search_hits)
    lease = SimpleNamespace(model=SimpleNamespace(max_model_len=2048, tokenizer=chat_tokenizer(small_tokenizer)))
    cited = asyncio.run(grounding.ground_chat(BodyReadOnce(), req, lease))
    assert searched == [(["vs_1", "vs_2"], "Where is Etna?", 2)]
    assert [(c["index"], c["file_id"], c["chunk_index"]) for c in cited] == [(1, "file-a", 0), (2, "file-b", 3)]
    system = req.messages[0].text()  # the passages join the client's own system message, numbered as cited
    assert system.startswith("Be brief.\n\n") and "[1] a.txt (part 1)\nEtna is in Sicily." in system
    assert "[2] b.txt (part 4)" in system and [m.role for m in req.messages] == ["system", "user"]
    plain = parse_body(_body(), ChatCompletionRequest)
    assert asyncio.run(grounding.ground_chat(BodyReadOnce(), plain, lease)) is None and len(plain.messages) == 2


@pytest.mark.parametrize("documents", [{"vector_store_ids": []}, {"vector_store_ids": ["a"], "max_num_results": 0},
                                       {"vector_store_ids": ["a"], "extra": 1}, ["vs_1"]])
def test_bad_documents_are_one_400_naming_the_field(documents):
    with pytest.raises(APIError) as caught:
        parse_body(_body(documents=documents), ChatCompletionRequest)
    assert caught.value.status == 400 and caught.value.param == "documents"
    assert str(caught.value).startswith("Invalid value for 'documents': expected {\"vector_store_ids\": [..], ")
