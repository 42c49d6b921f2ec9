"""Weight-only int8 / int4 quantization for inference (`--quantize int8|int4`)."""

from portachat.quant.apply import (
    QuantizationError,
    QuantReport,
    model_device,
    model_dtype,
    quantize_model,
    weight_bytes,
)
from portachat.quant.int4 import Int4Linear, dequantize_int4, quantize_int4
from portachat.quant.int8 import Int8Embedding, Int8Linear, dequantize_int8, quantize_int8

__all__ = [
    "Int4Linear",
    "Int8Embedding",
    "Int8Linear",
    "QuantReport",
    "QuantizationError",
    "dequantize_int4",
    "dequantize_int8",
    "model_device",
    "model_dtype",
    "quantize_int4",
    "quantize_int8",
    "quantize_model",
    "weight_bytes",
]
