"""What inference needs from a tokenizer, whatever model family it belongs to.

Our own tokenizer (nanochat chat format) and the tokenizers of existing models (Llama, Qwen,
SmolLM2: a `tokenizer.json` plus a Jinja chat template, or the same read from a GGUF file) both
implement this, so the engine, the server, `chat`, `generate`, RL and evaluations never ask
which one they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolTokens:
    """Token ids of the calculator tool-call format (ours): the model writes
    python_start EXPR python_end, the engine appends output_start RESULT output_end."""

    python_start: int
    python_end: int
    output_start: int
    output_end: int


@runtime_checkable
class ChatTokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def stop_ids(self) -> set[int]:
        """Ids that end the assistant's reply (eos, <|assistant_end|>, <|im_end|>, ...)."""
        ...

    @property
    def tool_tokens(self) -> ToolTokens | None:
        """The calculator tool's tokens, or None when the chat format has no tool."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template prompts render with (what tool-call and reasoning formats are read
        from), or None for a format without one (portachat's own)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Plain text to ids. Never turns text into control tokens: "<|im_end|>" typed by a
        user stays ordinary text."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw UTF-8 bytes one token stands for (b"" for control tokens), so a stream can hold
        back the bytes of a character split across tokens."""
        ...

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                      template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """A conversation as ids that end where the assistant's next reply begins; `tools` (OpenAI
        function definitions) go to chat templates that take them, `template_kwargs` (such as
        `enable_thinking`, `reasoning_effort`) are extra variables a Jinja template may read."""
        ...
