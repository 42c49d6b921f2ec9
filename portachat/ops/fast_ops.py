"""The layer math with its vendor fast paths: RMSNorm, rotary, SwiGLU and the batched top-k/top-p filter.

Each function is the portable reference (plain torch, what every device runs) unless the device layer
made a vendor kernel a candidate here and its self-test passed (ops/fast_path.py): then the kernel runs
(device/npu_kernels.py). The `check_*` functions are those self-tests: the kernel beside the reference on
the device, small shapes, forward and (for training ops) backward, within the dtype's tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from portachat.device import npu_kernels
from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.ops.fast_path import enabled

# --- references ------------------------------------------------------------------------------------


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As HF: normalise in fp32, cast back, then scale; the result keeps x's dtype (under autocast fp32
    weights would otherwise promote q and k to fp32 while v stays in the compute dtype)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * xf.to(dtype)).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def top_k_top_p_reference(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Rows of logits [R, V] with everything outside each row's top k and nucleus p set to -inf, with no
    host sync: top_k [R] (V or 0 = none; ties with the k-th value stay), top_p [R] (1.0 = none; a token
    stays while the likelier ones hold less than p of the top-k-renormalised mass; the likeliest always
    stays). The rule engine/sampler.filter_top_k_top_p applies a row at a time."""
    V = logits.size(-1)
    values, order = torch.sort(logits, dim=-1, descending=True)
    k = torch.where((top_k > 0) & (top_k < V), top_k, torch.full_like(top_k, V)).long()
    kth = values.gather(1, (k - 1)[:, None])
    values = values.masked_fill(values < kth, float("-inf"))
    probs = torch.softmax(values.float(), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the likelier tokens
    p = top_p.to(probs.dtype)[:, None]
    drop = (before >= p) & (p < 1.0)  # p = 1 keeps all (rounding puts the tail's "before" at 1.0)
    drop[:, 0] = False
    values = values.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, values)


# --- the dispatchers the model and the engine call -------------------------------------------------


def _fast(name: str, x: torch.Tensor, check_fn) -> bool:
    # torch.compile traces the reference (the vendor kernels here run eager: Ascend's default). After the
    # first call per device type this is one dict lookup.
    return not torch.compiler.is_compiling() and enabled(name, x.device, check_fn)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fast("npu_rms_norm", x, check_rms_norm):
        return npu_kernels.rms_norm(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by cos/sin [1 or B, 1, T, D] (the rotate-half convention)."""
    if x.dim() == 4 and x.size(-1) % 64 == 0 and _fast("npu_rotary_mul", x, check_rotary):
        return npu_kernels.rotary_mul(x, cos, sin)
    return rotary_reference(x, cos, sin)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.shape == up.shape and _fast("npu_swiglu", gate, check_swiglu):
        return npu_kernels.swiglu(torch.cat((gate, up), dim=-1))
    return swiglu_reference(gate, up)


def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The batched filter (see top_k_top_p_reference), by Ascend's fused kernel where it passed its check."""
    if _fast("npu_top_k_top_p", logits, check_top_k_top_p):
        V = logits.size(-1)
        return npu_kernels.top_k_top_p(logits, torch.where((top_k > 0) & (top_k < V), top_k, V), top_p)
    return top_k_top_p_reference(logits, top_k, top_p)


# --- self-tests ------------------------------------------------------------------------------------


def _inputs(dev: Device, *shape: int, seed: int = 0, grad: bool = False) -> torch.Tensor:
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dev.torch_device, dev.dtype)
    return t.requires_grad_(grad)


def _with_grads(fn, inputs: list[torch.Tensor], grad_seed: int = 7):
    """fn(*inputs) and the gradients of a fixed random projection of it, for comparing a backward too."""

    def run():
        leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        out = fn(*leaves)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.device, out.dtype)
        (out.float() * g.float()).sum().backward()
        return [out.detach(), *(t.grad for t in leaves if t.requires_grad)]

    return run


def check_rms_norm(dev: Device) -> Verdict:
    x, w = _inputs(dev, 3, 5, 128, grad=True), _inputs(dev, 128, seed=1).float().requires_grad_()
    return check("npu_rms_norm", _with_grads(lambda a, b: npu_kernels.rms_norm(a, b, 1e-6), [x, w]),
                 _with_grads(lambda a, b: rms_norm_reference(a, b, 1e-6), [x, w]), dev.dtype)


def _angles(dev: Device, batch: int, T: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    pos = torch.arange(T, dtype=torch.float32)[None].expand(batch, T) + torch.arange(batch)[:, None] * 3
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)[:, None]  # [batch, 1, T, D]
    return emb.cos().to(dev.torch_device, dev.dtype), emb.sin().to(dev.torch_device, dev.dtype)


def check_rotary(dev: Device) -> Verdict:
    """Shared tables (11SD, whole sequences) and per-row tables (B1SD, packed rows), head sizes 64 and 128."""
    outs_fast, outs_ref = [], []
    for batch_tables, D in ((1, 128), (2, 64)):
        x = _inputs(dev, 2, 3, 7, D, grad=True)
        cos, sin = _angles(dev, batch_tables, 7, D)
        outs_fast.append(_with_grads(lambda a, c=cos, s=sin: npu_kernels.rotary_mul(a, c, s), [x]))
        outs_ref.append(_with_grads(lambda a, c=cos, s=sin: rotary_reference(a, c, s), [x]))
    return check("npu_rotary_mul", lambda: [t for f in outs_fast for t in f()],
                 lambda: [t for f in outs_ref for t in f()], dev.dtype)


def check_swiglu(dev: Device) -> Verdict:
    gate, up = _inputs(dev, 4, 6, 96, grad=True), _inputs(dev, 4, 6, 96, seed=1, grad=True)
    return check("npu_swiglu", _with_grads(lambda g, u: npu_kernels.swiglu(torch.cat((g, u), -1)), [gate, up]),
                 _with_grads(swiglu_reference, [gate, up]), dev.dtype)


def check_top_k_top_p(dev: Device) -> Verdict:
    """Rows with top-k only, top-p only, both and neither; the kept set must be the same exactly."""
    V = 65536  # a vocabulary as large as the models' (k = V means no top-k)
    # 20 likely tokens 0.5 apart at shuffled places over a flat tail: every nucleus boundary is far from
    # the p values, so the kept sets are equal exactly (rounding of the cumulative sums cannot flip one).
    g = torch.Generator().manual_seed(0)
    rows = torch.full((4, V), -20.0)
    for r in range(4):
        rows[r, torch.randperm(V, generator=g)[:20]] = 10.0 - 0.5 * torch.arange(20.0)
    logits = rows.to(dev.torch_device)
    top_k = torch.tensor([5, V, 50, V], device=dev.torch_device)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0], device=dev.torch_device)

    def kept(fn):
        return lambda: torch.isfinite(fn(logits, top_k, top_p)).float()

    return check("npu_top_k_top_p", kept(npu_kernels.top_k_top_p), kept(top_k_top_p_reference), torch.float32)
