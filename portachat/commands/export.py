"""`portachat export hf|gguf`: serving formats from our checkpoints."""

from __future__ import annotations

from portachat.commands.common import flag, later
from portachat.i18n import N_, _, gettext

MODEL_HELP = N_("our checkpoint: a step directory, a stage directory (uses its latest) or RUN/STAGE, e.g. myrun/sft")


def register(sub) -> None:
    p = sub.add_parser("export", help=_("export a checkpoint as an HF serving directory or a GGUF file"))
    esub = p.add_subparsers(dest="action", metavar="FORMAT")
    esub.required = True
    h = esub.add_parser(
        "hf",
        help=_("a Hugging Face directory for transformers / vLLM / vllm-ascend (bf16 or fp16, no trainer state)"),
    )
    flag(h, "--model", required=True, help=gettext(MODEL_HELP))
    flag(h, "--output", required=True, help=_("directory to create (must not exist)"))
    flag(h, "--dtype", default="bf16", choices=["bf16", "fp16"], help=_("weight dtype (default bf16; fp16 for GPUs without bf16)"))
    h.set_defaults(func=later("export", "cmd_export_hf"))
    g = esub.add_parser("gguf", help=_("one GGUF file for llama.cpp (f32 / f16 / q8_0)"))
    flag(g, "--model", required=True, help=gettext(MODEL_HELP))
    flag(g, "--output", required=True, help=_("the .gguf file to create (must not exist)"))
    flag(g, "--type", default="f16", choices=["f32", "f16", "q8_0"], help=_("tensor type for matrices (default f16)"))
    g.set_defaults(func=later("export", "cmd_export_gguf"))
