"""Inference: the engine (paged KV cache, scheduler, model runner, sampler) and the OpenAI-compatible server."""
