"""GET /openapi.json: the routes' real request and response bodies.

The routes read raw bodies (so that errors keep OpenAI's shape and the body-size guard counts every
byte), so FastAPI cannot see their bodies; this module documents them from the same pydantic request
models the routes parse with, plus response models written after what the routes return (OpenAI's
and Anthropic's shapes). Streaming routes answer `text/event-stream` with the chunk schemas.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from portachat.serve.api.adapters import LoadAdapter, UnloadAdapter
from portachat.serve.api.anthropic import MessagesRequest
from portachat.serve.api.batches import BatchCreate
from portachat.serve.api.embeddings import EmbeddingRequest
from portachat.serve.api.protocol import ChatCompletionRequest, CompletionRequest
from portachat.serve.api.responses import ResponsesRequest
from portachat.serve.api.tokenize import TokenizeReply, TokenizeRequest

# ------------------------------------------------------------------------------------------ responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls", "abort"] | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str]


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls", "abort"] | None


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a streamed chat completion; `[DONE]` ends the stream."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class PromptTokenLogprob(BaseModel):
    logprob: float
    rank: int
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length", "abort"] | None
    # vLLM's, with prompt_logprobs k: None for the first prompt token, then token id -> its log-probability
    prompt_logprobs: list[dict[str, PromptTokenLogprob] | None] | None = None


class Completion(BaseModel):
    """The whole reply, and (with `stream: true`) each `data:` event, `usage` null but on the last."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # floats, or base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    status: str
    size_bytes: int
    keep_alive: Any
    max_model_len: int | None = None
    error: str | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class AnthropicMessage(BaseModel):
    """The reply of POST /v1/messages; streamed, the events are Anthropic's (message_start, ...)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]  # text and tool_use blocks
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None
    line: int | None  # the input file's line (1-based)


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[BatchError]


class Batch(BaseModel):
    """OpenAI's Batch object (POST /v1/batches, GET /v1/batches/{id}, POST .../cancel)."""

    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                    "cancelled"]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens_details: dict[str, int]


class ResponseObject(BaseModel):
    """The reply of POST /v1/responses (and GET /v1/responses/{id})."""

    id: str
    object: Literal["response"]
    created_at: float
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]]  # reasoning, code_interpreter_call (the calculator), message, function_call items
    previous_response_id: str | None
    store: bool
    usage: ResponseUsage | None


class ResponseEvent(BaseModel):
    """One SSE event of a streamed response (`event: <type>`), e.g. response.output_text.delta."""

    type: str
    sequence_number: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorBody(BaseModel):
    error: ErrorDetail


# ------------------------------------------------------------------------------------------ the schema

# path -> (request model, response model, streamed event model or None)
BODIES: dict[str, tuple[type[BaseModel], type[BaseModel], type[BaseModel] | None]] = {
    "/v1/chat/completions": (ChatCompletionRequest, ChatCompletion, ChatCompletionChunk),
    "/v1/completions": (CompletionRequest, Completion, Completion),
    "/v1/embeddings": (EmbeddingRequest, EmbeddingList, None),
    "/v1/messages": (MessagesRequest, AnthropicMessage, None),
    "/v1/batches": (BatchCreate, Batch, None),
    "/v1/responses": (ResponsesRequest, ResponseObject, ResponseEvent),
    "/tokenize": (TokenizeRequest, TokenizeReply, None),
}
# path -> request model, for the routes that answer plain text (vLLM's adapter routes)
TEXT_REPLIES: dict[str, type[BaseModel]] = {"/v1/load_lora_adapter": LoadAdapter,
                                            "/v1/unload_lora_adapter": UnloadAdapter}


def openapi_schema(app: FastAPI, version: str) -> dict[str, Any]:
    """FastAPI's schema of the routes, with the bodies the raw-body routes really read and write."""
    schema = get_openapi(title="portachat", version=version, routes=app.routes,
                         description="OpenAI- and Anthropic-compatible inference server.")
    components: dict[str, Any] = {}

    def ref(model: type[BaseModel]) -> dict[str, str]:
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    error = {"description": "OpenAI-shaped error (Anthropic-shaped on /v1/messages)",
             "content": {"application/json": {"schema": ref(ErrorBody)}}}
    for path, (request_model, response_model, event_model) in BODIES.items():
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": ref(request_model)}}}
        content: dict[str, Any] = {"application/json": {"schema": ref(response_model)}}
        if event_model is not None:
            content["text/event-stream"] = {"schema": ref(event_model)}
        operation["responses"] = {"200": {"description": "The reply", "content": content},
                                  "4XX": error, "5XX": error}
    for path, request_model in TEXT_REPLIES.items():
        schema["paths"][path]["post"].update(
            requestBody={"required": True, "content": {"application/json": {"schema": ref(request_model)}}},
            responses={"200": {"description": "Success: ...", "content": {"text/plain": {"schema": {"type": "string"}}}},
                       "4XX": error})
    schema["paths"]["/v1/models"]["get"]["responses"] = {
        "200": {"description": "The served models", "content": {"application/json": {"schema": ref(ModelList)}}}}
    schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
    return schema
