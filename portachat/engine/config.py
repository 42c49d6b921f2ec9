"""Engine settings, named as vLLM names them where vLLM has the same knob."""

from __future__ import annotations

from dataclasses import dataclass

from portachat.engine.speculative.config import SpeculativeConfig


@dataclass
class EngineConfig:
    max_model_len: int | None = None  # prompt + output limit; None = the model's max_seq_len
    max_num_seqs: int = 32  # sequences decoded together
    max_num_batched_tokens: int = 1024  # tokens per step (prefill chunk budget)
    block_size: int | None = None  # tokens per KV block; None = the device's (device/fast_path_choice.kv_block_size)
    kv_cache_gb: float | None = None  # explicit KV-cache size in GiB (wins over the fraction)
    gpu_memory_utilization: float = 0.9  # fraction of device memory the engine may fill (vLLM's rule)
    num_blocks: int | None = None  # explicit number of KV blocks (tests, tuning); wins over both above
    max_waiting: int = 256  # bounded queue: add_request raises EngineError("queue_full") past it
    enable_prefix_caching: bool = True
    compile: bool | None = None  # torch.compile the forward; None = the device layer's policy
    enforce_eager: bool = False  # never replay decode steps from device graphs (else: the device policy)
    dtype: str | None = None  # weights + KV dtype: "fp32"/"bf16"/"fp16", "model" (keep), None = device policy
    kv_cache_dtype: str = "auto"  # KV storage: auto (fp32 on CPU, else the weights'), fp32, bf16, fp16, int8, fp8
    speculative: SpeculativeConfig | None = None  # speculative decoding (off by default)
    grammar_cache_bytes: int = 256 * 2**20  # compiled structured-output grammars kept, LRU (serve: --grammar-cache-mb)
