"""Data parallelism for the Trainer: DDP when the model fits, FSDP2 (ZeRO-3) when it does not.

DDP keeps a whole replica of weights, gradients and optimizer state on every device. FSDP2
(`fully_shard`) keeps 1/world of each on each device and all-gathers one block's weights at a time,
in the device's compute dtype (MixedPrecisionPolicy), reducing gradients in fp32. `--fsdp auto`
shards when the memory estimator says the replicated run will not fit in the device's memory.

Checkpoints stay one format whatever the layout: sharded weights and optimizer moments are
gathered into whole tensors for rank 0 to write, and scattered again on load, so a run saved on
N processes resumes on M.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from portachat.checkpoint.sharded import full_model, is_sharded, load_weights
from portachat.device import Device
from portachat.device.dist import share_from_rank0
from portachat.device.dtypes import DTYPE_NAMES
from portachat.i18n import _
from portachat.model import GPT, GPTConfig
from portachat.model.estimate import TrainingSetup, estimate_training

__all__ = ["choose_parallel", "decide_parallel", "full_model", "grad_sync_paused", "is_sharded", "load_weights", "no_buffer_sync",
           "shard_model", "share_from_rank0"]

FSDP_CHOICES = ("auto", "on", "off")


def replicated_peak_bytes(cfg: GPTConfig, device_batch_size: int, seq_len: int, dtype: torch.dtype, world: int) -> int:
    """The memory estimator's peak per device for a replicated (DDP) run of this model and batch."""

    setup = TrainingSetup(batch_size=device_batch_size, seq_len=seq_len, dtype=DTYPE_NAMES.get(dtype, "fp32"),
                          world_size=world, parallel="ddp")
    return estimate_training(cfg, setup)["peak_bytes"]


def choose_parallel(fsdp: str, model: GPT, device_batch_size: int, seq_len: int, dev: Device, world: int,
                    say: Callable[[str], None] = print) -> str:
    """"single" (one process), "ddp" or "fsdp2", from --fsdp auto|on|off and the device's memory."""
    auto = fsdp == "auto" and world > 1
    need = replicated_peak_bytes(model.config, device_batch_size, seq_len, dev.dtype, world) if auto else 0
    layout = decide_parallel(fsdp, world, need, dev.memory().total if need else None)
    if fsdp == "on" and world == 1:
        say("[portachat] " + _("--fsdp on with a single process: nothing to shard across, training unsharded"))
    if fsdp == "auto" and layout == "fsdp2":
        say("[portachat] " + _("a replicated model needs ~{need} GiB per device (estimate), more than the "
                               "device's {total} GiB: sharding with FSDP2 (--fsdp off to force DDP)").format(
            need=f"{need / 2**30:.1f}", total=f"{dev.memory().total / 2**30:.1f}"))
    return layout


def decide_parallel(fsdp: str, world: int, replicated_bytes: int, device_bytes: int | None) -> str:
    """The layout rule: one process trains alone; otherwise FSDP2 when asked, or (auto) when the estimated
    replicated peak exceeds the device's memory (unknown memory: replicate)."""
    if fsdp not in FSDP_CHOICES:
        raise ValueError(_("--fsdp must be one of {choices}, got {value}").format(
            choices=", ".join(FSDP_CHOICES), value=repr(fsdp)))
    if world == 1:
        return "single"
    if fsdp != "auto":
        return "fsdp2" if fsdp == "on" else "ddp"
    return "fsdp2" if device_bytes is not None and replicated_bytes > device_bytes else "ddp"


def shard_model(model: GPT, dev: Device, world: int) -> None:
    """fully_shard each transformer block, then the root (embeddings, final norm, head: tied weights
    must share one unit). Done in place, before the optimizers are built over the sharded parameters."""
    mesh = init_device_mesh(dev.torch_device.type, (world,))
    # The compute dtype for the all-gathered weights; fp32 gradients for the reduce-scatter, so averaging
    # over ranks does not round. fp32 devices keep fp32 weights.
    param_dtype = dev.dtype if dev.dtype != torch.float32 else None
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # GPT returns its per-token losses as a view ([B*T] -> [B, T]); FSDP2 warns that an in-place op on it
    # would skip a hook. Loss hooks only read it (sum, product with weights): the warning is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


@contextlib.contextmanager
def grad_sync_paused(wrapped: torch.nn.Module | None) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter for a micro-batch that is not the step's last."""
    if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        with wrapped.no_sync():
            yield
    elif isinstance(wrapped, FSDPModule):
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        yield


def no_buffer_sync() -> dict[str, bool]:
    """DDP's switch for not re-broadcasting buffers every forward: `forward_sync_buffers` from torch 2.13
    (which deprecates `broadcast_buffers`), `broadcast_buffers` before."""
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
