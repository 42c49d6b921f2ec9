"""ChatTokenizer implementations: ours (nanochat format) and those of existing models (a
`tokenizers.Tokenizer` plus a Jinja chat template, from an HF directory or a GGUF file).

The rule both keep: control tokens come only from the chat format, never from text. A user who
types "<|im_end|>" gets the characters, not the end-of-turn token. For a template that means
rendering to a string and then encoding it in two kinds of pieces: the template's own control
tokens become their ids, everything else is encoded as plain text. HF's `apply_chat_template`
encodes the rendered string with every added token recognised, splitting around them first;
for conversations without control strings in their content the ids are therefore equal.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from portachat.i18n import _
from portachat.storage.atomic import write_text_atomic
from portachat.tokenizer.bpe import (
    OUTPUT_END,
    OUTPUT_START,
    PYTHON_END,
    PYTHON_START,
    Tokenizer,
    _byte_decoder,
)
from portachat.tokenizer.chat import render_for_completion
from portachat.tokenizer.errors import ChatFormatError, TokenizerFormatError
from portachat.tokenizer.protocol import ToolTokens

# End-of-turn tokens of common chat formats: a fallback when the template does not reveal its own.
KNOWN_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>", "<|endoftext|>")


def _token_text_bytes(token: str, byte_of: dict[str, int]) -> bytes:
    """Raw bytes of a byte-level BPE token string (each char is one byte in GPT-2's alphabet)."""
    if all(c in byte_of for c in token):
        return bytes(byte_of[c] for c in token)
    return token.encode("utf-8")


class PortachatChatTokenizer:
    """Our tokenizer as a ChatTokenizer: nanochat's chat format and the calculator tool."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        special = tokenizer.special_ids
        self._stop_ids = set(tokenizer.end_ids)  # <|assistant_end|> and <|bos|> (a new document)
        self._tool = ToolTokens(special[PYTHON_START], special[PYTHON_END], special[OUTPUT_START], special[OUTPUT_END])
        self._special_ids = frozenset(special.values())
        self._bytes: list[bytes] | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_id

    @property
    def stop_ids(self) -> set[int]:
        return set(self._stop_ids)

    @property
    def tool_tokens(self) -> ToolTokens | None:
        return self._tool

    @property
    def chat_template(self) -> str | None:
        return None  # our chat format is rendered in code (tokenizer/chat.py), not by a template

    @property
    def adds_bos(self) -> bool:
        """Plain-text prompts start with <|bos|>: our models were trained on bos-led documents."""
        return True

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` without control tokens (the same text their `token_bytes` make)."""
        specials = self._special_ids
        return self.tokenizer.decode([i for i in ids if i not in specials])

    def token_bytes(self, token_id: int) -> bytes:
        if self._bytes is None:
            byte_of = _byte_decoder()
            specials = set(self.tokenizer.special_ids.values())
            self._bytes = [
                b"" if i in specials else _token_text_bytes(self.tokenizer.id_to_token(i), byte_of)
                for i in range(self.vocab_size)
            ]
        return self._bytes[token_id]

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                      template_kwargs: dict[str, Any] | None = None) -> list[int]:
        # Our chat format reads no template variables (it does not think): template_kwargs change nothing.
        if tools:
            raise ChatFormatError(
                _("this model's chat format has only the built-in calculator tool, no function tools; serve a model "
                  "whose chat template takes tools, or give one with `portachat serve --chat-template FILE`")
            )
        return render_for_completion(self.tokenizer, messages)


# ----------------------------------------------------------------------------- Jinja chat templates



@lru_cache(maxsize=16)
def _compile_template(template: str) -> Any:
    """Compile a chat template the way transformers does (sandboxed, same options and helpers)."""
    import jinja2  # deferred: chat templates only
    from jinja2.ext import Extension, loopcontrols  # deferred: chat templates only
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # deferred: chat templates only

    class GenerationTag(Extension):  # `{% generation %}` marks assistant text for HF's masks; a no-op here
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise ChatFormatError(_("the model's chat template refused this conversation: {message}").format(message=message))

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):  # as HF: no dunder attributes through namespace()
        def __setitem__(self, name: str, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")
            super().__setitem__(name, value)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = Namespace
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerFormatError(_("the chat template is not valid Jinja ({error}); fix chat_template").format(
            error=exc)) from exc


def _plain_content(content: Any) -> Any:
    """OpenAI-style content parts [{"type": "text", "text": ...}] joined into one string; strings as is."""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type", "text") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _token_content(token: Any) -> str | None:
    """tokenizer_config.json spells special tokens as strings or as {"content": ...} dicts."""
    if isinstance(token, Mapping):
        token = token.get("content")
    return token if isinstance(token, str) else None


class TemplateChatTokenizer:
    """An existing model's tokenizer (`tokenizers.Tokenizer`) with its Jinja chat template.

    `tokenizer_config` is tokenizer_config.json's dict (chat_template, bos_token, eos_token, ...);
    `eos_ids` are the generation config's eos ids. Stop ids are those plus the template's
    end-of-turn token (found by rendering a short exchange).
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        tokenizer_config: Mapping[str, Any],
        eos_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self._hf = HFTokenizer.from_str(tokenizer.to_str())  # private copies: we flip a switch below
        self._hf.encode_special_tokens = True  # plain encoding: specials typed in text stay text
        self._hf_template = HFTokenizer.from_str(tokenizer.to_str())
        self._hf_template.encode_special_tokens = False  # the template's output: specials are control tokens
        template = chat_template or tokenizer_config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...] (older multi-template form)
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default") or next(iter(named.values()), None)
        if not isinstance(template, str) or not template.strip():
            raise TokenizerFormatError(
                _("this model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja); "
                  "it is a base model: use it for completions, or add a chat template to its directory")
            )
        self.chat_template = template
        self.tokenizer_config = dict(tokenizer_config)
        self._template = _compile_template(template)
        self._special_strings = {
            name: _token_content(tokenizer_config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        added = self._hf.get_added_tokens_decoder()
        self._specials: dict[str, int] = {t.content: i for i, t in added.items() if t.special}
        self._strip = {t.content: (t.lstrip, t.rstrip) for t in added.values() if t.special}
        # Longest first, so that a special that is a prefix of another never wins (as HF's matcher).
        ordered = sorted(self._specials, key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
        bos = self._special_strings["bos_token"]
        self._bos_id = self._hf.token_to_id(bos) if bos else None
        stop = set(int(i) for i in eos_ids)
        eos = self._special_strings["eos_token"]
        if eos and self._hf.token_to_id(eos) is not None:
            stop.add(self._hf.token_to_id(eos))
        stop |= self._end_of_turn_ids()
        if not stop:
            raise TokenizerFormatError(
                _("cannot tell which token ends a reply: no eos_token_id in generation_config.json or config.json, "
                  "no eos_token in tokenizer_config.json, and the chat template shows no end-of-turn token")
            )
        self._stop_ids = stop
        self._bytes: list[bytes] | None = None

    # ---- the protocol ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def stop_ids(self) -> set[int]:
        return set(self._stop_ids)

    @property
    def tool_tokens(self) -> ToolTokens | None:
        return None

    @property
    def adds_bos(self) -> bool:
        """Whether the tokenizer puts BOS before encoded text (its post-processor: what transformers and
        vLLM do to a completion prompt, and what a GGUF's add_bos_token became when it was read)."""
        if self._bos_id is None:
            return False
        return self._hf_template.encode("", add_special_tokens=True).ids[:1] == [self._bos_id]

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` without control tokens (the same text their `token_bytes` make)."""
        return self._hf.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        if self._bytes is None:
            self._bytes = self._all_token_bytes()
        return self._bytes[token_id]

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                      template_kwargs: dict[str, Any] | None = None) -> list[int]:
        return self.encode_rendered(*self.render_text(messages, add_generation_prompt=True, tools=tools,
                                                      template_kwargs=template_kwargs))

    def with_chat_template(self, template: str) -> TemplateChatTokenizer:
        """The same tokenizer rendering with another chat template (`serve --chat-template FILE`)."""
        return TemplateChatTokenizer(self._hf_template, self.tokenizer_config, self._stop_ids, chat_template=template)

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template renders a `tools` list (Qwen2.5/Qwen3, Llama 3.x, Hermes-style)."""
        return "tools" in self.chat_template

    # ---- saving next to a checkpoint (same interface as our Tokenizer) --------------------------

    @property
    def eos_id(self) -> int | list[int]:
        """generation_config.json's eos_token_id: every stop id (an int when there is one)."""
        ids = sorted(self._stop_ids)
        return ids[0] if len(ids) == 1 else ids

    @property
    def end_ids(self) -> list[int]:
        """Every stop id, as generation_config.json lists them."""
        return sorted(self._stop_ids)

    def fingerprint(self) -> str:
        """Short hash of what decides the ids (the tokenizer JSON), to catch mismatched checkpoints."""
        blob = self._hf_template.to_str().encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    def save(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """Write tokenizer.json and tokenizer_config.json (chat template inside) as the model shipped them."""
        directory = Path(directory)
        config = {**self.tokenizer_config, "chat_template": self.chat_template}
        if model_max_length is not None:
            config["model_max_length"] = int(model_max_length)
        write_text_atomic(directory / "tokenizer.json", self._hf_template.to_str(pretty=True))
        write_text_atomic(directory / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    # ---- rendering -------------------------------------------------------------------------

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> tuple[str, str]:
        """The template's output for `messages`, with every control string inside message contents
        replaced by a placeholder; returns (text, nonce) for `encode_rendered`. `template_kwargs` are
        extra template variables (HF's apply_chat_template **kwargs: enable_thinking, reasoning_effort)."""
        if not isinstance(messages, list) or not messages:
            raise ChatFormatError(_("a conversation must be a non-empty list of {'role', 'content'} messages"))
        nonce = secrets.token_hex(8)
        escaped = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m:
                raise ChatFormatError(_("message {index}: expected a dict with 'role' and 'content', got {message}").format(
                    index=i, message=repr(m)))
            m = {k: self._escape(_plain_content(v) if k == "content" else v, nonce) for k, v in m.items()}
            for key in ("reasoning_content", "thinking", "reasoning"):  # as HF: the names templates read
                if m.get(key) is not None:
                    m = {"thinking": m[key], **m, "reasoning_content": m[key]}
                    break
            escaped.append(m)
        specials = {k: v for k, v in self._special_strings.items() if v is not None}
        try:
            text = self._template.render(
                **self._escape(dict(template_kwargs or {}), nonce), messages=escaped,
                tools=self._escape(tools, nonce) if tools else None, documents=None,
                add_generation_prompt=add_generation_prompt, **specials,
            )
        except ChatFormatError:
            raise
        except Exception as exc:  # a template error is the template's message, not a crash
            raise ChatFormatError(_("the model's chat template failed on this conversation: {error}").format(
                error=exc)) from exc
        return text, nonce

    def encode_rendered(self, text: str, nonce: str) -> list[int]:
        """Ids of rendered template output: its control strings as control ids, the rest as plain text
        (placeholders turned back into the characters the user typed)."""
        if f"\ue000{nonce}" not in text:  # nothing was escaped: encode exactly as apply_chat_template does
            return self._hf_template.encode(text, add_special_tokens=False).ids
        return self.encode_pieces(text, nonce)

    def encode_pieces(self, text: str, nonce: str = "") -> list[int]:
        """Split at the control strings and encode the text between them on its own, which is what
        `tokenizers` does around added tokens (byte-level BPE: the same ids as one encode)."""
        ids: list[int] = []
        pieces = self._split_specials(text)
        for i, (piece, is_special) in enumerate(pieces):
            if is_special:
                ids.append(self._specials[piece])
                continue
            # Added tokens with lstrip/rstrip swallow the whitespace beside them (HF does the same).
            if i > 0 and self._strip[pieces[i - 1][0]][1]:
                piece = piece.lstrip()
            if i + 1 < len(pieces) and self._strip[pieces[i + 1][0]][0]:
                piece = piece.rstrip()
            if piece:
                ids.extend(self.encode(self._unescape(piece, nonce)))
        return ids

    def _split_specials(self, text: str) -> list[tuple[str, bool]]:
        if self._special_re is None:
            return [(text, False)]
        pieces, start = [], 0
        for m in self._special_re.finditer(text):
            if m.start() > start:
                pieces.append((text[start : m.start()], False))
            pieces.append((m.group(), True))
            start = m.end()
        if start < len(text):
            pieces.append((text[start:], False))
        return pieces

    def _escape(self, value: Any, nonce: str) -> Any:
        """Replace control strings in (nested) message data with placeholders no template can match."""
        if isinstance(value, str):
            if self._special_re is None:
                return value
            return self._special_re.sub(lambda m: f"\ue000{nonce}{self._specials[m.group()]}\ue001", value)
        if isinstance(value, Mapping):
            return {k: self._escape(v, nonce) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._escape(v, nonce) for v in value]
        return value

    def _unescape(self, text: str, nonce: str) -> str:
        if "\ue000" not in text:
            return text
        back = {i: s for s, i in self._specials.items()}
        return re.sub(f"\ue000{nonce}(\\d+)\ue001", lambda m: back[int(m.group(1))], text)

    def _end_of_turn_ids(self) -> set[int]:
        """The control token right after an assistant reply in the template's own rendering."""
        probe = "portachat probe reply"
        try:
            text, _ = self.render_text(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": probe}],
                add_generation_prompt=False,
            )
        except ChatFormatError:
            text = ""
        at = text.rfind(probe)
        if at >= 0 and self._special_re is not None:
            m = self._special_re.search(text, at + len(probe))
            if m:
                return {self._specials[m.group()]}
        return {self._specials[t] for t in KNOWN_END_OF_TURN if t in self._specials and t in self.chat_template}

    def _all_token_bytes(self) -> list[bytes]:
        state = json.loads(self._hf.to_str())
        decoder = json.dumps(state.get("decoder"))
        byte_level = "ByteLevel" in decoder
        byte_of = _byte_decoder()
        specials = set(self._specials.values())
        added_plain = {i: t.content for i, t in self._hf.get_added_tokens_decoder().items() if not t.special}
        out = []
        for i in range(self.vocab_size):
            token = self._hf.id_to_token(i)
            if i in specials or token is None:
                out.append(b"")
            elif i in added_plain:  # added words (e.g. "<think>") are stored as written, not byte-mapped
                out.append(added_plain[i].encode("utf-8"))
            elif byte_level:
                out.append(_token_text_bytes(token, byte_of))
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):  # SentencePiece byte fallback
                out.append(bytes([int(token[3:5], 16)]))
            else:  # SentencePiece pieces: "▁" is a space
                out.append(token.replace("\u2581", " ").encode("utf-8"))
        return out
