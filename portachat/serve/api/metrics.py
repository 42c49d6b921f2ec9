"""Prometheus metrics, named after vLLM's (`vllm:` becomes `portachat:`) so dashboards carry over.

One registry per app (tests start several apps in one process). Latencies are measured on the
engine thread when outputs leave a step, the moment a client could first see them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from portachat.engine.async_engine import RequestTiming
from portachat.engine.types import RequestOutput

# vLLM's buckets, trimmed: CPU serving is slower, so the long tail matters more than sub-ms detail.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


class ServerMetrics:
    """The metrics /metrics serves; also the AsyncEngine's observer."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("portachat:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("portachat:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self.kv_usage = Gauge("portachat:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", labels, registry=r)
        self.ttft = Histogram("portachat:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("portachat:inter_token_latency_seconds", "Time between output tokens.", labels,
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("portachat:e2e_request_latency_seconds", "Request latency from arrival to last output.",
                             labels, buckets=_E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter("portachat:prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("portachat:generation_tokens", "Tokens generated.", labels, registry=r)
        self.success = Counter("portachat:request_success", "Finished requests, by finish reason.",
                               [*labels, "finished_reason"], registry=r)
        self.http_errors = Counter("portachat:http_request_errors", "Requests answered with an error status.",
                                   [*labels, "status"], registry=r)
        self.loaded = Gauge("portachat:model_loaded", "1 while the model is loaded, else 0.", labels, registry=r)
        self.model_bytes = Gauge("portachat:model_memory_bytes", "Memory a loaded model holds (weights + KV cache).",
                                 labels, registry=r)
        self.loads = Counter("portachat:model_loads", "Times the model was loaded.", labels, registry=r)
        self.load_seconds = Histogram("portachat:model_load_seconds", "Time to load the model.", labels,
                                      buckets=(0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320), registry=r)
        self.unloads = Counter("portachat:model_unloads", "Times the model was unloaded, by reason.",
                               [*labels, "reason"], registry=r)
        # LoRA adapters share their base's engine: how many steps ran adapter rows, and how many of those
        # mixed rows of several adapters (or an adapter and the base) in one batch.
        self.lora_steps = Gauge("portachat:lora_steps", "Engine steps with LoRA adapter rows.", labels, registry=r)
        self.lora_mixed_steps = Gauge("portachat:lora_mixed_steps", "Engine steps whose batch mixed rows of "
                                      "different LoRA adapters or of an adapter and the base.", labels, registry=r)
        self.model_name = model_name  # the label of series no model owns (HTTP errors before routing)
        # Speculative decoding (vLLM's spec_decode_* counters): acceptance rate = accepted / draft
        # tokens, mean accepted length = 1 + accepted / drafts.
        self.spec_drafts = Counter("portachat:spec_decode_num_drafts", "Sequence-steps that verified a draft.",
                                   labels, registry=r)
        self.spec_draft_tokens = Counter("portachat:spec_decode_num_draft_tokens", "Draft tokens verified.",
                                         labels, registry=r)
        self.spec_accepted = Counter("portachat:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                     labels, registry=r)
        self.spec_accepted_per_pos = Counter("portachat:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by position in the draft.",
                                             [*labels, "position"], registry=r)
        self._spec_seen: dict[tuple[str, str], int] = {}  # (model, total) -> the engine's totals already counted
        self.model_name = model_name

    def observer(self, name: str) -> ModelObserver:
        """The AsyncEngine observer of one model: its series carry that model's label."""
        return ModelObserver(self, name)

    def on_loaded(self, name: str, size_bytes: int, seconds: float) -> None:
        self.loaded.labels(name).set(1)
        self.model_bytes.labels(name).set(size_bytes)
        self.loads.labels(name).inc()
        self.load_seconds.labels(name).observe(seconds)

    def on_unloaded(self, name: str, reason: str) -> None:
        self.loaded.labels(name).set(0)
        self.model_bytes.labels(name).set(0)
        self.unloads.labels(name, reason.split(" ")[0]).inc()
        for gauge in (self.running, self.waiting, self.kv_usage):
            gauge.labels(name).set(0)
        # A reloaded model's engine counts from zero again.
        self._spec_seen = {k: v for k, v in self._spec_seen.items() if k[0] != name}

    def on_output(self, request: RequestTiming, output: RequestOutput, now: float, name: str | None = None) -> None:
        name = self.model_name if name is None else name
        n = len(output.token_ids)
        if n:
            if request.first_token == now and request.last_token is None:
                self.ttft.labels(name).observe(now - request.arrival)
            elif request.last_token is not None:
                # Several tokens in one output (e.g. a forced tool result) share the gap between them.
                gap = (now - request.last_token) / n
                for _ in range(n):
                    self.itl.labels(name).observe(gap)
            self.generation_tokens.labels(name).inc(n)
        if output.finished:
            self.e2e.labels(name).observe(now - request.arrival)
            self.prompt_tokens.labels(name).inc(output.prompt_tokens)
            self.success.labels(name, output.finish_reason or "unknown").inc()

    def on_stats(self, stats: dict, name: str | None = None) -> None:
        name = self.model_name if name is None else name
        self.running.labels(name).set(stats.get("num_running", 0))
        self.waiting.labels(name).set(stats.get("num_waiting", 0))
        self.kv_usage.labels(name).set(stats.get("kv_cache_usage", 0.0))
        if stats.get("lora_steps"):
            self.lora_steps.labels(name).set(stats["lora_steps"])
            self.lora_mixed_steps.labels(name).set(stats.get("lora_mixed_steps", 0))
        totals = [("drafts", self.spec_drafts.labels(name), stats.get("spec_decode_num_drafts")),
                  ("draft_tokens", self.spec_draft_tokens.labels(name), stats.get("spec_decode_num_draft_tokens")),
                  ("accepted", self.spec_accepted.labels(name), stats.get("spec_decode_num_accepted_tokens"))]
        for pos, total in enumerate(stats.get("spec_decode_num_accepted_tokens_per_pos", [])):
            totals.append((f"accepted_{pos}", self.spec_accepted_per_pos.labels(name, str(pos)), total))
        for key, counter, total in totals:  # the engine reports running totals; counters take the growth
            seen = self._spec_seen.get((name, key), 0)
            if total is not None and total > seen:
                counter.inc(total - seen)
                self._spec_seen[(name, key)] = total

    def on_http_error(self, status: int, name: str | None = None) -> None:
        self.http_errors.labels(self.model_name if name is None else name, str(status)).inc()


class ModelObserver:
    """ServerMetrics seen by one model's AsyncEngine."""

    def __init__(self, metrics: ServerMetrics, name: str) -> None:
        self.metrics = metrics
        self.name = name

    def on_output(self, request: RequestTiming, output: RequestOutput, now: float) -> None:
        # a LoRA adapter's requests run on its base's engine, yet are counted under the adapter's name
        self.metrics.on_output(request, output, now, request.adapter or self.name)

    def on_stats(self, stats: dict) -> None:
        self.metrics.on_stats(stats, self.name)
