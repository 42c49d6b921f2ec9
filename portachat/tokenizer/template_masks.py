"""Loss masks for an existing model's chat template (Llama / SmolLM2, Qwen: a Jinja template, not ours).

The template decides the text; we only need to know which tokens the assistant wrote. For each
assistant message i the template is rendered twice more: messages[:i] with the generation prompt
(the text up to where the reply starts: exactly the prompt the model sees at inference) and
messages[:i+1] (the text up to the end of that reply). Both must be prefixes of the whole
conversation's rendering; the piece between them is the reply. Pieces are encoded on their own, so a
reply's first token is the one the model produces after the inference prompt.

Supervised (mask 1): the reply's tokens up to and including the first end-of-turn / stop token
(`<|im_end|>`, `<|eot_id|>`, ...), so the model learns to stop. Template glue after it (a newline),
system and user text and the generation prompt get 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from portachat.i18n import _
from portachat.tokenizer.errors import ChatFormatError

if TYPE_CHECKING:
    from portachat.tokenizer.chat_tokenizer import TemplateChatTokenizer


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages with string contents, as any template reads them. An assistant content given as parts
    (our GSM8K rendering: text, python call, python output) keeps its text parts only: the calculator
    format is ours, and GSM8K's text around a call already holds the result ("48/2 = 24 clips")."""
    if isinstance(messages, Mapping) and "messages" in messages:
        messages = messages["messages"]
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ChatFormatError(_("a conversation must be a non-empty list of {'role', 'content'} messages"))
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ChatFormatError(_("message {index}: expected a dict with 'role' and 'content', got {message}").format(
                index=i, message=repr(m)))
        content = m["content"]
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content
                              if isinstance(p, Mapping) and p.get("type", "text") == "text")
        elif not isinstance(content, str):
            raise ChatFormatError(_("message {index}: content must be a string or a list of parts").format(index=i))
        out.append({"role": m["role"], "content": content})
    return out


def _render(tokenizer: TemplateChatTokenizer, messages: list[dict[str, Any]], generation_prompt: bool,
            nonce: str) -> str:
    # Each render escapes control strings typed in contents with its own random nonce; use one nonce
    # for all renders so that the texts compare.
    text, own = tokenizer.render_text(messages, add_generation_prompt=generation_prompt)
    return text.replace(own, nonce)


def render_template_conversation(
    tokenizer: TemplateChatTokenizer, messages: Any, max_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 = train on it) of a conversation in the model's own chat format,
    cut to `max_tokens` if given."""
    if max_tokens is not None and max_tokens <= 0:
        raise ChatFormatError(_("max_tokens must be positive or None, got {value}").format(value=max_tokens))
    msgs = template_messages(messages)
    full, nonce = tokenizer.render_text(msgs, add_generation_prompt=False)
    stops = tokenizer.stop_ids
    ids: list[int] = []
    mask: list[int] = []
    pos = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if i == 0:
            raise ChatFormatError(_("message 0: a conversation cannot start with an assistant reply"))
        prompt = _render(tokenizer, msgs[:i], True, nonce)
        upto = _render(tokenizer, msgs[: i + 1], False, nonce)
        if not (full.startswith(upto) and upto.startswith(prompt) and len(prompt) >= pos):
            raise ChatFormatError(
                _("message {index}: this chat template renders a conversation differently from its beginning "
                  "(e.g. it rewrites or drops earlier turns), so the reply's tokens cannot be located for the "
                  "loss mask. Fine-tune on single-turn conversations, or use a model whose template extends "
                  "the rendering of earlier turns.").format(index=i)
            )
        start, end = len(prompt), len(upto)
        before = tokenizer.encode_rendered(full[pos:start], nonce) if start > pos else []
        ids.extend(before)
        mask.extend([0] * len(before))
        reply = tokenizer.encode_rendered(full[start:end], nonce)
        supervised = next((k + 1 for k, t in enumerate(reply) if t in stops), len(reply))
        ids.extend(reply)
        mask.extend([1] * supervised + [0] * (len(reply) - supervised))
        pos = end
    if pos < len(full):
        tail = tokenizer.encode_rendered(full[pos:], nonce)
        ids.extend(tail)
        mask.extend([0] * len(tail))
    if max_tokens is not None:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    return ids, mask


def render_template_prompt(tokenizer: TemplateChatTokenizer, messages: Any) -> list[int]:
    """Prompt ids asking for the next assistant turn (a trailing reference reply is dropped)."""
    msgs = template_messages(messages)
    if msgs[-1]["role"] == "assistant":
        msgs = msgs[:-1]
    return tokenizer.render_prompt(msgs)
