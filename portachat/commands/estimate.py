"""`portachat estimate memory`: device memory for training and serving, counted from the shapes."""

from __future__ import annotations

from portachat.commands.common import EPILOG, flag, later, positive_int
from portachat.i18n import _


def register(sub) -> None:
    p = sub.add_parser("estimate", help=_("estimate device memory for training and serving"),
                       description=_("Estimates, counted from the model's shapes (no device needed)."), epilog=EPILOG)
    what = p.add_subparsers(dest="what", metavar="memory", required=True)
    m = what.add_parser(
        "memory", epilog=EPILOG,
        help=_("parameters, gradients, optimizer states, activations, logits and KV cache per device"),
        description=_("Per-device memory of a training step (parameters, gradients, Muon/AdamW states, "
                    "activations with and without --activation-checkpointing, logits, optimizer temporaries) "
                    "and of serving (weights + KV cache). For our --depth, or any Hugging Face config "
                    "(--hf-config DIR_OR_CONFIG_JSON), on --devices N with --parallel ddp|fsdp2."))
    src = m.add_mutually_exclusive_group()
    flag(src, "--depth", type=positive_int, default=4, help=_("portachat model depth (default 4)"))
    flag(src, "--hf-config", default=None, help=_("a Hugging Face model directory, its config.json, or a .gguf file"))
    flag(m, "--vocab-size", type=positive_int, default=32768, help=_("vocabulary for --depth models (default 32768)"))
    m.add_argument("--device-batch-size", "--device_batch_size", "--batch-size", dest="batch_size", type=positive_int,
                   default=4, help=_("sequences per device per micro-step (default 4)"))
    m.add_argument("--max-seq-len", "--max_seq_len", "--seq-len", dest="seq_len", type=positive_int, default=2048,
                   help=_("tokens per sequence (default 2048)"))
    flag(m, "--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help=_("compute dtype (default bf16)"))
    flag(m, "--optimizer", choices=("muon", "adamw"), default="muon",
         help=_("muon: Muon for layer matrices + AdamW for the rest, as portachat trains (default); adamw: AdamW for all"))
    flag(m, "--activation-checkpointing", action="store_true", help=_("recompute each block in backward"))
    flag(m, "--devices", type=positive_int, default=1, help=_("number of devices (default 1)"))
    flag(m, "--parallel", choices=("ddp", "fsdp2"), default="ddp", help=_("data parallelism across devices (default ddp)"))
    flag(m, "--kv-batch-size", type=positive_int, default=8, help=_("concurrent sequences when serving (default 8)"))
    flag(m, "--kv-context", type=positive_int, default=None, help=_("context per sequence when serving (default --seq-len)"))
    flag(m, "--kv-dtype", choices=("bf16", "fp16", "fp32", "int8", "fp8"), default="bf16",
         help=_("serving KV-cache dtype (default bf16); weights in the same dtype, or bf16 beside an int8/fp8 cache "
              "(which stores one fp32 scale per token and kv head)"))
    flag(m, "--serve", action="store_true",
         help=_("serving only, per device: weights, KV cache per token, and what fits beside them on the device"))
    m.add_argument("--tensor-parallel-size", "--tensor_parallel_size", "-tp", type=positive_int, default=1,
                   help=_("with --serve: devices the model is split over (default 1)"))
    flag(m, "--device-memory-gb", type=float, default=None,
         help=_("with --serve: memory per device in GiB (default: the device layer's total for --device)"))
    flag(m, "--no-device", action="store_true",
         help=_("with --serve: do not look at this machine's device (its memory, and what its engine holds "
                "beyond weights and KV cache, such as a CPU's packed weight copies)"))
    flag(m, "--max-num-batched-tokens", type=positive_int, default=1024,
         help=_("with --serve: tokens per forward step, as serve's flag of that name (default 1024); "
                "sizes the step's transient activations"))
    flag(m, "--data", action="append", default=None,
         help=_("chat data to train on (jsonl/parquet files or directories, repeat to mix): size the micro-batch "
                "by its real lengths, padded to its longest conversation, instead of --max-seq-len"))
    flag(m, "--tokenizer", default=None,
         help=_("with --data: what renders it, a model directory, a tokenizer directory or a .gguf (default: "
                "--hf-config)"))
    flag(m, "--tokens-per-batch", type=positive_int, default=None,
         help=_("micro-batches drawn by this token budget (train's flag of that name) instead of "
                "--device-batch-size rows"))
    flag(m, "--measure", action="store_true",
         help=_("also run two real training steps of the --depth model on this device and print the measured peak"))
    flag(m, "--device", default=None, help=_("device for --measure and --serve: cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto)"))
    flag(m, "--json", action="store_true", help=_("print JSON instead of a table"))
    m.set_defaults(func=later("estimate", "cmd_estimate_memory"))
