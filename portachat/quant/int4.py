"""int4 weight-only quantization, asymmetric in groups along the input dimension (tinygemm's layout).

Each group of `group_size` input weights of one output row gets a scale and an offset:
w ~= (code - 8) * scale + zero, code in 0..15 (the convention of ATen's int4 kernels, where `zero`
is the value of the middle code 8).
"""

from __future__ import annotations

import torch
from torch import nn

# torch._convert_weight_to_int4pack_for_cpu packs rows in tiles of 16.
INT4_N_MULTIPLE = 16


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes int32 [N, K] in 0..15, scale [N, K/g], zero [N, K/g]) both bf16, w ~= (codes-8)*scale+zero."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the int4 group size {group_size}")
    w = weight.detach().float().view(n, k // group_size, group_size)
    lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12).to(torch.bfloat16).float()
    # Round the stored scale/zero first, then pick codes against the rounded values (as int8.py does).
    zero = (lo + 8 * scale).to(torch.bfloat16).float()
    codes = torch.round((w - zero) / scale + 8).clamp(0, 15).to(torch.int32)
    return codes.view(n, k), scale.squeeze(-1).to(torch.bfloat16), zero.squeeze(-1).to(torch.bfloat16)


def dequantize_int4(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> torch.Tensor:
    n, k = codes.shape
    grouped = codes.view(n, k // group_size, group_size).float() - 8
    return (grouped * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)).view(n, k)


class Int4Linear(nn.Module):
    """Drop-in for a bias-free nn.Linear through ATen's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`).

    Attributes: in_features, out_features, group_size, packed (uint8 [out, in/2], kernel layout),
    scales_and_zeros ([in/group, out, 2]), bias (or None), activation_dtype. No `.weight`.
    """

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        group_size: int,
        activation_dtype: torch.dtype,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.group_size = group_size
        self.activation_dtype = activation_dtype
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer(
            "scales_and_zeros",
            torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(activation_dtype),
        )
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group_size: int, activation_dtype: torch.dtype = torch.bfloat16
    ) -> Int4Linear:
        codes, scale, zero = quantize_int4(linear.weight, group_size)
        return cls(codes, scale, zero, group_size, activation_dtype, linear.bias)

    @classmethod
    def from_kernel_layout(cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                           activation_dtype: torch.dtype, in_features: int) -> Int4Linear:  # fmt: skip
        """A bias-free module over weights already in the kernel's layout (fused q/k/v, gate/up)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.out_features, module.in_features = packed.size(0), in_features
        module.group_size, module.activation_dtype = group_size, activation_dtype
        module.register_buffer("packed", packed)
        module.register_buffer("scales_and_zeros", scales_and_zeros.to(activation_dtype))
        module.register_buffer("bias", None)
        return module

    def group_scale_and_code0(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (scale, value of code 0), each [in/group, out]: w = code * scale + code0 (the form
        the device's own CPU kernel reads beside `packed`)."""
        sz = self.scales_and_zeros.float()  # [in/group, out, (scale, value of code 8)]
        return sz[..., 0], sz[..., 1] - 8 * sz[..., 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.activation_dtype)
        sz = self.scales_and_zeros
        sz = sz if sz.dtype == self.activation_dtype else sz.to(self.activation_dtype)
        y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, sz).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4 group_size={self.group_size}"
        )
