"""The step protocol between rank 0 (scheduler, sampler, API) and the tensor-parallel workers.

Rank 0 owns the scheduler; every rank owns its shard of the weights and of the KV cache. A step is
one broadcast of the step's plan (plain host integers: token ids, positions, slots, block tables),
after which every rank runs the same forward on its shard and the row-parallel products all-reduce
inside it. Messages: ("init", geometry) once, ("step", plan) per step, ("stop",) at the end.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from portachat.engine.runner import ModelRunner
from portachat.engine.step_inputs import StepPlan
from portachat.model.gpt import GPT


def _send(message: tuple, group=None, device: torch.device | None = None) -> None:
    """Broadcast from rank 0 over `group` (a replica's group; None: the default group). `device`: where
    the serialized message travels for a device backend; rank 0 of several replicas holds several devices."""
    dist.broadcast_object_list([message], src=0, group=group, device=device)


def _receive(group=None, device: torch.device | None = None) -> tuple:
    box: list = [None]
    dist.broadcast_object_list(box, src=0, group=group, device=device)
    return box[0]


class TensorParallelRunner(ModelRunner):
    """Rank 0's runner: sends each step's plan to the workers, then runs its own shard's forward.

    Steps are never padded into device graphs nor compiled (the loader turns both off): every rank
    must run exactly the step rank 0 planned, and a graph replay would skip the broadcast."""

    def __init__(self, model: GPT, num_blocks: int, block_size: int, max_model_len: int, device: torch.device,
                 dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> None:  # fmt: skip
        super().__init__(model, num_blocks, block_size, max_model_len, device, dtype, kv_dtype)
        self.stopped = False
        self.step_started: float | None = None
        self.group = getattr(model, "tensor_parallel_group", None)
        # One replica keeps torch's default (this process's current device); several pass their own.
        self.wire = device if self.group is not None else None
        self._send(("init", num_blocks, block_size, max_model_len, str(dtype).removeprefix("torch."),
                    str(self.kv_dtype).removeprefix("torch.")))  # fmt: skip

    def _send(self, message: tuple) -> None:
        _send(message, self.group, self.wire)

    def prepare(self, batch) -> StepPlan:
        return self.plan(batch)

    @torch.inference_mode()
    def forward(self, inp) -> torch.Tensor:
        if self.stopped:
            raise RuntimeError("the tensor-parallel workers have been stopped")
        self.step_started = time.monotonic()  # the group's monitor notices a step that never ends
        try:
            self._send(("step", inp))
            return self._forward(self.to_device(inp))
        finally:
            self.step_started = None

    def enable_compile(self) -> None:
        raise RuntimeError("tensor-parallel steps run eagerly (compile=False)")

    def enable_decode_graphs(self, max_num_seqs, capturer) -> None:
        raise RuntimeError("tensor-parallel steps run eagerly (enforce_eager=True)")

    def stop_workers(self) -> None:
        """Tell every worker to leave its loop (once; the engine must be idle)."""
        if not self.stopped:
            self.stopped = True
            self._send(("stop",))


def serve_steps(model: GPT, device: torch.device) -> int:
    """A worker's loop: build its runner on rank 0's geometry, run every step it is sent, return the
    number of steps run when told to stop."""
    group = getattr(model, "tensor_parallel_group", None)
    wire = device if group is not None else None
    message = _receive(group, wire)
    if message[0] == "stop":  # rank 0 gave up before its engine was built
        return 0
    _, num_blocks, block_size, max_model_len, dtype_name, kv_dtype_name = message
    dtype = getattr(torch, dtype_name)
    model.to(device=device, dtype=dtype).eval()
    # Rank 0's KV-cache dtype too (--kv-cache-dtype int8/fp8): every rank stores its heads alike.
    runner = ModelRunner(model, num_blocks, block_size, max_model_len, device, dtype, getattr(torch, kv_dtype_name))
    steps = 0
    while True:
        message = _receive(group, wire)
        if message[0] == "stop":
            return steps
        with torch.inference_mode():
            runner._forward(runner.to_device(message[1]))
        steps += 1
