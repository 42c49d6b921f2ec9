"""`portachat export hf|gguf`: serving formats from our checkpoints.

What runs. The flags are in commands/export.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.export import export_gguf, export_hf
from portachat.i18n import _


def cmd_export_hf(args: argparse.Namespace) -> int:
    result = export_hf(args.model, args.output, dtype=args.dtype)
    print(
        "[portachat] " + _("exported {arch} ({dtype}, {mib} MiB of weights) to {path}").format(
            arch=result.architecture, dtype=result.dtype, mib=f"{result.weight_bytes / 2**20:.1f}", path=result.path)
        + "\n"
        f"  transformers: AutoModelForCausalLM.from_pretrained({str(result.path)!r})\n"
        f"  vLLM / vllm-ascend: vllm serve {result.path} --dtype {'bfloat16' if result.dtype == 'bf16' else 'float16'}"
    )
    return 0


def cmd_export_gguf(args: argparse.Namespace) -> int:
    result = export_gguf(args.model, args.output, type_=args.type)
    print(
        "[portachat] " + _("exported {arch} GGUF ({type}, pre-tokenizer {pre}, {mib} MiB) to {path}").format(
            arch=result.architecture, type=result.type, pre=repr(result.pre_tokenizer),
            mib=f"{result.bytes / 2**20:.1f}", path=result.path)
        + f"\n  llama.cpp: llama-server -m {result.path} --jinja   ("
        + _("--jinja: use the chat template stored in the file") + ")"
    )
    for note in result.notes:
        print("  " + _("note: {note}").format(note=note))
    return 0
