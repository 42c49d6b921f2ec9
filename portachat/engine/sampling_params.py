"""The one mapping from what a caller asked to SamplingParams, and the one check of its fields.

Every interface (the OpenAI and Anthropic routes, `chat`, `generate` and its rows) hands over the
fields its caller set; a field left unset takes the model authors' value (generation_config.json),
then the interface's own fallback (a named SamplingFallback in that interface's module). The
ranges are OpenAI's where OpenAI has the field and vLLM's for its extensions; the engine checks
every request, however it was built, against the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from portachat.engine.types import EngineError, SamplingParams
from portachat.i18n import _

if TYPE_CHECKING:  # annotations only: model.load loads torch, and the flags' checks here must not
    from portachat.model.load import GenerationDefaults

TEMPERATURE_MAX = 2.0  # OpenAI's; past it a draw is close to uniform noise
PENALTY_MAX = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2] (OpenAI's)
LOGIT_BIAS_MAX = 100.0  # OpenAI's: +-100 bans or forces a token
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes

FIELD_ORDER = tuple(f.name for f in fields(SamplingParams))  # errors name the first bad field in this order
FIELD_NAMES = frozenset(FIELD_ORDER)
MODEL_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")  # what generation_config can set


class SamplingError(EngineError):
    """A sampling field out of its type or range; `param` names the field (the API's 400 names it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message, kind="invalid")
        self.param = param


@dataclass(frozen=True)
class SamplingFallback:
    """An interface's own value for a field that neither the request nor the model sets."""

    temperature: float
    max_tokens: int | None = None  # None: the interface always passes max_tokens itself
    top_p: float = 1.0
    top_k: int = 0  # off
    repetition_penalty: float = 1.0  # off


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _between(name: str, value: Any, low: float, high: float) -> None:
    if not _number(value) or not low <= value <= high:
        raise SamplingError(name, _("{name} must be a number from {low} to {high}, got {value}").format(
            name=name, low=f"{low:g}", high=f"{high:g}", value=repr(value)))


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SamplingError(name, _("{name} must be true or false, got {value}").format(name=name, value=repr(value)))


def check_field(name: str, value: Any) -> None:
    """One field's type and range, as SamplingParams holds it; SamplingError naming the field."""
    if name == "max_tokens":
        if not _integer(value) or value < 1:
            raise SamplingError(name, _("{name} must be a positive integer, got {value}").format(
                name=name, value=repr(value)))
    elif name == "temperature":
        _between(name, value, 0.0, TEMPERATURE_MAX)
    elif name == "top_p":
        if not _number(value) or not 0.0 < value <= 1.0:
            raise SamplingError(name, _("{name} must be a number above 0 and at most 1, got {value}").format(
                name=name, value=repr(value)))
    elif name == "top_k":
        if not _integer(value) or value < 0:
            raise SamplingError(name, _("{name} must be an integer >= 0 (0 = off), got {value}").format(
                name=name, value=repr(value)))
    elif name == "seed":
        if value is not None and (not _integer(value) or not SEED_MIN <= value <= SEED_MAX):
            raise SamplingError(name, _("{name} must be an integer from {low} to {high}, got {value}").format(
                name=name, low=SEED_MIN, high=SEED_MAX, value=repr(value)))
    elif name == "repetition_penalty":
        if not _number(value) or value <= 0:
            raise SamplingError(name, _("{name} must be a number above 0 (1 = off), got {value}").format(
                name=name, value=repr(value)))
    elif name in ("presence_penalty", "frequency_penalty"):
        _between(name, value, -PENALTY_MAX, PENALTY_MAX)
    elif name == "stop":
        if not isinstance(value, list) or any(not isinstance(s, str) or not s for s in value):
            raise SamplingError(name, _("{name} must be a string or a list of non-empty strings, got {value}").format(
                name=name, value=repr(value)))
    elif name == "stop_token_ids":
        if not isinstance(value, list) or not all(_integer(t) and t >= 0 for t in value):
            raise SamplingError(name, _("{name} must be a list of token ids, got {value}").format(
                name=name, value=repr(value)))
    elif name == "top_logprobs":
        if not _integer(value) or not 0 <= value <= MAX_TOP_LOGPROBS:
            raise SamplingError(name, _("{name} must be an integer from 0 to {high}, got {value}").format(
                name=name, high=MAX_TOP_LOGPROBS, value=repr(value)))
    elif name == "logit_bias":
        if not isinstance(value, dict):
            raise SamplingError(name, _("{name} must map token ids to numbers, got {value}").format(
                name=name, value=repr(value)))
        for token, bias in value.items():
            if not _integer(token) or token < 0:
                raise SamplingError(name, _("{name} must map token ids to numbers, got {value}").format(
                    name=name, value=repr(token)))
            _between(name, bias, -LOGIT_BIAS_MAX, LOGIT_BIAS_MAX)
    elif name == "priority":
        if not _integer(value):
            raise SamplingError(name, _("{name} must be an integer, got {value}").format(name=name, value=repr(value)))
    elif name in ("ignore_eos", "logprobs", "use_tools"):
        _flag(name, value)


def check_params(params: SamplingParams, vocab_size: int | None = None) -> None:
    """Every field of `params`, then the token ids against the vocabulary when its size is known.
    The engine calls this on each request, the mappers on what they build."""
    for name in FIELD_ORDER:
        check_field(name, getattr(params, name))
    if vocab_size is None:
        return
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", list(params.logit_bias))):
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise SamplingError(name, _("{name}: token id {token} is outside this model's vocabulary "
                                        "(0..{last})").format(name=name, token=bad[0], last=vocab_size - 1))


def with_fields(base: SamplingParams, request: Mapping[str, Any], vocab_size: int | None = None) -> SamplingParams:
    """`base` with every field the caller set (None = unset), checked. A single stop string is a
    list of one; top_k -1 means off (vLLM's spelling)."""
    given = {k: v for k, v in request.items() if v is not None}
    unknown = sorted(set(given) - FIELD_NAMES)
    if unknown:
        raise SamplingError(unknown[0], _("{name} is not a sampling field").format(name=unknown[0]))
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    if given.get("top_k") == -1:
        given["top_k"] = 0
    params = replace(base, **given)
    check_params(params, vocab_size)
    return params


def model_value(defaults: GenerationDefaults, name: str) -> Any:
    """The model authors' value for a field, None where generation_config.json leaves it out."""
    if name == "temperature" and defaults.do_sample is False:
        return 0.0  # the authors chose greedy decoding
    return getattr(defaults, name)


def from_request(request: Mapping[str, Any], defaults: GenerationDefaults | None, fallback: SamplingFallback,
                 vocab_size: int | None = None) -> SamplingParams:
    """Field by field: the request's value, else the model's generation_config, else the interface's
    fallback. The model's max_new_tokens is not used: each interface bounds replies itself (the API
    by the room the context leaves, chat and generate by --max-tokens), as before this mapper."""
    base: dict[str, Any] = {}
    for name in MODEL_FIELDS:
        value = model_value(defaults, name) if defaults is not None else None
        base[name] = getattr(fallback, name) if value is None else value
    if base["top_k"] == -1:  # vLLM's "off", in a generation_config as in a request
        base["top_k"] = 0
    if fallback.max_tokens is not None:
        base["max_tokens"] = fallback.max_tokens
    return with_fields(SamplingParams(**base), request, vocab_size)
