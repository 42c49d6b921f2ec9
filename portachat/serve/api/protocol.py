"""OpenAI request bodies (the fields we honour, with OpenAI's ranges) and the errors they give.

Unknown fields are ignored, as OpenAI-compatible servers do, so clients that send extra options
keep working; fields we cannot honour (best_of, suffix, images, ...) get a 400 naming the field.
`stop` takes up to MAX_STOP_SEQUENCES strings: OpenAI allows 4, vLLM any number; 16 keeps
OpenAI's requests working and bounds the matcher's work per token.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticCustomError

from portachat.engine.sampling_params import PENALTY_MAX, SEED_MAX, SEED_MIN, TEMPERATURE_MAX
from portachat.i18n import _
from portachat.serve.api.errors import APIError

MAX_STOP_SEQUENCES = 16
MAX_N = 16  # choices per request: each is a sequence in the batch, sharing the prompt's KV blocks
MAX_LOGIT_BIAS = 300  # OpenAI's own cap on logit_bias entries
# vLLM's prompt_logprobs: top tokens per prompt position. Above OpenAI's 5 and vLLM's default 20 because
# a distillation teacher (`portachat distill --teacher http://...`) asks for its --top-k.
MAX_PROMPT_LOGPROBS = 100
MAX_RESULTS = 50  # OpenAI's bound on max_num_results (vector store search, grounded chat)
MAX_VECTOR_STORE_IDS = 16  # a grounded chat searches each store it names: few, so one request stays cheap
WHOLE_MESSAGE = "portachat_message"  # a validator's error whose text parse_body shows as it is


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # "python" / "python_output": the built-in calculator's call and its result inside an assistant's
    # turn, our chat format's parts (tokenizer/chat.py); a Responses code_interpreter_call item becomes them.
    type: Literal["text", "python", "python_output"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # "developer" is OpenAI's newer name for "system".
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant's earlier reasoning (vLLM's name; `reasoning` newer)
    reasoning: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class Grounding(BaseModel):
    """The chat request's vendor field `documents`: search these vector stores for the last user
    message and answer from the passages found (serve/api/grounding.py)."""

    model_config = ConfigDict(extra="forbid")
    vector_store_ids: list[str] = Field(min_length=1, max_length=MAX_VECTOR_STORE_IDS)
    max_num_results: int = Field(4, ge=1, le=MAX_RESULTS)


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    # Sampling fields: their ranges are checked once, by from_request (engine/
    # sampling_params.py), whose messages are translated; the schema only documents them.
    max_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})
    temperature: float | None = Field(None, json_schema_extra={"minimum": 0.0, "maximum": TEMPERATURE_MAX})
    top_p: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0.0, "maximum": 1.0})
    top_k: int | None = Field(None, json_schema_extra={"minimum": -1})  # vLLM extension; -1 or 0 = off
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    seed: int | None = Field(None, json_schema_extra={"minimum": SEED_MIN, "maximum": SEED_MAX})
    logit_bias: dict[str, float] | None = None  # token id (as a string, JSON keys are) -> -100..100
    presence_penalty: float = Field(0.0, json_schema_extra={"minimum": -PENALTY_MAX, "maximum": PENALTY_MAX})
    frequency_penalty: float = Field(0.0, json_schema_extra={"minimum": -PENALTY_MAX, "maximum": PENALTY_MAX})
    repetition_penalty: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0.0})  # vLLM extension
    ignore_eos: bool = False  # vLLM extension
    priority: int = 0  # vLLM extension: waiting requests are admitted lowest first (batch lines run at 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    keep_alive: str | float | None = None  # Ollama's: how long the model stays loaded afterwards
    # Output constraints (api/structured.py): OpenAI's response_format, vLLM's structured_outputs and
    # its older guided_* spellings.
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_whitespace_pattern: Any = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # Thinking models: extra chat-template variables (vLLM's chat_template_kwargs, e.g.
    # {"enable_thinking": false}) and OpenAI's reasoning_effort, passed to templates that read it.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    documents: Grounding | None = None  # vendor field: grounded chat over vector stores

    @field_validator("documents", mode="wrap")
    @classmethod
    def _documents(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Grounding | None:
        try:
            return handler(value)
        except ValidationError as exc:  # one message for the whole field, naming its shape
            raise PydanticCustomError(WHOLE_MESSAGE, _(
                "Invalid value for 'documents': expected {{\"vector_store_ids\": [..], \"max_num_results\": N}} "
                "({msg}).").format(msg=exc.errors()[0]["msg"])) from None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    # vLLM extension: the top k next tokens at every prompt position (checked in check_supported).
    prompt_logprobs: int | None = Field(None, json_schema_extra={"minimum": 0, "maximum": MAX_PROMPT_LOGPROBS})


def _where(loc: tuple) -> str:
    """pydantic's location ('messages', 0, 'role') as OpenAI writes params: messages[0].role."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[TextPart]", "list[int]", "list[str]", "list[list[int]]", "function-after"):
            continue  # the union branch pydantic tried, not a field
        else:
            out += f".{part}" if out else str(part)
    return out


def json_body(raw: bytes) -> Any:
    """Bytes -> the JSON value, or APIError(400) saying why not."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, _("The request body is not valid JSON ({exc}). Send a JSON object with "
                              "Content-Type: application/json.").format(exc=exc),
                       code="invalid_json") from None
    except RecursionError:  # arrays or objects nested thousands deep: the parser's stack runs out
        raise APIError(400, _("The request body nests JSON arrays or objects too deeply to parse: send a flatter "
                              "body."), code="invalid_json") from None


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """Bytes -> request model, or APIError(400) with a message naming the field and the problem."""
    data = json_body(raw)
    if not isinstance(data, dict):
        raise APIError(400, _("The request body must be a JSON object, got {got}.").format(
                              got=type(data).__name__), code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A union field reports one error per branch; the first names the field well enough.
        first = errors[0]
        param = _where(tuple(first["loc"]))
        if first["type"] == WHOLE_MESSAGE:
            message = first["msg"]
        elif first["type"] == "missing":
            message = _("Missing required parameter: '{param}'.").format(param=param)
        else:
            got = first.get("input")
            shown = json.dumps(got)[:80] if not isinstance(got, dict | list) else type(got).__name__
            message = _("Invalid value for '{param}': {msg} (got {shown}).").format(param=param, msg=first["msg"],
                                                                                     shown=shown)
        raise APIError(400, message, param=param, code="invalid_value") from None


def check_supported(request: ChatCompletionRequest | CompletionRequest) -> None:
    """400 for options this server does not implement, rather than silently ignoring them."""
    stops = request.stop_list()
    if len(stops) > MAX_STOP_SEQUENCES:
        raise APIError(400, _("At most {limit} stop sequences are allowed (got {count}).").format(
                              limit=MAX_STOP_SEQUENCES, count=len(stops)), param="stop")
    if request.stream_options is not None and not request.stream:
        raise APIError(400, _("stream_options is only allowed when stream is true."), param="stream_options")
    if request.logit_bias and len(request.logit_bias) > MAX_LOGIT_BIAS:
        raise APIError(400, _("logit_bias has {count} entries; at most {limit} are allowed.").format(
                              count=len(request.logit_bias), limit=MAX_LOGIT_BIAS),
                       param="logit_bias")
    for key in request.logit_bias or {}:
        if not key.strip().isdigit():
            raise APIError(400, _("Invalid key in 'logit_bias': {key!r} is not a token id (send integer "
                                  "token ids as the keys, e.g. {{\"1234\": -100}}).").format(key=key),
                           param="logit_bias")
    if isinstance(request, ChatCompletionRequest):
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError(400, _("top_logprobs needs logprobs=true."), param="top_logprobs")
    else:
        if request.suffix:
            raise APIError(400, _("suffix (insertion) is not supported by this server."), param="suffix")
        if request.best_of not in (None, 1, request.n):
            raise APIError(400, _("best_of={best_of} is not supported: this server returns every sample it "
                                  "draws (use n={best_of}, or leave best_of out).").format(
                                  best_of=request.best_of), param="best_of")
        if request.prompt_logprobs is not None and not 0 <= request.prompt_logprobs <= MAX_PROMPT_LOGPROBS:
            raise APIError(400, _("prompt_logprobs must be between 0 and {limit} (got {k}): ask for at most {limit} "
                                  "top tokens per prompt position.").format(limit=MAX_PROMPT_LOGPROBS,
                                                                           k=request.prompt_logprobs),
                           param="prompt_logprobs")
        if request.prompt_logprobs is not None and request.stream:
            raise APIError(400, _("prompt_logprobs is not supported with stream: true on this server: send the "
                                  "request without streaming."), param="prompt_logprobs")
