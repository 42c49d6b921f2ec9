"""Packed rows' attention (several conversations back to back in a row, none attending to another):
the path the device layer chose vs SDPA with a dense block-diagonal mask.

Ours is what the model runs: `ops.attention.packed_attention_mask(positions)` once per step, then
`attention()` for each of `--layers` layers, forward and backward (compiled flex_attention with a
document block mask where `portachat doctor` says `packed_attention: flex`, the dense mask elsewhere).
The peer is written here: the block-diagonal causal mask built from the conversation lengths, and
`F.scaled_dot_product_attention` with it. Rows are filled with conversations of random lengths
(exponential, mean `--mean-conversation`), the same for both sides. Steps alternate in blocks (ours,
peer, peer, ours, ...) between device synchronizations; medians. The ratio printed is peer / ours
median step time: above 1.00x ours is faster. The largest difference between the two sides' outputs
is printed too (fp32: rounding only; bf16: about 1e-2).

    python benchmarks/packed_attention.py                                # the device's defaults
    python benchmarks/packed_attention.py --seq-len 4096 --mean-conversation 300
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from alternate import alternating_medians  # benchmarks/ is on sys.path when run as a script

from portachat.device import get_device
from portachat.ops.attention import attention, packed_attention_mask


def conversation_lengths(rows: int, seq_len: int, mean: float, seed: int) -> list[list[int]]:
    """Each row filled with conversations of exponential random lengths (at least 8 tokens), the last
    one cut at the row's end."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _row in range(rows):
        lengths: list[int] = []
        while sum(lengths) < seq_len:
            n = max(8, int(torch.empty(1).exponential_(1.0 / mean, generator=g).item()))
            lengths.append(min(n, seq_len - sum(lengths)))
        out.append(lengths)
    return out


def peer_mask(lengths: list[list[int]], device: torch.device) -> torch.Tensor:
    """Boolean [B, 1, T, T], True = attend: causal within each conversation, from the lengths."""
    seg = torch.stack([torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row)) for row in lengths])
    seg = seg.to(device)
    T = seg.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return ((seg[:, :, None] == seg[:, None, :]) & causal)[:, None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4, help="attention calls per mask built (a model's layers)")
    ap.add_argument("--mean-conversation", type=float, default=400.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = ap.parse_args()

    dev = get_device(args.device)
    dtype = dev.dtype
    lengths = conversation_lengths(args.batch_size, args.seq_len, args.mean_conversation, seed=0)
    positions = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in lengths]).to(dev.torch_device)
    g = torch.Generator().manual_seed(1)

    def tensor(heads: int) -> torch.Tensor:
        x = torch.randn(args.batch_size, heads, args.seq_len, args.head_dim, generator=g)
        return x.to(dev.torch_device, dtype).requires_grad_()

    q, k, v = tensor(args.heads), tensor(args.kv_heads), tensor(args.kv_heads)
    gqa = args.kv_heads != args.heads

    def ours() -> torch.Tensor:
        mask = packed_attention_mask(positions)
        outs = [attention(q, k, v, is_causal=False, attn_mask=mask) for _layer in range(args.layers)]
        return torch.stack(outs).sum(0)

    def peer() -> torch.Tensor:
        mask = peer_mask(lengths, dev.torch_device)
        outs = [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa) for _layer in range(args.layers)]
        return torch.stack(outs).sum(0)

    sides = {"ours": ours, "peer": peer}

    def timed(name: str) -> float:
        dev.synchronize()
        t0 = time.perf_counter()
        sides[name]().float().square().mean().backward()
        dev.synchronize()
        elapsed = time.perf_counter() - t0
        q.grad = k.grad = v.grad = None
        return elapsed

    medians = alternating_medians(timed, args.warmup, args.steps)
    with torch.no_grad():
        diff = (ours().float() - peer().float()).abs().max().item()
    ours_ms, peer_ms = (1e3 * medians[n] for n in ("ours", "peer"))
    conversations = sum(len(row) for row in lengths)
    print(f"device      : {dev.name} ({dev.kind}), {str(dtype).removeprefix('torch.')}")
    print(f"packed path : {dev.packed_attention} ({dev.packed_attention_reason})")
    print(f"shape       : batch {args.batch_size} x {args.seq_len} tokens, {conversations} conversations, "
          f"heads {args.heads}/{args.kv_heads} x {args.head_dim}, {args.layers} layers per mask")
    print(f"ours (median, fwd+bwd): {ours_ms:.3f} ms;  peer SDPA + dense mask: {peer_ms:.3f} ms")
    print(f"max |ours - peer| : {diff:.3g}")
    ratio = peer_ms / ours_ms
    print(f"ratio (peer / ours time): {ratio:.2f}x")
    if args.json:
        print(json.dumps({"ratio": ratio, "ours_ms": ours_ms, "peer_ms": peer_ms, "max_abs_diff": diff,
                          "path": dev.packed_attention, "device": dev.kind, "dtype": str(dtype), "conversations": conversations}))


if __name__ == "__main__":
    main()
