"""The one table of dtype names: what `--dtype`, `--kv-cache-dtype` and the estimators accept, and the
torch dtype each name means. Every other module reads names through here."""

from __future__ import annotations

import torch

from portachat.i18n import _

# Compute / weight dtypes, by the short names the command line uses.
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "32": "fp32",
    "16": "fp16",
}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}  # torch.bfloat16 -> "bf16"
DTYPE_BYTES = {name: DTYPES[name].itemsize for name in ("fp32", "bf16", "fp16")}
# KV-cache storage dtypes (the engine's --kv-cache-dtype); int8/fp8 add one fp32 scale per token and head.
FLOAT_KV = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KV_DTYPES: dict[str, torch.dtype] = {**FLOAT_KV, "int8": torch.int8, "fp8": torch.float8_e4m3fn}
KV_CACHE_DTYPES = ("auto", *KV_DTYPES)


def canonical_dtype_name(name: str) -> str | None:
    """"bfloat16" -> "bf16", ...; None for a name that is no compute dtype."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    return key if key in DTYPES else None


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bf16": the short name of a compute dtype (ValueError for any other)."""
    if dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise ValueError(f"{dtype} is not a compute dtype; use one of fp32, bf16, fp16")


def parse_dtype(name: str) -> torch.dtype:
    key = canonical_dtype_name(name)
    if key is None:
        raise ValueError(_("dtype {name} is not valid; use one of fp32, bf16, fp16").format(name=repr(name)))
    return DTYPES[key]
