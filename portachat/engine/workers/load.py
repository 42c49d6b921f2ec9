"""One rank's shard of a model: load the whole checkpoint, cut it to the rank's heads, quantize."""

from __future__ import annotations

import torch

from portachat.device import Device
from portachat.i18n import _
from portachat.model.load import InferenceModel, load_for_inference
from portachat.model.tensor_parallel import shard_model
from portachat.quant import quantize_model


def load_shard(options, device: Device, rank: int, world_size: int, group=None) -> InferenceModel:
    """`options` (LoadOptions, dtype resolved by rank 0) loaded and sharded for `rank`; quantized after
    sharding, so that each rank's scales are computed over its own rows and int4 groups stay within a shard.
    `group`: the replica's process group (None: the default group)."""
    # Whole weights stay in host memory: only the shard goes to the device (a model split because
    # one device cannot hold it must never be put on one whole).
    loaded = load_for_inference(options.model, device=torch.device("cpu"), dtype=options.dtype, lora=options.lora)
    plan = shard_model(loaded.model, rank, world_size, group)
    loaded.model.to(device.torch_device)
    loaded.device = device.torch_device
    loaded.description += "; " + _("tensor parallel {ranks} ranks (rank {rank}: q heads {q}, kv heads {kv})").format(
        ranks=world_size, rank=rank, q=f"{plan.q_heads.start}-{plan.q_heads.stop - 1}",
        kv=f"{plan.kv_heads.start}-{plan.kv_heads.stop - 1}")
    if options.quantize:
        report = quantize_model(loaded.model, options.quantize, device, compiled=False)
        loaded.description += f"; {report.summary()}"
    return loaded
