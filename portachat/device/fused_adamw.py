"""AdamW's fused kernel (torch's `fused=True`: the whole step, its step counter included, on the device) on
Ascend, as a self-checked fast path. torch lists the PrivateUse1 backend among the devices with fused
kernels, but whether the installed torch_npu implements them is the library's: the first time the
optimizer is built, three steps of fused AdamW on small parameters run beside the foreach one on the
device, and fused is used only if they agree (device/fast_paths.py caches the verdict)."""

from __future__ import annotations

import torch

from portachat.device.fast_paths import Verdict, check, verdict

STEPS = 3


def _steps(device: torch.device, **kind: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(shape, generator=g).to(device).requires_grad_() for shape in ((33, 17), (5,))]
    grads = [[torch.randn(p.shape, generator=g).to(device) for p in params] for _ in range(STEPS)]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, **kind)
    for step in grads:
        for p, grad in zip(params, step, strict=True):
            p.grad = grad
        opt.step()
    return [p.detach() for p in params]


def check_fused_adamw(dev) -> Verdict:
    """Three fused AdamW steps beside three foreach ones on `dev`, in fp32 (the optimizer's state dtype)."""
    return check("fused_adamw", lambda: _steps(dev.torch_device, fused=True),
                 lambda: _steps(dev.torch_device, foreach=True), torch.float32)


def fused_adamw_proven(dev) -> bool:
    return verdict(dev.name, "fused_adamw", lambda: check_fused_adamw(dev)).ok
