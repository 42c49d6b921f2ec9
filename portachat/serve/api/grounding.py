"""Grounded chat (the chat request's vendor field `documents`, parsed with the request into
`protocol.Grounding`): search the named vector stores for the last user message, put the best
passages into the conversation as a system message, and return the citations the reply carries
(streamed: on its first chunk, streaming.chat_stream; whole: beside its choices)."""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from portachat.i18n import _
from portachat.serve.api.documents import search_hits
from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import ChatCompletionRequest, ChatMessage
from portachat.serve.api.state import ModelLease
from portachat.serve.docs import Hit
from portachat.serve.docs.grounding import citations, passages_prompt

PASSAGE_SHARE = 0.5  # of the chat model's context, at most, for the passages: the rest is the conversation and reply


async def ground_chat(request: Request, req: ChatCompletionRequest, state: ModelLease) -> list[dict] | None:
    """If the request names `documents`, put the best passages into the conversation as a system
    message (rewriting `req.messages`) and return the citations; None for an ordinary request.
    Passages beyond half the chat model's context are left out, worst first."""
    grounding = req.documents
    if grounding is None:
        return None
    query = next((m.text() for m in reversed(req.messages) if m.role == "user"), "")
    if not query.strip():
        raise APIError(400, _("'documents' needs a user message to search for."), param="messages")
    hits = await search_hits(request, grounding.vector_store_ids, query, grounding.max_num_results)
    hits = await run_in_threadpool(_fitting, hits, state)
    if hits:
        system = passages_prompt(hits)
        messages = list(req.messages)
        if messages and messages[0].role in ("system", "developer"):
            messages[0] = ChatMessage(role=messages[0].role, content=f"{messages[0].text()}\n\n{system}")
        else:
            messages.insert(0, ChatMessage(role="system", content=system))
        req.messages = messages
    return citations(hits)


def _fitting(hits: list[Hit], state: ModelLease) -> list[Hit]:
    budget = int(state.model.max_model_len * PASSAGE_SHARE)
    kept, used = [], 0
    for hit in hits:  # best first
        used += len(state.model.tokenizer.encode(hit.text)) + 16  # + its header line
        if used > budget:
            break
        kept.append(hit)
    return kept
