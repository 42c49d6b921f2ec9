"""Each interface's sampling fallbacks: what a field neither the request (or flag) nor the model's
generation_config sets becomes. Torch-free, so each command's `--help` shows its own."""

from __future__ import annotations

from portachat.engine.sampling_params import SamplingFallback

# `chat`: a little below 1 so a small model's replies stay on topic (nanochat's chat_cli samples at 0.6).
CHAT_FALLBACK = SamplingFallback(temperature=0.6, max_tokens=512)

# `generate`: greedy, so a batch run is reproducible unless it asks for sampling.
GENERATE_FALLBACK = SamplingFallback(temperature=0.0, max_tokens=256)

# The HTTP API: OpenAI's defaults (temperature 1). An unset max_tokens is the room the context leaves,
# as in vLLM (capped at ServerSettings.max_tokens_default where one is set: `portachat generate`'s --max-tokens).
OPENAI_FALLBACK = SamplingFallback(temperature=1.0)
