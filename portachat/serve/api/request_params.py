"""An OpenAI request's sampling fields and output constraint -> what the engine takes."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool

from portachat.engine.limits import ContextLengthError, reply_budget
from portachat.engine.sampling_params import SamplingError, from_request, with_fields
from portachat.engine.structured import StructuredError, StructuredSpec
from portachat.engine.structured.fields import structured_spec
from portachat.engine.types import EngineError, SamplingParams
from portachat.i18n import _
from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import ChatCompletionRequest, CompletionRequest
from portachat.serve.api.state import ModelLease
from portachat.serve.fallbacks import OPENAI_FALLBACK


def sampling_params(state: ModelLease, req: ChatCompletionRequest | CompletionRequest, prompt_len: int,
                    prompt_param: str) -> SamplingParams:
    """OpenAI fields -> SamplingParams, by the engine's own checks (engine/limits.py: the context;
    engine/sampling_params.py: the fields); their refusals as 400s naming this request's fields."""
    max_tokens, param = requested_max_tokens(req)
    try:
        max_tokens = reply_budget(prompt_len, max_tokens, state.model.max_model_len, state.settings.max_tokens_default)
        fields = {**request_fields(req), "max_tokens": max_tokens, "adapter": state.adapter}
        return from_request(fields, state.model.generation_defaults, OPENAI_FALLBACK,
                            vocab_size=state.model.tokenizer.vocab_size)
    except ContextLengthError as exc:
        raise context_error(exc, prompt_param, param) from None
    except SamplingError as exc:
        raise sampling_error(exc, param) from None


def context_error(exc: ContextLengthError, prompt_param: str, max_tokens_param: str) -> APIError:
    """The engine's context refusal in OpenAI's words, naming the request's fields (`messages`,
    `prompt`, `input`; `max_tokens` or `max_completion_tokens`)."""
    limit, prompt_len, max_tokens = exc.limit, exc.prompt_tokens, exc.max_tokens
    if max_tokens is None:
        return APIError(400, _("This model's maximum context length is {limit} tokens, but the "
                               "{prompt_param} has {prompt_len} tokens. Shorten the {prompt_param}.").format(
                               limit=limit, prompt_param=prompt_param, prompt_len=prompt_len),
                        param=prompt_param, code="context_length_exceeded")
    return APIError(400, _("This model's maximum context length is {limit} tokens. However, you "
                           "requested {total} tokens ({prompt_len} in the {prompt_param}, {max_tokens} "
                           "for the completion). Reduce the {prompt_param} or {param} (at most {room} "
                           "here).").format(limit=limit, total=prompt_len + max_tokens,
                                            prompt_len=prompt_len, prompt_param=prompt_param,
                                            max_tokens=max_tokens, param=max_tokens_param, room=limit - prompt_len),
                    param=max_tokens_param, code="context_length_exceeded")


def sampling_error(exc: SamplingError, max_tokens_param: str) -> APIError:
    """A sampling check's refusal as a 400 naming the request's field (max_tokens may have come from
    max_completion_tokens)."""
    return APIError(400, str(exc), param=max_tokens_param if exc.param == "max_tokens" else exc.param,
                    code="invalid_value")


def requested_max_tokens(req: ChatCompletionRequest | CompletionRequest) -> tuple[int | None, str]:
    """The reply's length the request asks for (None: unset) and the field it came from."""
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens, "max_completion_tokens"
    return req.max_tokens, "max_tokens"


def request_fields(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """The request's sampling fields but max_tokens, as SamplingParams names them (None: unset)."""
    if isinstance(req, ChatCompletionRequest):
        logprobs, top_logprobs = bool(req.logprobs), (req.top_logprobs or 0) if req.logprobs else 0
    else:
        logprobs, top_logprobs = req.logprobs is not None, req.logprobs or 0
    return {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "seed": req.seed, "stop": req.stop_list(), "stop_token_ids": list(req.stop_token_ids or []),
        "ignore_eos": req.ignore_eos, "repetition_penalty": req.repetition_penalty,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "logprobs": logprobs, "top_logprobs": top_logprobs, "logit_bias": logit_bias(req),
        "priority": req.priority,
    }


def check_sampling(req: ChatCompletionRequest | CompletionRequest) -> None:
    """The sampling fields' types and ranges without a model at hand (a batch checks its lines before any
    runs): the checks `sampling_params` makes, less those that need the model (context, vocabulary)."""
    max_tokens, param = requested_max_tokens(req)
    fields = {**request_fields(req), "max_tokens": max_tokens}
    try:
        with_fields(SamplingParams(), fields)
    except SamplingError as exc:
        raise sampling_error(exc, param) from None


def logit_bias(req: ChatCompletionRequest | CompletionRequest) -> dict[int, float]:
    """logit_bias's string keys -> token ids (check_supported has checked that they are digits; the
    sampling check, the values and the vocabulary)."""
    return {int(key): bias for key, bias in (req.logit_bias or {}).items()}


def output_constraint(req: ChatCompletionRequest | CompletionRequest) -> StructuredSpec | None:
    """response_format / structured_outputs / guided_* -> the engine's constraint; 400 naming the field."""
    try:
        return structured_spec(req)
    except StructuredError as exc:
        raise APIError(400, str(exc), param=exc.param) from None


async def compile_constraint(state: ModelLease, spec: StructuredSpec | None) -> None:
    """Compile a request's constraint on a worker thread before it reaches the engine loop (a 400
    naming the part llguidance cannot handle), where the engine offers it."""
    compile_ = getattr(state.model.engine, "compile_constraint", None)
    if spec is None or compile_ is None:
        return
    try:
        await run_in_threadpool(compile_, spec)
    except StructuredError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    except EngineError as exc:  # llguidance is not installed
        raise APIError(500, str(exc), code="engine_error") from None
