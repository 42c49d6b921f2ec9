"""The Jinja chat template saved into tokenizer_config.json.

It renders the same text that `chat.render_conversation` encodes, so `apply_chat_template` in
transformers (and servers built on it: vLLM, TGI, llama.cpp converters) gives the same ids as
portachat, tool-call parts included (adjacent text parts are joined on both sides).

One difference by design: transformers tokenizes the rendered string, so control-token text inside
a message ("<|assistant_end|>" typed by a user) becomes the control token there, as with every
Jinja-templated model. portachat's own renderer, engine and server never do that: message content
is always encoded as plain text.
"""

from __future__ import annotations

# Kept on few lines with whitespace-trimming tags: any stray newline would become a token.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set content = message['content'] -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if content is string -%}{%- set ns.system = content + '\n\n' -%}"
    "{%- else -%}{%- set ns.system = content | map(attribute='text') | join('') + '\n\n' -%}{%- endif -%}"
    "{%- elif message['role'] == 'user' -%}"
    "<|user_start|>{{- ns.system -}}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{{- content | map(attribute='text') | join('') -}}{%- endif -%}"
    "<|user_end|>"
    "{%- set ns.system = '' -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|assistant_start|>"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}"
    "{%- for part in content -%}"
    "{%- if part['type'] == 'python' -%}<|python_start|>{{- part['text'] -}}<|python_end|>"
    "{%- elif part['type'] == 'python_output' -%}<|output_start|>{{- part['text'] -}}<|output_end|>"
    "{%- else -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "<|assistant_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant_start|>{%- endif -%}"
)
